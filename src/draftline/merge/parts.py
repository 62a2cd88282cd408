"""The datasets a merge combines, opened without reading them: Arrow memory maps of their shards, a cast plan,
the overlap of new rows with the base, and the per-row counts the statistics need.

Nothing here copies a token: the base is read as ids, counts and sources (a few bytes per row), prompts are
matched on the keys the shards record (16 bytes a row), and the rows a merge keeps are zero-copy slices.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from draftline.core import dataset as fmt
from draftline.core import provenance
from draftline.core.errors import MissingInput
from draftline.core.stats import Sources, mix_stats
from draftline.merge.foreign import export_claim, foreign_format, read_foreign
from draftline.merge.guards import CastPlan, MergeGuardError, check_values, plan_casts

# Length percentiles reported besides the median (tokenize reports p90 only).
PERCENTILES = (10, 90, 99)


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
    # Another trainer's format (merge.foreign), and the tokenizer fingerprint its draftline export.json claims.
    foreign: str | None = None
    claimed_fingerprint: str | None = None
    # Every row's recorded prompt key, (rows, 16) uint8 (verified with the shards); None where none is recorded.
    keys: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        return sum(t.num_rows for t in self.tables)

    def recorded_provenance(self) -> list[tuple[list[dict[str, Any]] | None, int, int]]:
        """Each shard's provenance runs with its rows and tokens (:func:`draftline.core.provenance.mix`); runs None
        where none is recorded (a legacy or foreign base, a shard written before provenance was)."""
        if self.meta is None:
            # Counted from the tokens: a legacy base may lack num_tokens.
            return [(None, t.num_rows, int(pc.sum(pc.list_value_length(t.column("input_ids"))).as_py() or 0))
                    for t in self.tables]
        return [(s.provenance, s.num_rows, s.num_tokens) for s in self.meta.shards]

    def row_provenance(self) -> list[str | None]:
        """Every row's encoded provenance, in row order (None where not recorded)."""
        return [p for runs, rows, _ in self.recorded_provenance() for p in provenance.per_row(runs, rows)]


def open_part(
    folder: str | os.PathLike, where: str, legacy_ok: bool, drop_columns: list[str], vocab_size: int | None
) -> Part:
    """Open a ``save_to_disk`` folder without reading it (Arrow memory maps) and check its columns and values; a
    base in another trainer's format (:mod:`draftline.merge.foreign`) is read as a legacy base."""
    folder = Path(folder)
    if (folder / "dataset_dict.json").is_file():
        raise MergeGuardError(f"{where} is a DatasetDict: point at one of its splits (e.g. {folder / 'train'})")
    claim = export_claim(folder) if legacy_ok and folder.is_dir() else None
    kind = foreign_format(folder, claim) if legacy_ok and folder.is_dir() else None
    if kind is not None:
        tables = read_foreign(folder, kind, where)
        plan = plan_casts(tables[0].schema, where, True, drop_columns)
        for t in tables:
            check_values(t, plan, where, vocab_size)
            fmt.drop_pages(t)
        return Part(folder, where, None, [], tables, plan, "", kind, claim["tokenizer_fingerprint"] if claim else None)
    if not (folder / "state.json").is_file():
        raise MissingInput(f"{where} has no state.json: not a datasets save_to_disk folder")
    if not legacy_ok and not (folder / fmt.META_FILE).is_file():
        fmt.read_meta(folder)  # raises its clear "not a draftline dataset" error
    meta, files = fmt.verified_shard_files(folder)
    if meta is not None:
        check_recorded_ids(meta, where, vocab_size)
    fingerprint = json.loads((folder / "state.json").read_text(encoding="utf-8")).get("_fingerprint") or ""
    tables = fmt.mapped_shards(folder, files)
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
            fmt.drop_pages(t)  # every pass over a base to rewrite leaves its pages: resident would be the whole base
    keys = fmt.read_keys(folder, meta) if meta is not None else None
    return Part(folder, where, meta, files, tables, plan, fingerprint, keys=keys)


def check_recorded_ids(meta: fmt.DatasetMeta, where: str, vocab_size: int | None) -> None:
    """A draftline dataset's token ids against the target's vocabulary, from the ranges its shards record: the
    check :func:`check_values` makes on a legacy base, at no cost (a draftline base is never rescanned)."""
    for s in meta.shards:
        if vocab_size and s.token_id_max is not None and (s.token_id_max >= vocab_size or s.token_id_min < 0):
            raise MergeGuardError(f"{where}/{s.filename} holds token ids in [{s.token_id_min}, {s.token_id_max}], "
                                  f"outside the target's vocabulary [0, {vocab_size - 1}]: made with another tokenizer?")


def shard_info(table: pa.Table, path: Path, recorded: fmt.ShardInfo | None) -> fmt.ShardInfo:
    """The info of a carried shard: its source's verified record when it has one (so nothing is hashed again),
    else counted and hashed here."""
    if recorded is not None and recorded.xxh3_128 is not None:
        return fmt.ShardInfo(**{**asdict(recorded), "filename": path.name})
    return fmt.ShardInfo.of(table, path)


def prompt_keys_of(part: Part, table: pa.Table) -> np.ndarray:
    """The prompt keys of a part's rows (``table``: its shards as one table): recorded, or else (shards written
    before keys were recorded) hashed here, a piece at a time."""
    return part.keys if part.keys is not None else fmt.prompt_key_digests(table)


def _key_array(digests: np.ndarray) -> pa.Array:
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(fmt.KEY_BYTES), len(digests), [None, pa.py_buffer(digests)])


def find_overlap(base_ids: pa.ChunkedArray, base_keys: np.ndarray, new_ids: pa.ChunkedArray,
                 new_keys: np.ndarray) -> dict[str, np.ndarray]:
    """Which new rows' prompts the base already holds: ``{"by_id": bool[], "by_prompt": bool[]}``.

    Rows are matched on ``id`` (the prompt stage's content id). Legacy base rows have no such id, so they are
    matched on their prompt keys (``base_keys``: hashed once for a legacy base being converted, else read from
    the ids that converted legacy rows carry, see ``PROMPT_KEY_PREFIX``) against the new rows' (``new_keys``,
    recorded by the tokenize stage): 16 bytes a row on either side, never a token.
    """
    # The hash table holds the new ids and the base's are looked up in it: 4x faster than hashing the base.
    found = base_ids.filter(pc.is_in(base_ids, value_set=new_ids.combine_chunks()))
    by_id = pc.is_in(new_ids, value_set=found.combine_chunks()).to_numpy(zero_copy_only=False)
    by_prompt = np.zeros(len(new_ids), dtype=bool)
    if len(base_keys) and len(new_ids):
        found = pc.is_in(_key_array(new_keys), value_set=_key_array(base_keys))
        by_prompt = found.to_numpy(zero_copy_only=False) & ~by_id
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
