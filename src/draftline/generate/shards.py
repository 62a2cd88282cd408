"""Writing ``data/completions/`` from the journal: shards in prompt order, and the failures.

Results reach the journal in completion order; the shards are written from it afterwards in PROMPT order,
each under a temporary name then renamed, so an interrupted and an uninterrupted run give the same bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftline.core.files import write_jsonl
from draftline.core.records import CompletionRecord, PromptRecord
from draftline.generate.journal import FAILED, OK
from draftline.generate.turns import split_turns

SHARD_PATTERN = "part-{:05d}.jsonl"
FAILURES_FILE = "failures.jsonl"


def is_truncated(entry: dict[str, Any]) -> bool:
    return entry.get("status") == OK and entry.get("finish_reason") == "length"


def completion_record(prompt: PromptRecord, entry: dict[str, Any], generation: dict[str, Any]) -> CompletionRecord:
    """The prompt with the target's replies in place: every user turn followed by its reply."""
    head, turns = split_turns(prompt.messages)
    messages = list(head)
    for turn, reply in zip(turns, entry["replies"]):
        messages += turn
        messages.append(reply)
    return CompletionRecord(
        id=prompt.id, source=prompt.source, row=prompt.row, messages=messages, tools=prompt.tools,
        reference=prompt.reference, finish_reason=entry["finish_reason"], usage=entry["usage"],
        generation=generation,
    )


def write_outputs(out_dir: str | Path, prompts: list[PromptRecord], entries: dict[str, dict[str, Any]],
                  generation: dict[str, Any], shard_size: int, keep_truncated: bool) -> tuple[list[CompletionRecord], int]:
    """Write the shards and ``failures.jsonl``; return the records written and the number of failures.

    Shards that a previous, larger run left behind are removed, so the folder holds this result only.
    """
    if shard_size < 1:
        raise ValueError(f"generate.shard_size must be >= 1, got {shard_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records, failures = [], []
    for p in prompts:
        e = entries.get(p.id)
        if e is None:
            continue
        if e["status"] == OK and (keep_truncated or not is_truncated(e)):
            records.append(completion_record(p, e, generation))
        elif e["status"] == FAILED:
            failures.append({"id": p.id, "source": p.source, "row": p.row, "reason": e["reason"],
                             "detail": e.get("detail", ""), "turns_done": len(e.get("replies", []))})
    n_shards = 0
    for n_shards, start in enumerate(range(0, len(records), shard_size), start=1):
        write_jsonl(out / SHARD_PATTERN.format(n_shards - 1), records[start : start + shard_size])
    for stale in out.glob("part-*.jsonl"):
        if stale.name >= SHARD_PATTERN.format(n_shards):
            stale.unlink()
    write_jsonl(out / FAILURES_FILE, failures)
    return records, len(failures)
