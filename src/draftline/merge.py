"""The ``merge`` stage: an existing training set (``merge.base``) + the new tokenized rows -> ``data/merged``.

The merged folder is a ``save_to_disk`` folder whose first shards are the base's own shard files, carried
byte-identical (:mod:`draftline.merge_carry`: reflink, hardlink or copy), and whose last shards hold the new
rows; DVC stores files by content, so its cache grows by the new shards alone and the previous version stays
restorable (``git checkout`` + ``dvc checkout``). The guards of :mod:`draftline.merge_guards` run before
anything is published, and new rows whose prompt the base already holds are dropped and counted. Training order
is a seeded permutation in ``order.npy``, not a shuffled copy.

A merge costs what the new data costs: the base is never read whole. Its ids, counts and sources are read from
the memory-mapped shards (a few bytes per row), its shards are linked rather than copied where that is safe,
the merged folder's fingerprint is derived from the base's instead of rehashing it, and the re-encode check
(whose tokenizer load is the one fixed cost) runs in a child process while the new shards are written.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from draftline import dataset_format as fmt
from draftline.files import atomic_path, write_json
from draftline.fingerprint import tokenizer_fingerprint
from draftline.logs import get_logger
from draftline.merge_carry import CARRY_MODES, Carrier, make_read_only
from draftline.merge_guards import (
    PROMPT_KEY_PREFIX,
    CastPlan,
    MergeGuardError,
    apply_casts,
    check_reencoded,
    check_tokenizer_claim,
    check_values,
    plan_casts,
    prompt_keys,
)
from draftline.params import check_keys
from draftline.records import TargetInfo
from draftline.reencode import count_round_trips, start_check
from draftline.stats import Sources, mix_stats
from draftline.target import load_target, load_tokenizer

log = get_logger(__name__)

# The training order: an int64 permutation of the merged rows (row ``order[k]`` is trained k-th).
ORDER_FILE = "order.npy"
# Length percentiles reported besides the median (tokenize reports p90 only).
PERCENTILES = (10, 90, 99)


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
    carry: str = "auto"

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> "MergeParams":
        params = params or {}
        check_keys(params, cls, "merge")
        p = cls(**params)
        if p.check_rows < 0 or not 0.0 <= p.check_min_match <= 1.0:
            raise ValueError("merge.check_rows must be >= 0 and merge.check_min_match in [0, 1]")
        if not isinstance(p.drop_columns, list):
            raise ValueError("merge.drop_columns must be a list of column names")
        if p.carry not in CARRY_MODES:
            raise ValueError(f"merge.carry must be one of {list(CARRY_MODES)}, not {p.carry!r}")
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
    fingerprint: str  # state.json's: identifies the shards' bytes without reading them

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
    fingerprint = json.loads((folder / "state.json").read_text(encoding="utf-8")).get("_fingerprint") or ""
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
    return Part(folder, where, meta, files, tables, plan, fingerprint)


def _shard_info(table: pa.Table, path: Path) -> fmt.ShardInfo:
    return fmt.ShardInfo(
        filename=path.name,
        num_rows=table.num_rows,
        num_tokens=int(pc.sum(table.column("num_tokens")).as_py() or 0),
        num_loss_tokens=int(pc.sum(table.column("num_loss_tokens")).as_py() or 0),
        num_bytes=path.stat().st_size,
    )


def find_overlap(base_ids: pa.ChunkedArray, new: pa.Table, legacy_keys: list[str]) -> dict[str, np.ndarray]:
    """Which new rows' prompts the base already holds: ``{"by_id": bool[], "by_prompt": bool[]}``.

    Rows are matched on ``id`` (the prompt stage's content id). Legacy base rows have no such id, so they are
    matched on the hash of their prompt tokens (``legacy_keys``); so are base rows that were legacy in an
    earlier round (their id is that hash, see ``PROMPT_KEY_PREFIX``).
    """
    new_ids = new.column("id")
    # The hash table holds the new ids and the base's are looked up in it: 4x faster than hashing the base.
    found = base_ids.filter(pc.is_in(base_ids, value_set=new_ids.combine_chunks()))
    by_id = pc.is_in(new_ids, value_set=found.combine_chunks()).to_numpy(zero_copy_only=False)
    keyed = base_ids.filter(pc.starts_with(base_ids, PROMPT_KEY_PREFIX)).combine_chunks()
    key_set = pa.concat_arrays([pa.array(legacy_keys, pa.string()), keyed])
    by_prompt = np.zeros(len(new), dtype=bool)
    if len(key_set) and len(new):
        by_prompt = pc.is_in(pa.array(prompt_keys(new), pa.string()), value_set=key_set).to_numpy(zero_copy_only=False)
        by_prompt &= ~by_id
    return {"by_id": by_id, "by_prompt": by_prompt}


def kept_rows(table: pa.Table, drop: np.ndarray) -> pa.Table:
    """``table`` without the ``drop`` rows, as zero-copy slices (``Table.filter`` copies every token: ~1 s per
    300 MB, as much as writing them)."""
    if not drop.any():
        return table
    keep = np.concatenate([[False], ~drop, [False]])
    runs = np.flatnonzero(keep[1:] != keep[:-1]).reshape(-1, 2)
    return pa.concat_tables([table.slice(a, b - a) for a, b in runs]) if len(runs) else table.slice(0, 0)


@dataclass
class Counts:
    """What the stats need of some rows: numpy views of the memory-mapped count columns and the sources."""

    num_tokens: np.ndarray
    num_loss: np.ndarray
    sources: Sources

    @classmethod
    def of(cls, tables: list[pa.Table]) -> "Counts":
        def col(name: str) -> np.ndarray:
            chunks = [c.to_numpy() for t in tables for c in t.column(name).chunks]
            return np.concatenate(chunks or [np.zeros(0, np.int32)])

        sources = pa.chunked_array([c for t in tables for c in t.column("source").chunks], type=pa.string())
        return cls(col("num_tokens"), col("num_loss_tokens"), Sources.encode(sources))


def stats_of(parts: list[Counts]) -> dict[str, Any]:
    """Rows, tokens, loss coverage, length percentiles and the mix by source of the rows of ``parts`` together."""
    nt, nl = (np.concatenate([getattr(p, k) for p in parts]) for k in ("num_tokens", "num_loss"))
    return mix_stats(nt, nl, Sources.concat([p.sources for p in parts]), PERCENTILES)


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


def _check_claim(params: MergeParams, base: Part, new_meta: fmt.DatasetMeta) -> str:
    """The base's tokenizer claim (see merge_guards.check_tokenizer_claim); returns how it was made."""
    claimed_fp = None
    if base.meta is None and params.base_tokenizer:
        from transformers import AutoTokenizer

        base_tok = AutoTokenizer.from_pretrained(params.base_tokenizer, local_files_only=True)
        try:
            claimed_fp = tokenizer_fingerprint(params.base_tokenizer, base_tok.chat_template)
        except ValueError as e:
            raise MergeGuardError(f"merge.base_tokenizer {params.base_tokenizer}: {e}") from None
    return check_tokenizer_claim(base.meta, new_meta, claimed_fp, params.assume_same_tokenizer, base.where)


def _start_reencode(params: MergeParams, base: Part, info: TargetInfo) -> Callable[[], dict]:
    """Start the re-encode check on a seeded sample of base rows; the returned call waits for its verdict
    (a dict for the metrics) or raises :class:`MergeGuardError`."""
    k = min(params.check_rows, base.num_rows)
    if not k:
        return dict
    rng = np.random.default_rng(params.seed)
    picks = np.sort(rng.choice(base.num_rows, size=k, replace=False))
    # Row by row: a take() over the whole memory-mapped column would first copy all of it into one chunk.
    starts = np.cumsum([0] + [t.num_rows for t in base.tables])
    sample = []
    for i in picks:
        t = int(np.searchsorted(starts, i, side="right")) - 1
        sample.append(base.tables[t].column("input_ids")[int(i - starts[t])].as_py())
    tokenizer_json = Path(info.path) / "tokenizer.json"
    if tokenizer_json.is_file():
        matched = start_check(tokenizer_json, sample)
    else:  # a folder only transformers can read (no tokenizer.json): in this process
        matched = Future()
        matched.set_result(count_round_trips(load_tokenizer(info).backend_tokenizer, sample))
    return lambda: check_reencoded(matched.result(), k, params.check_min_match, base.where)


def _write_shards(
    tmp: Path, base: Part | None, legacy_keys: list[str], new: Part, kept: pa.Table, carrier: Carrier
) -> tuple[list[fmt.ShardInfo], list[pa.Table]]:
    """Stage the base's shards, then the new rows', in ``tmp``; returns their infos (base first) and the
    base's tables as written (for its stats)."""
    staged: list[fmt.ShardInfo] = []
    base_tables: list[pa.Table] = []

    def carry(part: Part, tag: str) -> None:
        for i, (f, t) in enumerate(zip(part.files, part.tables)):
            dst = tmp / f".{tag}-{i:05d}.arrow"
            carrier.carry(part.folder / f, dst)
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
    return staged, base_tables


def _fingerprint(base: Part | None, new: Part, drop: np.ndarray) -> str | None:
    """The merged folder's ``_fingerprint``: the key ``datasets`` names cache files inside that folder by, so it
    must tell contents apart, not hash them. The merged bytes follow from the carried base's, the new data's
    (their folders' fingerprints) and which new rows were dropped: hashing those reads no shard.
    None (hash every shard) when a base was rewritten or a fingerprint is missing."""
    if base is None or not base.plan.identity or not base.fingerprint or not new.fingerprint:
        return None
    dropped = xxhash.xxh3_64_hexdigest(np.packbits(drop).tobytes())
    return xxhash.xxh3_64_hexdigest(f"{base.fingerprint}+{new.fingerprint}-{dropped}".encode())


def run_merge(
    params: MergeParams,
    tokenized_dir: str | os.PathLike = "data/tokenized",
    target_dir: str | os.PathLike = "data/target",
    out_dir: str | os.PathLike = "data/merged",
    metrics_path: str | os.PathLike = "metrics/merge.json",
) -> dict[str, Any]:
    """Run the stage; returns the metrics it writes. Raises :class:`MergeGuardError`, leaving ``out_dir`` as it
    was, when the base does not fit the new data."""
    started = time.perf_counter()
    info = load_target(target_dir)
    new = open_part(tokenized_dir, str(tokenized_dir), False, [], info.vocab_size)
    assert new.meta is not None
    if new.meta.tokenizer_fingerprint != info.tokenizer_fingerprint:
        raise MergeGuardError(
            f"{tokenized_dir} was tokenized with another tokenizer than {target_dir} describes: re-run tokenize"
        )
    new_table = pa.concat_tables(new.tables)

    base = None
    claim = None
    reencode: Callable[[], dict] = dict
    legacy_keys: list[str] = []
    none = np.zeros(new_table.num_rows, dtype=bool)
    overlap = {"by_id": none, "by_prompt": none}
    if params.base:
        base = open_part(params.base, f"merge.base {params.base}", True, params.drop_columns, info.vocab_size)
        claim = _check_claim(params, base, new.meta)
        reencode = _start_reencode(params, base, info)
        if not base.plan.identity:  # a base to rewrite whole: know the verdict before spending that
            verdict = reencode()
            reencode = lambda: verdict  # noqa: E731
        if base.meta is None:
            legacy_keys = [k for t in base.tables for k in prompt_keys(t)]
        id_chunks = [c for t in base.tables if "id" in t.column_names for c in t.column("id").cast(pa.string()).chunks]
        overlap = find_overlap(pa.chunked_array(id_chunks, pa.string()), new_table, legacy_keys)
    drop = overlap["by_id"] | overlap["by_prompt"]
    kept = kept_rows(new_table, drop)

    carrier = Carrier(params.carry, out_dir)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        staged, base_tables = _write_shards(tmp, base, legacy_keys, new, kept, carrier)
        fmt.write_folder_index(tmp, [s.filename for s in staged], _fingerprint(base, new, drop))
        base_counts = Counts.of(base_tables) if base is not None else None
        meta = fmt.DatasetMeta(**{k: getattr(new.meta, k) for k in fmt.COMPAT_FIELDS}, max_len=new.meta.max_len)
        if base_counts is not None and len(base_counts.num_tokens):
            meta.max_len = max(meta.max_len, base.meta.max_len if base.meta else int(base_counts.num_tokens.max()))
        meta.set_shards(staged)
        fmt.write_meta(tmp, meta)
        np.save(tmp / ORDER_FILE, training_order(meta.num_rows, params.seed), allow_pickle=False)
        # The last guard: its verdict comes before the folder is published (a refusal discards it).
        reencoded = reencode()
        for s in staged:
            make_read_only(tmp / s.filename)

    kept_counts = Counts.of([kept])
    carried = base is not None and base.plan.identity
    metrics = {
        "base": stats_of([base_counts]) if base_counts is not None else None,
        "new": stats_of([Counts.of(new.tables)]),
        "merged": stats_of([base_counts, kept_counts] if base_counts is not None else [kept_counts]),
        "overlap": {
            "new_rows": new_table.num_rows,
            "dropped": int(drop.sum()),
            "dropped_by_id": int(overlap["by_id"].sum()),
            "dropped_by_prompt_tokens": int(overlap["by_prompt"].sum()),
            "kept": kept.num_rows,
        },
        "guards": {
            "base_kind": "none" if base is None else ("draftline" if base.meta else "legacy"),
            **({"tokenizer_claim": claim, "reencode": reencoded} if base is not None else {}),
            "casts": base.plan.casts if base else {},
            "derived_columns": base.plan.derived if base else [],
            "dropped_columns": base.plan.dropped if base else [],
        },
        "base_shards_carried": len(base.files) if carried else 0,
        "carried_by": "/".join(sorted(carrier.used)) or "-",
        "shards": len(staged),
        "bytes": sum(s.num_bytes for s in staged),
    }
    write_json(metrics_path, metrics)
    log.info(
        "merged %d base rows (%s) + %d new rows, %d of them dropped as already in the base: %d rows in %d shards "
        "(files carried by %s) in %.1f s",
        base.num_rows if base else 0, "carried" if carried else "rewritten" if base else "none",
        new_table.num_rows, int(drop.sum()), meta.num_rows, len(staged), metrics["carried_by"],
        time.perf_counter() - started,
    )  # fmt: skip
    return metrics
