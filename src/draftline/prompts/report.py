"""What the prompt stage did, per source: DVC metrics, plot data, and the same table printed at the end.

The point is that a skew (77% code) or a source that yielded nothing is seen before generation starts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SourceReport:
    """Counts for one source, filled in as the stage goes."""

    rows_read: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    media_parts_dropped: int = 0
    prompts: int = 0
    exact_duplicates: int = 0
    near_duplicates: int = 0
    available: int = 0
    eval_rows: int = 0
    requested: int = 0
    train_rows: int = 0
    train_tokens: int = 0


def build_metrics(reports: dict[str, SourceReport], unit: str, total: int) -> dict[str, Any]:
    """``metrics/prompts.json``: totals, then one entry per source; shares are of the train blend."""
    rows = sum(r.train_rows for r in reports.values())
    tokens = sum(r.train_tokens for r in reports.values())
    sources = {}
    for name, r in reports.items():
        sources[name] = {
            "rows_read": r.rows_read,
            "skipped": dict(sorted(r.skipped.items())),
            "skipped_total": sum(r.skipped.values()),
            "media_parts_dropped": r.media_parts_dropped,
            "prompts": r.prompts,
            "exact_duplicates": r.exact_duplicates,
            "near_duplicates": r.near_duplicates,
            "available": r.available,
            "eval_rows": r.eval_rows,
            f"requested_{unit}": r.requested,
            "achieved_rows": r.train_rows,
            "achieved_tokens": r.train_tokens,
            "share_rows": round(r.train_rows / rows, 4) if rows else 0.0,
            "share_tokens": round(r.train_tokens / tokens, 4) if tokens else 0.0,
        }
    return {
        "unit": unit,
        f"requested_{unit}": total,
        "train_rows": rows,
        "train_tokens": tokens,
        "eval_rows": sum(r.eval_rows for r in reports.values()),
        "sources": sources,
    }


PLOT_COLUMNS = [
    "source", "rows_read", "skipped_total", "exact_duplicates", "near_duplicates", "available",
    "eval_rows", "requested", "achieved_rows", "achieved_tokens", "share_rows", "share_tokens",
]


def plot_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """``plots/prompts_mix.csv``: one row per source (``dvc plots show`` draws the mix as bars)."""
    unit = metrics["unit"]
    return [
        {"source": name, **{c: m[f"requested_{unit}"] if c == "requested" else m[c] for c in PLOT_COLUMNS[1:]}}
        for name, m in metrics["sources"].items()
    ]


def format_table(metrics: dict[str, Any]) -> str:
    """The per-source table the stage prints at its end."""
    unit = metrics["unit"]
    head = ["source", "read", "skipped", "exact", "near", "avail", "eval", f"req {unit}", "rows", "tokens", "share"]
    share = "share_rows" if unit == "samples" else "share_tokens"
    body = [
        [name, m["rows_read"], m["skipped_total"], m["exact_duplicates"], m["near_duplicates"], m["available"],
         m["eval_rows"], m[f"requested_{unit}"], m["achieved_rows"], m["achieved_tokens"], f"{m[share]:.1%}"]
        for name, m in metrics["sources"].items()
    ]
    total = ["total", *(sum(r[i] for r in body) for i in range(1, 10)), "100.0%" if body else "-"]
    cells = [[str(c) for c in r] for r in [head, *body, total]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    rule = "-" * len(line(cells[0]))
    return "\n".join([line(cells[0]), rule, *map(line, cells[1:-1]), rule, line(cells[-1])])
