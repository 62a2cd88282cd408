"""The ``tokenize`` stage: completions -> a ``datasets`` folder of ``input_ids`` + ``loss_mask`` (dataset_format).

The main process reads ``data/completions/part-*.jsonl`` in file and line order, in fixed-size chunks of lines,
and writes the shards; ``workers`` processes parse each chunk, turn every completion into one row (``turns: last``)
or one row per assistant turn (``turns: all``), and render, tokenize and mask them (:mod:`draftline.loss_mask`).
Chunks are taken back in order, so the output is the same, byte for byte, whatever the number of workers.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from draftline.dataset_format import MAX_SHARD_BYTES, DatasetMeta, write_dataset
from draftline.files import write_csv, write_json
from draftline.logs import get_logger
from draftline.loss_mask import OVERFLOW_MODES, ChunkResult, Example, MaskBuilder
from draftline.params import check_keys
from draftline.records import CompletionRecord, TargetInfo
from draftline.skips import Skips
from draftline.stats import length_stats

log = get_logger(__name__)

TURN_MODES = ("last", "all")
HISTOGRAM_BINS = 64


@dataclass(frozen=True)
class TokenizeParams:
    """``params.yaml: tokenize`` (each key is documented there and in docs/tokenize.md)."""

    turns: str = "last"
    max_len: int = 3072
    overflow: str = "drop"
    workers: int = 0
    chunk_rows: int = 64
    max_shard_mb: int = MAX_SHARD_BYTES // 1_000_000
    strict: bool = False

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "TokenizeParams":
        check_keys(params, cls, "tokenize")
        p = cls(**params)
        if p.turns not in TURN_MODES:
            raise ValueError(f"tokenize.turns must be one of {TURN_MODES}, not {p.turns!r}")
        if p.overflow not in OVERFLOW_MODES:
            raise ValueError(f"tokenize.overflow must be one of {OVERFLOW_MODES}, not {p.overflow!r}")
        if p.chunk_rows < 1 or p.max_shard_mb < 1 or p.workers < 0:
            raise ValueError("tokenize.chunk_rows and max_shard_mb must be >= 1, workers >= 0 (0 = all cores)")
        return p

    @property
    def num_workers(self) -> int:
        return self.workers or os.cpu_count() or 1


def examples_from_record(rec: CompletionRecord, turns: str) -> Iterator[Example]:
    """The rows one completion trains: its last assistant turn, or (``all``) every assistant turn with the
    history the template shows before it (so earlier turns' reasoning is dropped exactly as Qwen3 drops it)."""
    thinking = rec.generation.get("enable_thinking")
    thinking = thinking if isinstance(thinking, bool) else None
    if turns == "last":
        yield Example(rec.id, rec.source, rec.prompt_messages, rec.messages, rec.tools, thinking)
        return
    k = 0
    for i, m in enumerate(rec.messages):
        if m.get("role") == "assistant" and i > 0:
            yield Example(f"{rec.id}/turn{k}", rec.source, rec.messages[:i], rec.messages[: i + 1], rec.tools, thinking)
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
        rec = CompletionRecord.from_dict(obj)
        roles_ok = bool(rec.messages) and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in rec.messages)
    except (TypeError, AttributeError) as e:
        return [], ("invalid_record", where, str(e))
    if not roles_ok:
        return [], ("invalid_record", where, "messages must be a non-empty list of {role, content} objects")
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


