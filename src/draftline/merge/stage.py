"""The ``merge`` stage: an existing training set (``merge.base``) + the new tokenized rows -> the merged set.

The merged folder is a ``save_to_disk`` folder whose first shards are the base's own shard files, carried
byte-identical (:mod:`draftline.merge.carry`: reflink, hardlink or copy), and whose last shards hold the new
rows; DVC stores files by content, so its cache grows by the new shards alone and the previous version stays
restorable (``git checkout`` + ``dvc checkout``). The guards of :mod:`draftline.merge.guards` run before
anything is published, and new rows whose prompt the base already holds are dropped and counted. Training order
is a seeded permutation in ``order.npy``, not a shuffled copy.

A merge costs what the new data costs: the base is never read whole. Its ids, counts and sources are read from
the memory-mapped shards (a few bytes per row), its shards are linked rather than copied where that is safe,
the merged folder's fingerprint is derived from the base's instead of rehashing it, and the re-encode check
(whose tokenizer load is the one fixed cost) runs in a child process while the new shards are written.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash
from tqdm import tqdm

from draftline.core import dataset as fmt
from draftline.core.errors import MissingInput
from draftline.core.files import atomic_path
from draftline.core.fingerprint import tokenizer_fingerprint
from draftline.core.logs import get_logger
from draftline.core.records import TargetInfo
from draftline.core.runner import StageArgs, StageRun
from draftline.core.target import load_target, load_tokenizer
from draftline.merge.carry import Carrier, make_read_only
from draftline.merge.guards import (
    MergeGuardError,
    apply_casts,
    check_reencoded,
    check_tokenizer_claim,
    recorded_digests,
)
from draftline.merge.params import MergeParams
from draftline.merge.parts import Counts, Part, find_overlap, kept_rows, open_part, prompt_keys_of, shard_info, stats_of
from draftline.merge.reencode import count_round_trips, start_check

log = get_logger(__name__)


def _check_claim(params: MergeParams, base: Part, new_meta: fmt.DatasetMeta) -> str:
    """The base's tokenizer claim (see :func:`draftline.merge.guards.check_tokenizer_claim`); returns how it was made:
    its draftline.json, the export.json of a base in another trainer's format, merge.base_tokenizer, or assumed."""
    if base.meta is None and base.claimed_fingerprint is not None:
        return check_tokenizer_claim(None, new_meta, base.claimed_fingerprint, False, base.where, "export.json")
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
    tmp: Path, base: Part | None, legacy_keys: np.ndarray | None, new: Part, kept: pa.Table, carrier: Carrier
) -> tuple[list[fmt.ShardInfo], list[pa.Table]]:
    """Stage the base's shards, then the new rows', in ``tmp``; returns their infos (base first) and the
    base's tables as written (for its stats)."""
    staged: list[fmt.ShardInfo] = []
    base_tables: list[pa.Table] = []

    def carry(part: Part, tag: str) -> None:
        recorded = part.meta.shards if part.meta else [None] * len(part.files)
        shards = tqdm(zip(part.files, part.tables, recorded), desc=f"merge: carry {tag} shards", unit=" shards",
                      total=len(part.files))
        for i, (f, t, r) in enumerate(shards):
            dst = tmp / f".{tag}-{i:05d}.arrow"
            carrier.carry(part.folder / f, dst)
            if r is not None and r.keys_xxh3_128 is not None:
                carrier.carry(fmt.keys_path(part.folder / f), fmt.keys_path(dst))
            staged.append(shard_info(t, dst, r))

    if base is not None and base.plan.identity:
        carry(base, "base")
        base_tables = base.tables
    elif base is not None:
        # Casts change the bytes anyway, so the base is re-cut into standard shards (a one-time cost: the
        # merged folder, the next round's base, is already in the schema and is carried from then on).
        writer = fmt.ShardWriter(tmp, prefix="base")
        start = 0
        for t in tqdm(base.tables, desc="merge: rewrite base shards", unit=" shards"):
            for piece in fmt.pieces(t):  # a record batch at a time: the casts copy what they cast
                keys = legacy_keys[start : start + piece.num_rows] if "id" in base.plan.derived else None
                start += piece.num_rows
                cast = apply_casts(piece, base.plan, keys)
                base_tables.append(cast.select(["num_tokens", "num_loss_tokens", "source"]))
                writer.add(cast)
            fmt.drop_pages(t)
        staged += writer.close()
    if kept.num_rows == new.num_rows and new.plan.identity:
        carry(new, "new")
    else:
        writer = fmt.ShardWriter(tmp, prefix="new")
        writer.add(kept)
        staged += writer.close()
    for i, s in enumerate(staged):
        fmt.rename_shard(tmp, s, fmt.shard_name(i, len(staged)))
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


