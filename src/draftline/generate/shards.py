"""Writing the completions folder from the journal: shards in prompt order, and the failures.

Results reach the journal in completion order; the folder is written from it afterwards in PROMPT order, under a
temporary name then renamed whole, so an interrupted and an uninterrupted run give the same bytes and a run stopped
part-way (a full disk) leaves no folder that looks finished.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftline.core.files import atomic_path, write_jsonl
from draftline.core.records import CompletionRecord, PromptRecord
from draftline.generate.journal import FAILED, OK
from draftline.generate.params import GenerateParams
from draftline.generate.turns import split_turns

SHARD_PATTERN = "part-{:05d}.jsonl"
FAILURES_FILE = "failures.jsonl"


def is_truncated(entry: dict[str, Any]) -> bool:
    return entry.get("status") == OK and entry.get("finish_reason") == "length"


def completion_record(prompt: PromptRecord, entry: dict[str, Any], generation: dict[str, Any]) -> CompletionRecord:
    """The prompt with the target's replies in place: every user turn followed by its reply; ``generation`` with
    the engine its journal entry names (null for an entry journaled before engines were recorded)."""
    head, turns = split_turns(prompt.messages)
    messages = list(head)
    for turn, reply in zip(turns, entry["replies"]):
        messages += turn
        messages.append(reply)
    return CompletionRecord(
        id=prompt.id, source=prompt.source, row=prompt.row, messages=messages, tools=prompt.tools,
        reference=prompt.reference, finish_reason=entry["finish_reason"], usage=entry["usage"],
        generation={**generation, "engine": entry.get("engine")},
    )


def write_outputs(out_dir: str | Path, prompts: list[PromptRecord], entries: dict[str, dict[str, Any]],
                  generation: dict[str, Any], s: GenerateParams) -> tuple[list[CompletionRecord], int]:
    """Write the shards (``s.shard_size`` rows each, truncated replies only with ``s.keep_truncated``) and
    ``failures.jsonl``; return the records written and the number of failures.

    The folder replaces whatever ``out_dir`` held, so it holds this result only.
    """
    shard_size, keep_truncated = s.shard_size, s.keep_truncated
    if shard_size < 1:
        raise ValueError(f"generate.shard_size must be >= 1, got {shard_size}")
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
    with atomic_path(out_dir, "the completions") as out:
        out.mkdir(parents=True)
        for n, start in enumerate(range(0, len(records), shard_size)):
            write_jsonl(out / SHARD_PATTERN.format(n), records[start : start + shard_size])
        write_jsonl(out / FAILURES_FILE, failures)
    return records, len(failures)
