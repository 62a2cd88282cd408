"""The ``tokenize`` stage: completions -> a dataset folder of ``input_ids`` + ``loss_mask`` (:mod:`draftline.core.dataset`).

Rows are made in chunks on ``workers`` processes and written in input order (:mod:`draftline.tokenize.chunks`), so
the folder is the same, byte for byte, whatever the number of workers. Its ``draftline.json`` records the target's
tokenizer fingerprint, template, mask token and the generation run's thinking mode (null when the rows mix both),
which every later stage reads instead of repeating them as params. The folder appears whole or not at all.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from draftline.core.dataset import DatasetMeta, write_dataset
from draftline.core.files import write_csv, write_json
from draftline.core.logs import get_logger
from draftline.core.records import TargetInfo
from draftline.core.skips import Skips
from draftline.core.stats import length_stats
from draftline.core.target import load_target, load_tokenizer
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
               meta: DatasetMeta) -> Iterator[pa.Table]:
    """The rows of every completion, a table per chunk, counted into ``tally``; sets ``meta.enable_thinking`` at the
    end (write_dataset writes draftline.json after the last table, so the mode is known by then)."""
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
        yield res.table
    bar.close()
    # Before write_dataset publishes the folder: a refused run leaves no output behind.
    rows_in = sum(len(n) for n in tally.num_tokens) + tally.skips.total
    tally.skips.check_share(rows_in, params.max_skip_share, "tokenize.max_skip_share",
                            {"too_long": f"raise tokenize.max_len ({params.max_len}: a sanity cap; training cuts "
                                         "rows to train.max_length itself)"})
    meta.enable_thinking = tally.enable_thinking()


def build_metrics(tally: Tally, meta: DatasetMeta) -> dict[str, Any]:
    nt, nl, src = tally.arrays()
    return {
        **length_stats(nt, nl),
        "truncated": tally.truncated,
        "skipped": tally.skips.total,
        "skips": tally.skips.as_dict(),
        "per_source": {s: length_stats(nt[src == s], nl[src == s]) for s in sorted(set(tally.sources))},
        "shards": len(meta.shards),
        "bytes_per_token": round(sum(s.num_bytes for s in meta.shards) / max(1, meta.num_tokens), 4),
        "enable_thinking": meta.enable_thinking,
    }


def log_summary(metrics: dict[str, Any], meta: DatasetMeta, elapsed: float) -> None:
    log.info(
        "wrote %d rows, %d tokens (%.1f%% supervised), %.3f bytes/token in %d shard(s); skipped %d %s; "
        "%.0f tokens/s over %.1f s",
        meta.num_rows, meta.num_tokens, 100 * metrics.get("loss_coverage", 0), metrics["bytes_per_token"],
        len(meta.shards), metrics["skipped"], metrics["skips"], meta.num_tokens / max(elapsed, 1e-9), elapsed,
    )  # fmt: skip
    for name, st in [("all", metrics), *metrics["per_source"].items()]:
        if st["samples"]:
            log.info(
                "%-20s %8d rows %12d tokens  coverage %5.1f%%  length mean %.0f median %.0f p90 %.0f max %d",
                name, st["samples"], st["total_tokens"], 100 * st["loss_coverage"],
                st["len_mean"], st["len_median"], st["len_p90"], st["len_max"],
            )  # fmt: skip


def run_tokenize(
    completions_dir: str | os.PathLike,
    target_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    metrics_path: str | os.PathLike,
    plot_path: str | os.PathLike,
    params: TokenizeParams,
) -> dict[str, Any]:
    """Run the stage; returns the metrics it writes."""
    started = time.perf_counter()
    info = load_target(target_dir)
    paths = sorted(Path(completions_dir).glob("part-*.jsonl"))
    if not paths:
        raise FileNotFoundError(f"no part-*.jsonl in {completions_dir}: run the generate stage first")
    # Checks the folder's tokenizer and chat template against the fingerprint the target stage recorded.
    tokenizer = load_tokenizer(info)
    log.info("tokenizing %d completion files with %d worker(s), turns=%s", len(paths), params.num_workers, params.turns)
    meta = DatasetMeta(
        tokenizer_fingerprint=info.tokenizer_fingerprint,
        chat_template_sha256=info.chat_template_sha256,
        enable_thinking=None,
        max_len=params.max_len,
        mask_token_id=info.mask_token_id,
        end_of_turn_token_id=info.end_of_turn_token_id,
    )
    tally = Tally(Skips(log, strict=params.strict))
    tables = row_tables(paths, info, tokenizer, params, tally, meta)
    write_dataset(out_dir, tables, meta, max_shard_bytes=params.max_shard_mb * 1_000_000)
    metrics = build_metrics(tally, meta)
    metrics["stage_seconds"] = round(time.perf_counter() - started, 2)
    write_json(metrics_path, metrics)
    nt, _, _ = tally.arrays()
    write_csv(plot_path, histogram(nt, int(nt.max()) if len(nt) else params.max_len), ["seq_len", "rows"])
    log_summary(metrics, meta, time.perf_counter() - started)
    return metrics
