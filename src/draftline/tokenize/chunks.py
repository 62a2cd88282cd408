"""Completion lines -> training rows, in chunks, on ``workers`` processes, in input order.

The main process reads the completions' ``part-*.jsonl`` in file and line order and cuts the lines into chunks of
fixed size; each worker parses a chunk, turns every completion into one row (``turns: last``) or one row per
assistant turn (``turns: all``), and renders, tokenizes and masks them (:mod:`draftline.tokenize.loss_mask`).
Chunks are taken back in order, so the output is the same, byte for byte, whatever the number of workers.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftline.core.provenance import of_generation
from draftline.core.records import CompletionRecord, TargetInfo
from draftline.core.records import parse_completion as parse_record
from draftline.tokenize.loss_mask import ChunkResult, Example, MaskBuilder
from draftline.tokenize.params import TokenizeParams


def examples_from_record(rec: CompletionRecord, turns: str) -> Iterator[Example]:
    """The rows one completion trains: its last assistant turn, or (``all``) every assistant turn with the
    history the template shows before it (so earlier turns' reasoning is dropped exactly as Qwen3 drops it)."""
    thinking = rec.generation.get("enable_thinking")
    thinking = thinking if isinstance(thinking, bool) else None
    made = of_generation(rec.generation) if rec.generation else None
    if turns == "last":
        yield Example(rec.id, rec.source, rec.prompt_messages, rec.messages, rec.tools, thinking, made)
        return
    k = 0
    for i, m in enumerate(rec.messages):
        if m.get("role") == "assistant" and i > 0:
            yield Example(f"{rec.id}/turn{k}", rec.source, rec.messages[:i], rec.messages[: i + 1], rec.tools,
                          thinking, made)
            k += 1


# A skipped line or row: (reason, where, detail).
Skip = tuple[str, str, str]


def parse_completion(line: str, where: str, turns: str) -> tuple[list[Example], Skip | None]:
    """The examples of one ``CompletionRecord`` line, or the reason it has none."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        return [], ("invalid_json", where, f"invalid JSON: {e.msg} at column {e.colno}")
    try:
        rec = parse_record(obj)
    except ValueError as e:
        return [], ("invalid_record", where, str(e))
    if rec.messages[-1]["role"] != "assistant" or not rec.prompt_messages:
        return [], ("no_assistant_reply", where, f"id {rec.id}: the last message is not the target's reply")
    if rec.finish_reason == "length":
        # Cut at max_tokens: the reply never ended, and a Qwen3 reply cut inside <think> is all reasoning.
        return [], ("finish_length", where, f"id {rec.id}")
    return list(examples_from_record(rec, turns)), None


def read_lines(paths: list[Path]) -> Iterator[tuple[str, str]]:
    """``(where, line)`` for every non-blank line, in file and line order. The workers parse them: JSON parsing
    in the one reading process would cap how many workers can be kept busy."""
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    yield f"{path.name}:{lineno}", line


def chunked(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class ChunkWorker:
    """Completion lines -> rows: parse, render, tokenize, mask. One per process."""

    def __init__(self, builder: MaskBuilder, turns: str):
        self.builder = builder
        self.turns = turns

    def __call__(self, lines: list[tuple[str, str]]) -> ChunkResult:
        examples: list[Example] = []
        skips: list[Skip] = []
        for where, line in lines:
            found, skip = parse_completion(line, where, self.turns)
            examples.extend(found)
            if skip:
                skips.append(skip)
        result = self.builder(examples)
        result.skips[:0] = skips
        return result


# The process's ChunkWorker: set before the pool forks (or by the initializer of a spawned worker).
_WORKER: ChunkWorker | None = None


def _init_worker(info: TargetInfo, params: TokenizeParams, tokenizer: Any = None) -> None:
    global _WORKER
    # Each worker is one core: the tokenizer's own thread pool would make workers fight over the same cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if tokenizer is None:
        # The parent has already checked this folder against the target's fingerprint (load_tokenizer).
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(info.path, local_files_only=True)
    builder = MaskBuilder(tokenizer, info.end_of_turn_token_id, params.max_len, params.overflow)
    _WORKER = ChunkWorker(builder, params.turns)


def _work(lines: list[tuple[str, str]]) -> ChunkResult:
    assert _WORKER is not None, "worker not initialised"
    return _WORKER(lines)


def _pool(info: TargetInfo, params: TokenizeParams, tokenizer: Any):
    import multiprocessing as mp

    if "fork" in mp.get_all_start_methods():
        # fork: workers inherit the loaded, checked tokenizer for free, where spawn re-imports transformers in each
        # (seconds apiece). Safe here: the parent has tokenized nothing yet, so no tokenizer or Arrow threads run.
        _init_worker(info, params, tokenizer)
        return mp.get_context("fork").Pool(params.num_workers)
    return mp.get_context("spawn").Pool(params.num_workers, _init_worker, (info, params))


def tokenize_chunks(
    chunks: Iterator[list[tuple[str, str]]], info: TargetInfo, tokenizer: Any, params: TokenizeParams
) -> Iterator[ChunkResult]:
    """Results of every chunk of lines, in input order; ``params.num_workers`` processes, or this one for 1."""
    if params.num_workers <= 1:
        _init_worker(info, params, tokenizer)
        yield from map(_work, chunks)
        return
    with _pool(info, params, tokenizer) as pool:
        # A bounded window of chunks in flight keeps memory flat however many completions there are.
        pending: deque = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_work, (chunk,)))
            if len(pending) >= 2 * params.num_workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
