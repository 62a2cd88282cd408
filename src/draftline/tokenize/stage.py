"""The ``tokenize`` stage: completions -> a dataset folder of ``input_ids`` + ``loss_mask`` (:mod:`draftline.core.dataset`).

Rows are made in chunks on ``workers`` processes and written in input order (:mod:`draftline.tokenize.chunks`), so
the folder is the same, byte for byte, whatever the number of workers. Its ``draftline.json`` records the target's
tokenizer fingerprint, template, mask token and the generation run's thinking mode (null when the rows mix both),
which every later stage reads instead of repeating them as params, and each shard's rows' provenance (the target's
model fingerprint, the engine, the sampling and the thinking mode of their completions:
:mod:`draftline.core.provenance`). The folder appears whole or not at all.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from draftline.core.dataset import DatasetMeta, write_dataset
from draftline.core.errors import MissingInput
from draftline.core.files import write_csv
from draftline.core.logs import get_logger
from draftline.core.records import TargetInfo
from draftline.core.runner import StageArgs, StageRun
from draftline.core.skips import Skips
from draftline.core.stats import length_stats
from draftline.core.target_loader import load_target, load_tokenizer
from draftline.tokenize.chunks import chunked, read_lines, tokenize_chunks
from draftline.tokenize.params import TokenizeParams

log = get_logger(__name__)

HISTOGRAM_BINS = 64


def histogram(num_tokens: np.ndarray, max_len: int) -> list[dict[str, int]]:
    """Rows per length bin up to ``max_len`` (``seq_len`` is the bin's lower edge; the last bin holds ``max_len``
    too). The stage passes the longest row's length: ``tokenize.max_len`` is only a sanity cap."""
    width = max(1, -(-max_len // HISTOGRAM_BINS))
    bins = np.minimum(num_tokens // width, HISTOGRAM_BINS - 1)
    counts = np.bincount(bins, minlength=HISTOGRAM_BINS) if len(num_tokens) else np.zeros(HISTOGRAM_BINS)
    return [{"seq_len": i * width, "rows": int(c)} for i, c in enumerate(counts)]


@dataclass
class Tally:
    """What the written rows add up to, collected chunk by chunk while the shards are written."""

    skips: Skips
    truncated: int = 0
    thinking: set[bool | None] = field(default_factory=set)
    num_tokens: list[np.ndarray] = field(default_factory=list)
    num_loss: list[np.ndarray] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        nt = np.concatenate(self.num_tokens) if self.num_tokens else np.zeros(0, np.int32)
        nl = np.concatenate(self.num_loss) if self.num_loss else np.zeros(0, np.int32)
        return nt, nl, np.asarray(self.sources, dtype=object)

    def enable_thinking(self) -> bool | None:
        if len(self.thinking) > 1:
            log.warning("rows come from generation runs with and without thinking: enable_thinking recorded as null")
        return next(iter(self.thinking)) if len(self.thinking) == 1 else None


def row_tables(paths: list[Path], info: TargetInfo, tokenizer: Any, params: TokenizeParams, tally: Tally,
               meta: DatasetMeta) -> Iterator[tuple[pa.Table, list[str | None]]]:
    """The rows of every completion, a table per chunk with each row's provenance, counted into ``tally``; sets
    ``meta.enable_thinking`` at the end (write_dataset writes draftline.json after the last table, so the mode is
    known by then)."""
    bar = tqdm(desc="tokenize", unit=" rows")
    for res in tokenize_chunks(chunked(read_lines(paths), params.chunk_rows), info, tokenizer, params):
        for reason, row_id, detail in res.skips:
            tally.skips.add(reason, row_id, detail)
        tally.truncated += res.truncated
        tally.thinking.update(res.thinking)
        tally.num_tokens.append(res.table.column("num_tokens").to_numpy())
        tally.num_loss.append(res.table.column("num_loss_tokens").to_numpy())
        tally.sources.extend(res.table.column("source").to_pylist())
        bar.update(res.table.num_rows)
        yield res.table, res.provenance
    bar.close()
    # Before write_dataset publishes the folder: a refused run leaves no output behind.
    rows_in = sum(len(n) for n in tally.num_tokens) + tally.skips.total
    tally.skips.check_share(rows_in, params.max_skip_share, "tokenize.max_skip_share",
                            {"too_long": f"raise tokenize.max_len ({params.max_len}: a sanity cap; training cuts "
                                         "rows to train.max_length itself)"})
    meta.enable_thinking = tally.enable_thinking()


def build_details(tally: Tally, meta: DatasetMeta) -> dict[str, Any]:
    """The report: length statistics over all rows and per source, the shards, the thinking mode (the skip reasons
    are the runner's)."""
    nt, nl, src = tally.arrays()
    return {
        **length_stats(nt, nl),
        "truncated": tally.truncated,
        "per_source": {s: length_stats(nt[src == s], nl[src == s]) for s in sorted(set(tally.sources))},
        "shards": len(meta.shards),
        "bytes_per_token": round(sum(s.num_bytes for s in meta.shards) / max(1, meta.num_tokens), 4),
        "enable_thinking": meta.enable_thinking,
    }


def log_summary(details: dict[str, Any], meta: DatasetMeta, skips: Skips) -> None:
    log.info(
        "wrote %d rows, %d tokens (%.1f%% supervised), %.3f bytes/token in %d shard(s); skipped %d %s",
        meta.num_rows, meta.num_tokens, 100 * details.get("loss_coverage", 0), details["bytes_per_token"],
        len(meta.shards), skips.total, skips.as_dict(),
    )  # fmt: skip
    for name, st in [("all", details), *details["per_source"].items()]:
        if st["samples"]:
            log.info(
                "%-20s %8d rows %12d tokens  coverage %5.1f%%  length mean %.0f median %.0f p90 %.0f max %d",
                name, st["samples"], st["total_tokens"], 100 * st["loss_coverage"],
                st["len_mean"], st["len_median"], st["len_p90"], st["len_max"],
            )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class TokenizeArgs(StageArgs):
    """``stages/tokenize_chats.py``'s paths (dvc.yaml passes them): the generate stage's folder, the target's
    ``target.json``, the dataset folder written, the headline metrics and the length histogram."""

    completions: Path
    target: Path
    out: Path
    metrics: Path
    plot: Path


def run_tokenize(p: TokenizeParams, args: TokenizeArgs, stage: StageRun) -> None:
    """The whole stage: every ``part-*.jsonl`` of ``args.completions`` -> the dataset folder ``args.out``."""
    stage.skips.strict = p.strict
    info = load_target(args.target)
    paths = sorted(Path(args.completions).glob("part-*.jsonl"))
    if not paths:
        raise MissingInput(f"no part-*.jsonl in {args.completions}: run the generate stage first (dvc repro generate)")
    started = time.perf_counter()
    # Checks the folder's tokenizer and chat template against the fingerprint the target stage recorded.
    tokenizer = load_tokenizer(info)
    log.info("tokenizing %d completion files with %d worker(s), turns=%s", len(paths), p.num_workers, p.turns)
    meta = DatasetMeta(
        tokenizer_fingerprint=info.tokenizer_fingerprint,
        chat_template_sha256=info.chat_template_sha256,
        enable_thinking=None,
        max_len=p.max_len,
        mask_token_id=info.mask_token_id,
        end_of_turn_token_id=info.end_of_turn_token_id,
    )
    tally = Tally(stage.skips)
    tables = row_tables(paths, info, tokenizer, p, tally, meta)
    write_dataset(args.out, tables, meta, max_shard_bytes=p.max_shard_mb * 1_000_000)
    stage.run["tokens_per_second"] = round(meta.num_tokens / max(time.perf_counter() - started, 1e-9))
    details = build_details(tally, meta)
    stage.details.update(details)
    stage.headline.update(rows=details["samples"], tokens=details["total_tokens"], loss_tokens=details["loss_tokens"],
                          truncated=tally.truncated)
    nt, _, _ = tally.arrays()
    write_csv(args.plot, histogram(nt, int(nt.max()) if len(nt) else p.max_len), ["seq_len", "rows"])
    log_summary(details, meta, stage.skips)
