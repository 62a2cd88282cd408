"""What the generate stage reports about its result: the headline (the metrics file) and the details (the report).

Invariants: both are computed from the prompts and the journal's entries alone, resumed rows included, so two runs
of the same inputs report the same bytes whatever was resumed; what varies between runs (speeds, resume counts,
the journal's folder) is :meth:`draftline.generate.progress.Progress.figures` and goes to the run file.
The tool-call figures count the rows written whose prompt offered tools (:func:`tool_call_counts`).
:func:`check_truncated` stops a result most of whose replies ran into ``generate.max_tokens``, before it is written.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from draftline.core.errors import Refusal
from draftline.core.logs import get_logger
from draftline.core.records import CompletionRecord, PromptRecord
from draftline.core.tool_calls import has_valid_tool_call
from draftline.generate.journal import FAILED, OK
from draftline.generate.shards import is_truncated

log = get_logger(__name__)

# A source whose share of tool rows ending in a valid call falls below this is named in a warning. A healthy
# embedded target makes about 80% (263 of 329 at seed 7, issue 58) and the regression of issue 58 34-42%: below
# half, most of the source's tool rows teach the drafter replies that call nothing.
MIN_VALID_TOOL_CALLS = 0.5


def token_stats(values: list[int]) -> dict[str, float]:
    if not values:
        return {"total": 0, "mean": 0.0, "median": 0.0, "p90": 0.0}
    v = sorted(values)
    n = len(v)
    median = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    return {"total": sum(v), "mean": round(sum(v) / n, 2), "median": float(median),
            "p90": float(v[min(n - 1, int(0.9 * n))])}


def tool_call_counts(records: list[CompletionRecord]) -> dict[str, int]:
    """The rows whose prompt offered tools, and those of them whose final reply holds a valid call (an offered tool's
    name, arguments a JSON object); a reply without a call counts as invalid."""
    tool_rows = [r for r in records if r.tools]
    valid = sum(1 for r in tool_rows if has_valid_tool_call(r.messages[-1], r.tools))  # the last message: the reply
    return {"tool_rows": len(tool_rows), "valid_tool_calls": valid}


def _block(records: list[CompletionRecord], failures: Counter, truncated: int) -> dict[str, Any]:
    return {
        "completions": len(records),
        "failures": dict(sorted(failures.items())),
        "failed": sum(failures.values()),
        "truncated": truncated,
        "prompt_tokens": token_stats([r.usage.get("prompt_tokens", 0) for r in records]),
        "output_tokens": token_stats([r.usage.get("completion_tokens", 0) for r in records]),
        **tool_call_counts(records),
    }


def speculative(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What a drafter did for these results (None when none was used): z-lab's acceptance (the mean over prompts of
    tokens per verification step), the pooled tau, and the target forward passes saved (each turn's prefill + its
    steps, against one forward per generated token)."""
    spec = [e["speculative"] for e in entries if e.get("speculative") and e["speculative"]["steps"]]
    if not spec:
        return None
    steps, tokens, turns = (sum(x[k] for x in spec) for k in ("steps", "tokens", "turns"))
    return {"prompts": len(spec), "acceptance": round(sum(x["tokens"] / x["steps"] for x in spec) / len(spec), 4),
            "tau": round(tokens / steps, 4), "forwards_saved": round(1 - (turns + steps) / (turns + tokens), 4)}


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
    done = [(p.source, entries[p.id]) for p in prompts if p.id in entries and entries[p.id]["status"] != FAILED]
    if (drafted := speculative([e for _, e in done])) is not None:
        out["speculative"] = drafted
        for s in sources:
            out["per_source"][s]["speculative"] = speculative([e for src, e in done if src == s])
    return out


class TooManyTruncated(Refusal):
    """More of the replies cut at ``generate.max_tokens`` than ``generate.max_truncated_share`` allows."""


def check_truncated(prompts: list[PromptRecord], entries: dict[str, dict[str, Any]], max_share: float,
                    max_tokens: int) -> None:
    """Raise :class:`TooManyTruncated` when more than ``max_share`` of the replies (prompts with a result) were cut
    at ``max_tokens``: a cap at odds with the target (212 of 300 SmolLM2 replies at 64 tokens), not a few long
    replies, and a run that "succeeds" would silently drop most of its rows (or keep them cut). As tokenize's
    ``max_skip_share``; the journal keeps the replies, so a rerun with a raised param regenerates none of them."""
    done = [entries[p.id] for p in prompts if entries.get(p.id, {}).get("status") == OK]
    cut = sum(1 for e in done if is_truncated(e))
    if done and cut > max_share * len(done):
        raise TooManyTruncated(
            f"{cut} of {len(done)} replies ({100 * cut / len(done):.1f}%) were cut at generate.max_tokens "
            f"({max_tokens}), more than generate.max_truncated_share ({max_share:g}) allows: raise "
            "generate.max_tokens, or raise generate.max_truncated_share to accept them "
            "(the journal keeps the replies: they are not generated again)")


def headline(details: dict[str, Any]) -> dict[str, Any]:
    """The few figures compared between experiments: completions written, failed, truncated, their output tokens,
    per source with tool rows the share of them ending in a valid call (and with a drafter, its acceptance)."""
    out = {"rows": details["completions"], "failed": details["failed"], "truncated": details["truncated"],
           "tokens": details["output_tokens"]["total"]}
    if valid := {s: round(b["valid_tool_calls"] / b["tool_rows"], 4)
                 for s, b in details["per_source"].items() if b["tool_rows"]}:
        out["tool_calls_valid"] = valid
    if "speculative" in details:  # with a drafter: how much it sped generation up
        out["acceptance"] = details["speculative"]["acceptance"]
    return out


def warn_few_valid_tool_calls(headline: dict[str, Any]) -> None:
    """Name each source whose share of tool rows ending in a valid call is below :data:`MIN_VALID_TOOL_CALLS`."""
    for source, share in headline.get("tool_calls_valid", {}).items():
        if share < MIN_VALID_TOOL_CALLS:
            log.warning("generate: only %.0f%% of %s's tool rows end in a valid tool call (below %.0f%%): its "
                        "training rows mostly call nothing", 100 * share, source, 100 * MIN_VALID_TOOL_CALLS)