def histogram(num_tokens: np.ndarray, max_len: int) -> list[dict[str, int]]:
    """Rows per length bin (``seq_len`` is the bin's lower edge; the last bin holds ``max_len`` too)."""
    width = max(1, -(-max_len // HISTOGRAM_BINS))
    bins = np.minimum(num_tokens // width, HISTOGRAM_BINS - 1)
    counts = np.bincount(bins, minlength=HISTOGRAM_BINS) if len(num_tokens) else np.zeros(HISTOGRAM_BINS)
    return [{"seq_len": i * width, "rows": int(c)} for i, c in enumerate(counts)]


def run_tokenize(
    completions_dir: str | os.PathLike,
    target_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    metrics_path: str | os.PathLike,
    plot_path: str | os.PathLike,
    params: TokenizeParams,
) -> dict[str, Any]:
    """Run the stage; returns the metrics it writes."""
    # Imported here, not at the top: draftline.target pulls in torch, which spawned workers (no fork) need not load.
    from draftline.target import load_target, load_tokenizer

    info = load_target(target_dir)
    paths = sorted(Path(completions_dir).glob("part-*.jsonl"))
    if not paths:
        raise FileNotFoundError(f"no part-*.jsonl in {completions_dir}: run the generate stage first")
    # Checks the folder's tokenizer and chat template against the fingerprint the target stage recorded.
    tokenizer = load_tokenizer(info)
    skips = Skips(log, strict=params.strict)
    log.info("tokenizing %d completion files with %d worker(s), turns=%s", len(paths), params.num_workers, params.turns)

    meta = DatasetMeta(
        tokenizer_fingerprint=info.tokenizer_fingerprint,
        chat_template_sha256=info.chat_template_sha256,
        enable_thinking=None,
        max_len=params.max_len,
        mask_token_id=info.mask_token_id,
        end_of_turn_token_id=info.end_of_turn_token_id,
    )
    truncated = 0
    thinking: set[bool | None] = set()
    num_tokens: list[np.ndarray] = []
    num_loss: list[np.ndarray] = []
    sources: list[str] = []
    bar = tqdm(desc="tokenize", unit=" rows")
    started = time.perf_counter()

    def tables() -> Iterator[pa.Table]:
        nonlocal truncated
        chunks = chunked(read_lines(paths), params.chunk_rows)
        for res in tokenize_chunks(chunks, info, tokenizer, params):
            for reason, row_id, detail in res.skips:
                skips.add(reason, row_id, detail)
            truncated += res.truncated
            thinking.update(res.thinking)
            num_tokens.append(res.table.column("num_tokens").to_numpy())
            num_loss.append(res.table.column("num_loss_tokens").to_numpy())
            sources.extend(res.table.column("source").to_pylist())
            bar.update(res.table.num_rows)
            yield res.table
        # write_dataset writes draftline.json after the last table, so the mode is known by then.
        if len(thinking) > 1:
            log.warning("rows come from generation runs with and without thinking: enable_thinking recorded as null")
        meta.enable_thinking = next(iter(thinking)) if len(thinking) == 1 else None

    write_dataset(out_dir, tables(), meta, max_shard_bytes=params.max_shard_mb * 1_000_000)
    bar.close()
    elapsed = time.perf_counter() - started

    nt = np.concatenate(num_tokens) if num_tokens else np.zeros(0, np.int32)
    nl = np.concatenate(num_loss) if num_loss else np.zeros(0, np.int32)
    src = np.asarray(sources, dtype=object)
    disk = sum(s.num_bytes for s in meta.shards)
    metrics = {
        **length_stats(nt, nl),
        "truncated": truncated,
        "skipped": skips.total,
        "skips": skips.as_dict(),
        "per_source": {s: length_stats(nt[src == s], nl[src == s]) for s in sorted(set(sources))},
        "shards": len(meta.shards),
        "bytes_per_token": round(disk / max(1, meta.num_tokens), 4),
        "enable_thinking": meta.enable_thinking,
    }
    write_json(metrics_path, metrics)
    write_csv(plot_path, histogram(nt, params.max_len), ["seq_len", "rows"])
    log.info(
        "wrote %d rows, %d tokens (%.1f%% supervised), %.3f bytes/token in %d shard(s); skipped %d %s; "
        "%.0f tokens/s over %.1f s",
        meta.num_rows, meta.num_tokens, 100 * metrics.get("loss_coverage", 0), metrics["bytes_per_token"],
        len(meta.shards), skips.total, skips.as_dict(), meta.num_tokens / max(elapsed, 1e-9), elapsed,
    )  # fmt: skip
    for name, st in [("all", metrics), *metrics["per_source"].items()]:
        if st["samples"]:
            log.info(
                "%-20s %8d rows %12d tokens  coverage %5.1f%%  length mean %.0f median %.0f p90 %.0f max %d",
                name, st["samples"], st["total_tokens"], 100 * st["loss_coverage"],
                st["len_mean"], st["len_median"], st["len_p90"], st["len_max"],
            )  # fmt: skip
    return metrics