@dataclass
class BaseCheck:
    """The base opened and judged: its claim, the pending re-encode verdict, and the prompt keys of its legacy
    rows, (rows, 16) uint8: hashed once from a legacy base's tokens (they become its rows' ids), or read from the
    ids of rows converted in an earlier round."""

    part: Part
    claim: str
    reencode: Callable[[], dict]
    legacy_keys: np.ndarray


def check_base(params: MergeParams, info: TargetInfo, new: Part) -> BaseCheck:
    """Open ``merge.base`` and run every guard that can run before writing (the re-encode verdict may follow)."""
    base = open_part(params.base, f"merge.base {params.base}", True, params.drop_columns, info.vocab_size)
    claim = _check_claim(params, base, new.meta)
    reencode = _start_reencode(params, base, info)
    if not base.plan.identity:  # a base to rewrite whole: know the verdict before spending that
        verdict = reencode()
        reencode = lambda: verdict  # noqa: E731
    if base.meta is None:
        digests = []
        for t in base.tables:
            digests.append(fmt.prompt_key_digests(t))
            fmt.drop_pages(t)
        legacy_keys = np.concatenate(digests)
    else:
        legacy_keys = recorded_digests(base_ids(base))
    return BaseCheck(base, claim, reencode, legacy_keys)


def base_ids(base: Part) -> pa.ChunkedArray:
    """The ``id`` column of every base shard that has one, as one chunked array (memory-mapped)."""
    chunks = [c for t in base.tables if "id" in t.column_names for c in t.column("id").cast(pa.string()).chunks]
    return pa.chunked_array(chunks, pa.string())


def overlap_with(base: BaseCheck | None, new: Part, new_table: pa.Table) -> dict[str, np.ndarray]:
    """Which new rows the base already holds (see :func:`find_overlap`); none without a base."""
    if base is None:
        none = np.zeros(new_table.num_rows, dtype=bool)
        return {"by_id": none, "by_prompt": none}
    new_keys = prompt_keys_of(new, new_table) if len(base.legacy_keys) else np.zeros((0, fmt.KEY_BYTES), np.uint8)
    return find_overlap(base_ids(base.part), base.legacy_keys, new_table.column("id"), new_keys)


def merged_meta(new: Part, base_counts: Counts | None, base: Part | None, staged: list[fmt.ShardInfo]) -> fmt.DatasetMeta:
    """The merged folder's ``draftline.json``: the new data's compatibility fields, the longer ``max_len``."""
    meta = fmt.DatasetMeta(**{k: getattr(new.meta, k) for k in fmt.COMPAT_FIELDS}, max_len=new.meta.max_len)
    if base_counts is not None and len(base_counts.num_tokens):
        meta.max_len = max(meta.max_len, base.meta.max_len if base.meta else int(base_counts.num_tokens.max()))
    meta.set_shards(staged)
    return meta


