"""What the generate stage reports about its result: the headline (the metrics file) and the details (the report).

Invariants: both are computed from the prompts and the journal's entries alone, resumed rows included, so two runs
of the same inputs report the same bytes whatever was resumed; what varies between runs (speeds, resume counts,
the journal's folder) is :meth:`draftline.generate.progress.Progress.figures` and goes to the run file.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from draftline.core.records import CompletionRecord, PromptRecord
from draftline.generate.journal import FAILED
from draftline.generate.shards import is_truncated


def token_stats(values: list[int]) -> dict[str, float]:
    if not values:
        return {"total": 0, "mean": 0.0, "median": 0.0, "p90": 0.0}
    v = sorted(values)
    n = len(v)
    median = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    return {"total": sum(v), "mean": round(sum(v) / n, 2), "median": float(median),
            "p90": float(v[min(n - 1, int(0.9 * n))])}


def _block(records: list[CompletionRecord], failures: Counter, truncated: int) -> dict[str, Any]:
    return {
        "completions": len(records),
        "failures": dict(sorted(failures.items())),
        "failed": sum(failures.values()),
        "truncated": truncated,
        "prompt_tokens": token_stats([r.usage.get("prompt_tokens", 0) for r in records]),
        "output_tokens": token_stats([r.usage.get("completion_tokens", 0) for r in records]),
    }


def summarize(prompts: list[PromptRecord], entries: dict[str, dict[str, Any]],
              records: list[CompletionRecord]) -> dict[str, Any]:
    """The report: totals over the whole result (resumed rows included), then the same per source."""
    by_source: dict[str, list[CompletionRecord]] = defaultdict(list)
    for r in records:
        by_source[r.source].append(r)
    failures: dict[str, Counter] = defaultdict(Counter)
    truncated: Counter = Counter()
    for p in prompts:
        e = entries.get(p.id)
        if e is None:
            continue
        if e["status"] == FAILED:
            failures[p.source][e["reason"]] += 1
        elif is_truncated(e):
            truncated[p.source] += 1
    sources = sorted({p.source for p in prompts})
    out = _block(records, sum(failures.values(), Counter()), sum(truncated.values()))
    out["prompts"] = len(prompts)
    out["per_source"] = {s: _block(by_source[s], failures[s], truncated[s]) for s in sources}
    return out


def headline(details: dict[str, Any]) -> dict[str, Any]:
    """The few figures compared between experiments: completions written, failed, truncated, their output tokens."""
    return {"rows": details["completions"], "failed": details["failed"], "truncated": details["truncated"],
            "tokens": details["output_tokens"]["total"]}
