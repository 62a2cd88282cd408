"""The ``merge`` stage: an existing training set (``merge.base``) + the new tokenized rows -> ``data/merged``.

The merged folder is a ``save_to_disk`` folder whose first shards are the base's own shard files, carried
byte-identical, and whose last shards hold the new rows; DVC stores files by content, so its cache grows by the
new shards alone and the previous version stays restorable (``git checkout`` + ``dvc checkout``). Before a
byte is written the guards of :mod:`draftline.merge_guards` run, and new rows whose prompt the base already
holds are dropped and counted. Training order is a seeded permutation in ``order.npy``, not a shuffled copy.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from draftline import dataset_format as fmt
from draftline.files import atomic_path, write_json
from draftline.fingerprint import tokenizer_fingerprint
from draftline.logs import get_logger
from draftline.merge_guards import (
    PROMPT_KEY_PREFIX,
    CastPlan,
    MergeGuardError,
    apply_casts,
    check_tokenizer_claim,
    check_values,
    plan_casts,
    prompt_keys,
    reencode_check,
)
from draftline.records import TargetInfo
from draftline.target import load_target, load_tokenizer
from draftline.tokenize import length_stats

log = get_logger(__name__)

# The training order: an int64 permutation of the merged rows (row ``order[k]`` is trained k-th).
ORDER_FILE = "order.npy"
# Linux ioctl that clones a file's extents (copy-on-write) on btrfs, XFS and other reflink filesystems.
_FICLONE = 0x40049409


@dataclass(frozen=True)
class MergeParams:
    """``params.yaml: merge`` (each key is documented there and in docs/merge.md)."""

    base: str | None = None
    base_tokenizer: str | None = None
    assume_same_tokenizer: bool = False
    check_rows: int = 256
    check_min_match: float = 0.95
    drop_columns: list[str] = field(default_factory=list)
    seed: int = 0

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> "MergeParams":
        params = params or {}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"params.yaml: merge has unknown key(s) {unknown}; known: {sorted(known)}")
        p = cls(**params)
        if p.check_rows < 0 or not 0.0 <= p.check_min_match <= 1.0:
            raise ValueError("merge.check_rows must be >= 0 and merge.check_min_match in [0, 1]")
        if not isinstance(p.drop_columns, list):
            raise ValueError("merge.drop_columns must be a list of column names")
        return p


@dataclass
class Part:
    """One dataset folder opened for the merge: its shards memory-mapped, and how they reach the schema."""

    folder: Path
    where: str
    meta: fmt.DatasetMeta | None  # None: a legacy folder without draftline.json
    files: list[str]
    tables: list[pa.Table]
    plan: CastPlan

    @property
    def num_rows(self) -> int:
        return sum(t.num_rows for t in self.tables)


def open_part(
    folder: str | os.PathLike, where: str, legacy_ok: bool, drop_columns: list[str], vocab_size: int | None
) -> Part:
    """Open a ``save_to_disk`` folder without reading it (Arrow memory maps) and check its columns and values."""
    folder = Path(folder)
    if (folder / "dataset_dict.json").is_file():
        raise MergeGuardError(f"{where} is a DatasetDict: point at one of its splits (e.g. {folder / 'train'})")
    if not (folder / "state.json").is_file():
        raise FileNotFoundError(f"{where} has no state.json: not a datasets save_to_disk folder")
    meta = fmt.read_meta(folder) if (folder / fmt.META_FILE).is_file() else None
    if meta is None and not legacy_ok:
        fmt.read_meta(folder)  # raises its clear "not a draftline dataset" error
    files = fmt.shard_files(folder)
    tables = [pa.ipc.open_stream(pa.memory_map(str(folder / f))).read_all() for f in files]
    schemas = {t.schema.remove_metadata() for t in tables}
    if len(schemas) > 1:
        raise MergeGuardError(f"{where}: its shards do not share one schema; re-save it with datasets")
    plan = plan_casts(tables[0].schema.remove_metadata(), where, meta is None, drop_columns)
    # A shard written by another pyarrow may differ in metadata alone: that too is rewritten, never carried,
    # so that every shard of the merged folder has exactly the schema in dataset_info.json.
    if plan.identity and not all(t.schema.equals(fmt.SCHEMA, check_metadata=True) for t in tables):
        plan.casts["schema metadata"] = "rewritten"
    if not plan.identity:
        for f, t in zip(files, tables):
            check_values(t, plan, f"{where}/{f}", vocab_size)
    return Part(folder, where, meta, files, tables, plan)


def carry_file(src: Path, dst: Path) -> str:
    """Put a byte-identical copy of ``src`` at ``dst``; returns ``"reflink"`` or ``"copy"``.

    A reflink shares the blocks copy-on-write (instant, no extra disk). Never a hardlink: DVC runs as root
    here, where its read-only protection of linked files does not hold, so a later write through one name
    (or DVC relinking its cache) would silently change the base, the merged set and the cache together.
    A symlink would leave the merged folder pointing outside itself. So where reflinks are not supported
    (ext4), a plain copy (in-kernel, via sendfile).
    """
    with open(src, "rb") as s, open(dst, "wb") as d:
        try:
            fcntl.ioctl(d.fileno(), _FICLONE, s.fileno())
            return "reflink"
        except OSError:
            pass
    shutil.copyfile(src, dst)
    return "copy"


def _shard_info(table: pa.Table, path: Path) -> fmt.ShardInfo:
    return fmt.ShardInfo(
        filename=path.name,
        num_rows=table.num_rows,
        num_tokens=int(pc.sum(table.column("num_tokens")).as_py() or 0),
        num_loss_tokens=int(pc.sum(table.column("num_loss_tokens")).as_py() or 0),
        num_bytes=path.stat().st_size,
    )


def find_overlap(base_ids: pa.Array, new: pa.Table, legacy_keys: list[str]) -> dict[str, np.ndarray]:
    """Which new rows' prompts the base already holds: ``{"by_id": bool[], "by_prompt": bool[]}``.

    Rows are matched on ``id`` (the prompt stage's content id). Legacy base rows have no such id, so they are
    matched on the hash of their prompt tokens (``legacy_keys``); so are base rows that were legacy in an
    earlier round (their id is that hash, see ``PROMPT_KEY_PREFIX``).
    """
    new_ids = new.column("id")
    by_id = pc.is_in(new_ids, value_set=base_ids).to_numpy(zero_copy_only=False)
    keyed = pc.filter(base_ids, pc.starts_with(base_ids, PROMPT_KEY_PREFIX))
    key_set = pa.concat_arrays([pa.array(legacy_keys, pa.string()), keyed.cast(pa.string())])
    by_prompt = np.zeros(len(new), dtype=bool)
    if len(key_set) and len(new):
        by_prompt = pc.is_in(pa.array(prompt_keys(new), pa.string()), value_set=key_set).to_numpy(zero_copy_only=False)
        by_prompt &= ~by_id
    return {"by_id": by_id, "by_prompt": by_prompt}


def dataset_stats(num_tokens: np.ndarray, num_loss: np.ndarray, sources: pa.ChunkedArray) -> dict[str, Any]:
    """Rows, tokens, loss-mask coverage and length percentiles, in total and by source (with each one's share)."""
    stats = length_stats(num_tokens, num_loss)
    if len(num_tokens):
        stats["len_p10"] = float(np.percentile(num_tokens, 10))
        stats["len_p99"] = float(np.percentile(num_tokens, 99))
    names = sorted(pc.unique(sources).to_pylist())
    codes = pc.index_in(sources, value_set=pa.array(names, pa.string())).to_numpy()
    total_rows, total_tokens = max(1, len(num_tokens)), max(1, int(num_tokens.sum()))
    by_source = {}
    for code, name in enumerate(names):
        sel = codes == code
        s = length_stats(num_tokens[sel], num_loss[sel])
        s["share_rows"] = round(s["samples"] / total_rows, 6)
        s["share_tokens"] = round(s["total_tokens"] / total_tokens, 6)
        by_source[name] = s
    stats["by_source"] = by_source
    return stats


def _stats_of(tables: list[pa.Table]) -> dict[str, Any]:
    def col(name: str) -> np.ndarray:
        return np.concatenate([c.to_numpy() for t in tables for c in t.column(name).chunks] or [np.zeros(0, np.int32)])

    sources = pa.chunked_array([c for t in tables for c in t.column("source").chunks], type=pa.string())
    return dataset_stats(col("num_tokens"), col("num_loss_tokens"), sources)


def training_order(num_rows: int, seed: int) -> np.ndarray:
    """The seeded permutation the trainer walks: same seed and row count, same order, on any machine."""
    return np.random.default_rng(seed).permutation(num_rows).astype(np.int64)


def load_training_set(path: str | os.PathLike = "data/merged") -> tuple[datasets.Dataset, np.ndarray]:
    """The merged dataset (memory-mapped) and its training order, checked to be a permutation of its rows."""
    ds = fmt.load(path)
    order = np.load(Path(path) / ORDER_FILE, allow_pickle=False)
    if order.dtype != np.int64 or order.shape != (len(ds),) or not np.array_equal(np.sort(order), np.arange(len(ds))):
        raise ValueError(f"{Path(path) / ORDER_FILE} is not a permutation of the {len(ds)} rows: re-run the merge stage")
    return ds, order


def _check_base_tokenizer(params: MergeParams, base: Part, new_meta: fmt.DatasetMeta, info: TargetInfo) -> dict:
    """The tokenizer guards on the base (see merge_guards); returns what was checked, for the metrics."""
    claimed_fp = None
    if base.meta is None and params.base_tokenizer:
        from transformers import AutoTokenizer

        base_tok = AutoTokenizer.from_pretrained(params.base_tokenizer, local_files_only=True)
        try:
            claimed_fp = tokenizer_fingerprint(params.base_tokenizer, base_tok.chat_template)
        except ValueError as e:
            raise MergeGuardError(f"merge.base_tokenizer {params.base_tokenizer}: {e}") from None
    how = check_tokenizer_claim(base.meta, new_meta, claimed_fp, params.assume_same_tokenizer, base.where)
    rng = np.random.default_rng(params.seed)
    k = min(params.check_rows, base.num_rows)
    picks = np.sort(rng.choice(base.num_rows, size=k, replace=False)) if k else np.zeros(0, np.int64)
    # Row by row: a take() over the whole memory-mapped column would first copy all of it into one chunk.
    starts = np.cumsum([0] + [t.num_rows for t in base.tables])
    sample = []
    for i in picks:
        t = int(np.searchsorted(starts, i, side="right")) - 1
        sample.append(base.tables[t].column("input_ids")[int(i - starts[t])].as_py())
    result = reencode_check(_backend_tokenizer(info), sample, params.check_min_match, base.where) if k else {}
    return {"tokenizer_claim": how, "reencode": result}


def _backend_tokenizer(info: TargetInfo) -> Any:
    """The target's Rust tokenizer, all the re-encode check needs: read straight from tokenizer.json where the
    folder has one (a fraction of a second; wrapping it in transformers takes seconds), else via transformers."""
    from tokenizers import Tokenizer

    path = Path(info.path) / "tokenizer.json"
    return Tokenizer.from_file(str(path)) if path.is_file() else load_tokenizer(info).backend_tokenizer


def _write_shards(tmp: Path, base: Part | None, legacy_keys: list[str], new: Part, kept: pa.Table) -> tuple:
    """Stage the base's shards, then the new rows', in ``tmp``; returns their infos, the base as written
    (for its stats) and how files were carried."""
    staged: list[fmt.ShardInfo] = []
    modes: set[str] = set()
    base_tables: list[pa.Table] = []

    def carry(part: Part, tag: str) -> None:
        for i, (f, t) in enumerate(zip(part.files, part.tables)):
            dst = tmp / f".{tag}-{i:05d}.arrow"
            modes.add(carry_file(part.folder / f, dst))
            staged.append(_shard_info(t, dst))

    if base is not None and base.plan.identity:
        carry(base, "base")
        base_tables = base.tables
    elif base is not None:
        # Casts change the bytes anyway, so the base is re-cut into standard shards (a one-time cost: the
        # merged folder, the next round's base, is already in the schema and is carried from then on).
        writer = fmt.ShardWriter(tmp, prefix="base")
        start = 0
        for t in base.tables:
            keys = legacy_keys[start : start + t.num_rows] if "id" in base.plan.derived else None
            start += t.num_rows
            cast = apply_casts(t, base.plan, keys)
            base_tables.append(cast.select(["num_tokens", "num_loss_tokens", "source"]))
            writer.add(cast)
        staged += writer.close()
    if kept.num_rows == new.num_rows and new.plan.identity:
        carry(new, "new")
    else:
        writer = fmt.ShardWriter(tmp, prefix="new")
        writer.add(kept)
        staged += writer.close()
    for i, s in enumerate(staged):
        final = fmt.shard_name(i, len(staged))
        os.replace(tmp / s.filename, tmp / final)
        s.filename = final
    return staged, base_tables, modes


def run_merge(
    params: MergeParams,
    tokenized_dir: str | os.PathLike = "data/tokenized",
    target_dir: str | os.PathLike = "data/target",
    out_dir: str | os.PathLike = "data/merged",
    metrics_path: str | os.PathLike = "metrics/merge.json",
) -> dict[str, Any]:
    """Run the stage; returns the metrics it writes. Raises :class:`MergeGuardError` before writing anything
    when the base does not fit the new data."""
    started = time.perf_counter()
    info = load_target(target_dir)
    new = open_part(tokenized_dir, str(tokenized_dir), False, [], info.vocab_size)
    assert new.meta is not None
    if new.meta.tokenizer_fingerprint != info.tokenizer_fingerprint:
        raise MergeGuardError(
            f"{tokenized_dir} was tokenized with another tokenizer than {target_dir} describes: re-run tokenize"
        )
    new_table = pa.concat_tables(new.tables)

    base = guards = None
    legacy_keys: list[str] = []
    none = np.zeros(new_table.num_rows, dtype=bool)
    overlap = {"by_id": none, "by_prompt": none}
    if params.base:
        base = open_part(params.base, f"merge.base {params.base}", True, params.drop_columns, info.vocab_size)
        guards = _check_base_tokenizer(params, base, new.meta, info)
        if base.meta is None:
            legacy_keys = [k for t in base.tables for k in prompt_keys(t)]
        id_chunks = [c for t in base.tables if "id" in t.column_names for c in t.column("id").cast(pa.string()).chunks]
        base_ids = pa.concat_arrays(id_chunks) if id_chunks else pa.array([], pa.string())
        overlap = find_overlap(base_ids, new_table, legacy_keys)
    drop = overlap["by_id"] | overlap["by_prompt"]
    kept = new_table.filter(pa.array(~drop)) if drop.any() else new_table

    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        staged, base_tables, modes = _write_shards(tmp, base, legacy_keys, new, kept)
        fmt.write_folder_index(tmp, [s.filename for s in staged])
        meta = fmt.DatasetMeta(**{k: getattr(new.meta, k) for k in fmt.COMPAT_FIELDS}, max_len=new.meta.max_len)
        base_stats = _stats_of(base_tables) if base is not None else None
        if base_stats:
            meta.max_len = max(meta.max_len, base.meta.max_len if base.meta else base_stats.get("len_max", 0))
        meta.set_shards(staged)
        fmt.write_meta(tmp, meta)
        np.save(tmp / ORDER_FILE, training_order(meta.num_rows, params.seed), allow_pickle=False)

    carried = base is not None and base.plan.identity
    metrics = {
        "base": base_stats,
        "new": _stats_of(new.tables),
        "merged": _stats_of(base_tables + [kept]),
        "overlap": {
            "new_rows": new_table.num_rows,
            "dropped": int(drop.sum()),
            "dropped_by_id": int(overlap["by_id"].sum()),
            "dropped_by_prompt_tokens": int(overlap["by_prompt"].sum()),
            "kept": kept.num_rows,
        },
        "guards": {
            "base_kind": "none" if base is None else ("draftline" if base.meta else "legacy"),
            **(guards or {}),
            "casts": base.plan.casts if base else {},
            "derived_columns": base.plan.derived if base else [],
            "dropped_columns": base.plan.dropped if base else [],
        },
        "base_shards_carried": len(base.files) if carried else 0,
        "shards": len(staged),
        "bytes": sum(s.num_bytes for s in staged),
    }
    write_json(metrics_path, metrics)
    log.info(
        "merged %d base rows (%s) + %d new rows, %d of them dropped as already in the base: %d rows in %d shards "
        "(files carried by %s) in %.1f s",
        base.num_rows if base else 0, "carried" if carried else "rewritten" if base else "none",
        new_table.num_rows, int(drop.sum()), meta.num_rows, len(staged), "/".join(sorted(modes)) or "-",
        time.perf_counter() - started,
    )  # fmt: skip
    return metrics