def merge_details(base: BaseCheck | None, new: Part, kept: pa.Table, base_counts: Counts | None,
                  overlap: dict[str, np.ndarray], reencoded: dict, carrier: Carrier,
                  staged: list[fmt.ShardInfo]) -> dict[str, Any]:
    """The report: stats of base, new and merged, the overlap, the guards' verdicts, how the shards were carried."""
    b = base.part if base else None
    kept_counts = Counts.of([kept])
    drop = overlap["by_id"] | overlap["by_prompt"]
    return {
        "base": stats_of([base_counts]) if base_counts is not None else None,
        "new": stats_of([Counts.of(new.tables)]),
        "merged": stats_of([base_counts, kept_counts] if base_counts is not None else [kept_counts]),
        "overlap": {
            "new_rows": new.num_rows,
            "dropped": int(drop.sum()),
            "dropped_by_id": int(overlap["by_id"].sum()),
            "dropped_by_prompt_tokens": int(overlap["by_prompt"].sum()),
            "kept": kept.num_rows,
        },
        "guards": {
            "base_kind": "none" if b is None else ("draftline" if b.meta else b.foreign or "legacy"),
            **({"tokenizer_claim": base.claim, "reencode": reencoded} if base is not None else {}),
            "casts": b.plan.casts if b else {},
            "derived_columns": b.plan.derived if b else [],
            "dropped_columns": b.plan.dropped if b else [],
        },
        "base_shards_carried": len(b.files) if b is not None and b.plan.identity else 0,
        # The same for the same inputs on one machine (it follows the filesystems), so a detail, not a run field.
        "carried_by": "/".join(sorted(carrier.used)) or "-",
        "shards": len(staged),
        "bytes": sum(s.num_bytes for s in staged),
    }


@dataclass(frozen=True, kw_only=True)
class MergeArgs(StageArgs):
    """``stages/merge.py``'s paths (dvc.yaml passes them): the tokenize stage's folder, the target's
    ``target.json``, the merged folder written and the headline metrics. The base is ``merge.base`` (a param)."""

    tokenized: Path
    target: Path
    out: Path
    metrics: Path


def run_merge(p: MergeParams, args: MergeArgs, stage: StageRun) -> None:
    """The whole stage. Raises :class:`MergeGuardError`, leaving ``args.out`` as it was, when the base does not
    fit the new data."""
    info = load_target(args.target)
    if not (Path(args.tokenized) / fmt.META_FILE).is_file():
        raise MissingInput(f"{Path(args.tokenized) / fmt.META_FILE} is missing: {args.tokenized} is not a tokenized "
                           "dataset; run the tokenize stage first (dvc repro tokenize)")
    new = open_part(args.tokenized, str(args.tokenized), False, [], info.vocab_size)
    if new.meta.tokenizer_fingerprint != info.tokenizer_fingerprint:
        raise MergeGuardError(
            f"{args.tokenized} was tokenized with another tokenizer than {args.target} describes: re-run tokenize"
        )
    new_table = pa.concat_tables(new.tables)
    base = check_base(p, info, new) if p.base else None
    overlap = overlap_with(base, new, new_table)
    drop = overlap["by_id"] | overlap["by_prompt"]
    kept = kept_rows(new_table, drop)

    carrier = Carrier(p.carry)
    b = base.part if base else None
    with atomic_path(args.out) as tmp:
        tmp.mkdir(parents=True)
        staged, base_tables = _write_shards(tmp, b, base.legacy_keys if base else None, new, kept, carrier)
        fmt.write_folder_index(tmp, [s.filename for s in staged], _fingerprint(b, new, drop))
        base_counts = Counts.of(base_tables) if b is not None else None
        meta = merged_meta(new, base_counts, b, staged)
        fmt.write_meta(tmp, meta)
        np.save(tmp / fmt.ORDER_FILE, fmt.training_order(meta.num_rows, p.seed), allow_pickle=False)
        # The last guard: its verdict comes before the folder is published (a refusal discards it).
        reencoded = base.reencode() if base else {}
        for s in staged:
            make_read_only(tmp / s.filename)
            make_read_only(fmt.keys_path(tmp / s.filename))

    details = merge_details(base, new, kept, base_counts, overlap, reencoded, carrier, staged)
    stage.details.update(details)
    merged = details["merged"]
    stage.headline.update(rows=merged["samples"], tokens=merged["total_tokens"], loss_tokens=merged["loss_tokens"],
                          dropped=details["overlap"]["dropped"], base_rows=b.num_rows if b else 0)
    log.info(
        "merged %d base rows (%s) + %d new rows, %d of them dropped as already in the base: %d rows in %d shards "
        "(files carried by %s)",
        b.num_rows if b else 0, ("carried" if b.plan.identity else "rewritten") if b else "none",
        new.num_rows, int(drop.sum()), meta.num_rows, len(staged), details["carried_by"],
    )  # fmt: skip
