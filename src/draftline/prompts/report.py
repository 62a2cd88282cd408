"""What the prompt stage did, per source and by content: DVC metrics, plot data, and the same tables printed at
the end.

The point is that a skew (77% code) or a source that yielded nothing is seen before generation starts: the train
rows by domain x source, their languages, and the merged set's mix (``merge.base``'s recorded mix + the new rows),
requested (``blend.target_mix``) vs achieved.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from draftline.core.classify import DOMAINS
from draftline.core.mix import Mix, shares
from draftline.core.splits import SPLITS


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
    eval_rows: Counter[str] = field(default_factory=Counter)  # held-out prompts per split (core/splits.py)
    in_base: int = 0  # train-pool prompts left out because merge.base already holds them
    requested: int = 0
    train_rows: int = 0
    train_tokens: int = 0
    domains: Counter[str] = field(default_factory=Counter)
    languages: Counter[str] = field(default_factory=Counter)


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
            "eval_rows": {split: r.eval_rows[split] for split in SPLITS},
            "in_base": r.in_base,
            f"requested_{unit}": r.requested,
            "achieved_rows": r.train_rows,
            "achieved_tokens": r.train_tokens,
            "share_rows": round(r.train_rows / rows, 4) if rows else 0.0,
            "share_tokens": round(r.train_tokens / tokens, 4) if tokens else 0.0,
            "domains": {d: r.domains.get(d, 0) for d in DOMAINS},
            "languages": dict(sorted(r.languages.items())),
        }
    return {
        "unit": unit,
        f"requested_{unit}": total,
        "train_rows": rows,
        "train_tokens": tokens,
        "eval_rows": {split: sum(r.eval_rows[split] for r in reports.values()) for split in SPLITS},
        "in_base": sum(r.in_base for r in reports.values()),
        "sources": sources,
    }


def mix_details(base: Mix, new: Mix, unit: str, requested: dict[str, float] | None,
                aimed: dict[str, int] | None) -> dict[str, Any]:
    """The report's ``mix``: per domain the base's, the new rows' and the merged set's amounts (in ``unit``) and
    shares, the request and what was aimed at, and languages (rows) of new, base and merged."""
    b, n = base.amounts(unit), new.amounts(unit)
    merged = {d: b[d] + n[d] for d in DOMAINS}
    langs = base.languages + new.languages
    return {
        "unit": unit,
        "base_amounts": b,
        "new_amounts": n,
        "merged_amounts": merged,
        "base_shares": shares(b),
        "new_shares": shares(n),
        "merged_shares": shares(merged),
        "requested_shares": requested,
        "aimed_new_amounts": aimed,
        "new_languages": dict(sorted(new.languages.items())),
        "base_languages": dict(sorted(base.languages.items())),
        "merged_language_shares": shares(dict(sorted(langs.items()))),
    }


def headline_mix(mix: dict[str, Any]) -> dict[str, Any]:
    """The headline: ``mix``, the merged set's share of each domain (in blend.unit). One key (``dvc metrics show``
    flattens it to ``mix.code``...): the metrics table keeps a few columns; languages are in the report."""
    return {"mix": {d: mix["merged_shares"][d] for d in DOMAINS}}


def plot_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """``plots/prompts_mix.csv``: the train rows by source x domain, one row each (a stacked bar per source)."""
    return [
        {"source": name, "series": d, "rows": m["domains"][d]}
        for name, m in metrics["sources"].items() for d in DOMAINS
    ]


def share_rows(mix: dict[str, Any]) -> list[dict[str, Any]]:
    """``plots/prompts_shares.csv``: per domain its share of the base, the new rows, the merged set, and the
    request (when ``blend.target_mix`` is set): grouped bars, requested vs achieved."""
    kinds = [("base", "base_shares"), ("new", "new_shares"), ("merged", "merged_shares")]
    if mix["requested_shares"] is not None:
        kinds.append(("requested", "requested_shares"))
    return [{"domain": d, "series": kind, "share": mix[key][d]} for d in DOMAINS for kind, key in kinds]


def language_rows(mix: dict[str, Any]) -> list[dict[str, Any]]:
    """``plots/prompts_languages.csv``: the merged set's rows per language (most first), with their share."""
    counts: Counter[str] = Counter(mix["new_languages"]) + Counter(mix["base_languages"])
    total = sum(counts.values())
    return [{"language": g, "rows": n, "share": round(n / total, 4)}
            for g, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def format_mix(metrics: dict[str, Any]) -> str:
    """The content tables printed after the per-source one: train rows by domain x source, then the merged set's
    shares (base, new, merged, requested) and its top languages."""
    mix = metrics["mix"]
    head = ["source", *DOMAINS, "langs"]
    body = [[name, *(m["domains"][d] for d in DOMAINS),
             ", ".join(f"{g} {n}" for g, n in sorted(m["languages"].items(), key=lambda kv: (-kv[1], kv[0]))[:3])]
            for name, m in metrics["sources"].items()]
    body.append(["total (rows)", *(sum(m["domains"][d] for m in metrics["sources"].values()) for d in DOMAINS), ""])
    unit = mix["unit"]
    pct = lambda x: f"{x:.1%}"  # noqa: E731
    if any(mix["base_amounts"].values()):
        body.append([f"base ({unit})", *(mix["base_amounts"][d] for d in DOMAINS), ""])
    for kind in ("base", "new", "merged", "requested"):
        values = mix[f"{kind}_shares"]
        if values is not None and (kind != "base" or any(mix["base_amounts"].values())):
            body.append([f"{kind} share", *(pct(values[d]) for d in DOMAINS), ""])
    cells = [[str(c) for c in r] for r in [head, *body]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i in (0, len(r) - 1) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    langs = sorted(mix["merged_language_shares"].items(), key=lambda kv: (-kv[1], kv[0]))
    rule = "-" * len(line(cells[0]))
    return "\n".join([line(cells[0]), rule, *map(line, cells[1:]), rule,
                      "merged languages: " + ", ".join(f"{g} {pct(x)}" for g, x in langs[:8])])


def format_table(metrics: dict[str, Any]) -> str:
    """The per-source table the stage prints at its end."""
    unit = metrics["unit"]
    head = ["source", "read", "skipped", "exact", "near", "avail", "dev", "test", f"req {unit}", "rows", "tokens",
            "share"]
    share = "share_rows" if unit == "samples" else "share_tokens"
    body = [
        [name, m["rows_read"], m["skipped_total"], m["exact_duplicates"], m["near_duplicates"], m["available"],
         *m["eval_rows"].values(), m[f"requested_{unit}"], m["achieved_rows"], m["achieved_tokens"], f"{m[share]:.1%}"]
        for name, m in metrics["sources"].items()
    ]
    total = ["total", *(sum(r[i] for r in body) for i in range(1, len(head) - 1)), "100.0%" if body else "-"]
    cells = [[str(c) for c in r] for r in [head, *body, total]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    rule = "-" * len(line(cells[0]))
    return "\n".join([line(cells[0]), rule, *map(line, cells[1:-1]), rule, line(cells[-1])])
