"""The ``merge`` stage: an existing training set (``merge.base``) + the new tokenized rows -> the merged set.

The merged folder is a ``save_to_disk`` folder whose first shards are the base's own shard files, carried
byte-identical (:mod:`draftline.merge.carry`: reflink, hardlink or copy), and whose last shards hold the new
rows; DVC stores files by content, so its cache grows by the new shards alone and the previous version stays
restorable (``git checkout`` + ``dvc checkout``). The guards of :mod:`draftline.merge.guards` run before
anything is published, and new rows whose prompt the base already holds are dropped and counted. Base rows that give
away an evaluation prompt are counted and, under ``decontaminate.base: drop``, left out
(:mod:`draftline.merge.contamination`): a base shard without such a row is still carried byte-identical, one with
one is written anew with its other rows. Training order is a seeded permutation in ``order.npy``, not a shuffled
copy.

Every row keeps how it was made (the target's model fingerprint, the engine, the sampling, the thinking mode:
:mod:`draftline.core.provenance`, recorded per shard in ``draftline.json`` and carried with it); rows of another
target model are refused unless ``merge.allow_other_target``, and the report gives the mix of each across the base,
the new rows and the merged set (rows that recorded none: ``unknown``).

The merged folder's ``mix.json`` records every shard's content mix (domain and language counts, by the shard's
checksum: :mod:`draftline.core.mix`); carried shards keep their entries, so the next round, and the prompt stage
aiming ``blend.target_mix`` at it, read the mix without decoding a token. The report, the metrics (``mix``: each
domain's share of rows) and ``plots/merge_mix.csv`` give the base's, the new rows' and the merged set's mix.

A merge costs what the new data costs: the base is never read whole. Its ids, counts and sources are read from
the memory-mapped shards (a few bytes per row), its shards are linked rather than copied where that is safe,
the merged folder's fingerprint is derived from the base's instead of rehashing it, and the re-encode check
(whose tokenizer load is the one fixed cost) runs in a child process while the new shards are written.
"""

from __future__ import annotations

import time
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
from draftline.core import provenance
from draftline.core.classify import DOMAINS
from draftline.core.errors import MissingInput
from draftline.core.files import atomic_path, write_csv
from draftline.core.fingerprint import tokenizer_fingerprint
from draftline.core.logs import get_logger
from draftline.core.mix import Mix, folder_mix, num_tokens_of, shares, tables_mix, write_record
from draftline.core.records import TargetInfo
from draftline.core.runner import StageArgs, StageRun
from draftline.core.skips import Skips
from draftline.core.target_loader import load_target, load_tokenizer
from draftline.core.tracked import require_tracked
from draftline.merge.carry import Carrier, make_read_only
from draftline.merge.contamination import BaseContamination, check_base_rows, evaluation_prompts
from draftline.merge.guards import (
    REMAKE_BASE,
    Claim,
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
    claim = None
    if base.meta is None and base.claimed_fingerprint is not None:
        claim = Claim("export.json", base.claimed_fingerprint, f"merge.base ({params.base}) was made, says its "
                      "export.json, with")
    elif base.meta is None and params.base_tokenizer:
        # A wrong tokenizer named is as likely as a base of another one, so the fix covers both.
        claim = Claim("base_tokenizer", _fingerprint_of(params.base_tokenizer),
                      f"merge.base_tokenizer ({params.base_tokenizer}), named as the maker of merge.base ({params.base}),"
                      " has", f"{REMAKE_BASE}; if the target's tokenizer made the base, set merge.base_tokenizer: null "
                      "and merge.assume_same_tokenizer: true (the re-encode check still runs)")
    return check_tokenizer_claim(base.meta, new_meta, claim, params.assume_same_tokenizer, params.base)


def _fingerprint_of(tokenizer: str) -> str:
    """The fingerprint of the tokenizer folder ``merge.base_tokenizer`` names (files + the template it uses)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    try:
        return tokenizer_fingerprint(tokenizer, tok.chat_template)
    except ValueError as e:
        raise MergeGuardError(f"merge.base_tokenizer {tokenizer}: {e}") from None


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
    tmp: Path, base: Part | None, legacy_keys: np.ndarray | None, base_drop: np.ndarray, new: Part, kept: pa.Table,
    drop: np.ndarray, carrier: Carrier,
) -> tuple[list[fmt.ShardInfo], list[pa.Table]]:
    """Stage the base's shards less its ``base_drop`` rows, then the new rows' (``kept``: those not in ``drop``), in
    ``tmp``; returns their infos (base first, each with its rows' provenance) and the base's tables as written (for
    its stats)."""
    staged: list[fmt.ShardInfo] = []
    base_tables: list[pa.Table] = []
    if base is not None and base.plan.identity:
        staged, base_tables = _carry_base(tmp, base, base_drop, carrier)
    elif base is not None:
        staged, base_tables = _rewrite_base(tmp, base, legacy_keys, base_drop)
    if kept.num_rows == new.num_rows and new.plan.identity:
        shards = tqdm(range(len(new.files)), desc="merge: carry new shards", unit=" shards")
        staged += [_carry_shard(tmp, new, i, "new", carrier) for i in shards]
    else:
        writer = fmt.ShardWriter(tmp, prefix="new")
        writer.add(kept, [p for p, dropped in zip(new.row_provenance(), drop) if not dropped])
        staged += writer.close()
    for i, s in enumerate(staged):
        fmt.rename_shard(tmp, s, fmt.shard_name(i, len(staged)))
    return staged, base_tables


def _carry_shard(tmp: Path, part: Part, i: int, tag: str, carrier: Carrier) -> fmt.ShardInfo:
    """Shard ``i`` of ``part`` (and its prompt-key sidecar) carried byte-identical into ``tmp``."""
    recorded = part.meta.shards[i] if part.meta else None
    dst = tmp / f".{tag}-{i:05d}.arrow"
    carrier.carry(part.folder / part.files[i], dst)
    if recorded is not None and recorded.keys_xxh3_128 is not None:
        carrier.carry(fmt.keys_path(part.folder / part.files[i]), fmt.keys_path(dst))
    return shard_info(part.tables[i], dst, recorded)


def _carry_base(tmp: Path, base: Part, drop: np.ndarray, carrier: Carrier) -> tuple[list[fmt.ShardInfo], list[pa.Table]]:
    """A base in the schema: each shard carried, or, where it holds a dropped row, its other rows written anew."""
    staged: list[fmt.ShardInfo] = []
    tables: list[pa.Table] = []
    made = base.row_provenance() if drop.any() else []
    start = 0
    for i, t in enumerate(tqdm(base.tables, desc="merge: carry base shards", unit=" shards")):
        gone = drop[start : start + t.num_rows]
        if not gone.any():
            staged.append(_carry_shard(tmp, base, i, "base", carrier))
            tables.append(t)
        elif not gone.all():
            writer = fmt.ShardWriter(tmp, prefix=f"base{i:05d}")
            tables.append(kept_rows(t, gone))
            writer.add(tables[-1], [m for m, g in zip(made[start : start + t.num_rows], gone) if not g])
            staged += writer.close()
        start += t.num_rows
    return staged, tables


def _rewrite_base(tmp: Path, base: Part, legacy_keys: np.ndarray | None,
                  drop: np.ndarray) -> tuple[list[fmt.ShardInfo], list[pa.Table]]:
    """A base to cast, re-cut into standard shards less its ``drop`` rows. Casts change the bytes anyway, so this is
    a one-time cost: the merged folder, the next round's base, is already in the schema and is carried from then on."""
    writer = fmt.ShardWriter(tmp, prefix="base")
    tables: list[pa.Table] = []
    start, made = 0, base.row_provenance()
    for t in tqdm(base.tables, desc="merge: rewrite base shards", unit=" shards"):
        for piece in fmt.pieces(t):  # a record batch at a time: the casts copy what they cast
            end = start + piece.num_rows
            keys = legacy_keys[start:end] if "id" in base.plan.derived else None
            cast = kept_rows(apply_casts(piece, base.plan, keys), drop[start:end])
            tables.append(cast.select(["num_tokens", "num_loss_tokens", "source"]))
            writer.add(cast, [m for m, g in zip(made[start:end], drop[start:end]) if not g])
            start = end
        fmt.drop_pages(t)
    return writer.close(), tables


def _fingerprint(base: Part | None, base_drop: np.ndarray, new: Part, drop: np.ndarray) -> str | None:
    """The merged folder's ``_fingerprint``: the key ``datasets`` names cache files inside that folder by, so it
    must tell contents apart, not hash them. The merged bytes follow from the carried base's, the new data's
    (their folders' fingerprints) and which new rows were dropped: hashing those reads no shard.
    None (hash every shard) when a base was rewritten (or lost rows) or a fingerprint is missing."""
    if base is None or not base.plan.identity or base_drop.any() or not base.fingerprint or not new.fingerprint:
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
    check_target(params, info, base)  # before the re-encode check starts its process
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
                  staged: list[fmt.ShardInfo], base_drop: np.ndarray) -> dict[str, Any]:
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
        "base_shards_carried": _clean_shards(b, base_drop) if b is not None and b.plan.identity else 0,
        # The same for the same inputs on one machine (it follows the filesystems), so a detail, not a run field.
        "carried_by": "/".join(sorted(carrier.used)) or "-",
        "shards": len(staged),
        "bytes": sum(s.num_bytes for s in staged),
    }


def _clean_shards(base: Part, drop: np.ndarray) -> int:
    """How many of the base's shards hold no ``drop`` row (those a base in the schema carries as they are)."""
    return sum(not d.any() for d in np.split(drop, np.cumsum([t.num_rows for t in base.tables])[:-1]))


def merged_mix(tmp: Path, staged: list[fmt.ShardInfo], base: Part | None, base_drop: np.ndarray, new: Part,
               drop: np.ndarray, info: TargetInfo) -> tuple[dict[str, Mix], dict[str, Any]]:
    """The content mix of every staged shard, keyed by its checksum (what ``mix.json`` records): a carried shard's
    from its source folder (its ``mix.json``, else per-row labels cached by checksum, else labelled once); a shard
    written here (a legacy base re-cut, a base shard or new rows with some dropped) summed from its rows' labels,
    which come from the same places. Returns the entries and how many shards each way gave."""
    tokenizer = _LazyTokenizer(info)
    entries: dict[str, Mix] = {}
    counts = {"shards_recorded": 0, "shards_cached": 0, "shards_labelled": 0, "rows_labelled": 0}
    base_rows = base.num_rows - int(base_drop.sum()) if base is not None else 0
    row_labels: dict[str, tuple[list[str], list[str]]] = {}
    sources = ([("base", base, bool(base.plan.identity and not base_drop.any()), base_drop)] if base is not None
               else []) + [
        ("new", new, bool(new.plan.identity and not drop.any()), drop)]
    for tag, part, carried, dropped in sources:
        if part.files:  # a save_to_disk folder: its record, the cache, or labelled (and cached) by checksum
            fm, labels = folder_mix(part.folder, tokenizer, keep_labels=not carried)
        else:  # another trainer's format (always re-cut): its rows as read
            fm, labels = tables_mix([(None, None, t) for t in part.tables], tokenizer, None, {}, keep_labels=True)
        for k in counts:
            counts[k] += getattr(fm, k.removeprefix("shards_")) if k != "rows_labelled" else fm.rows_labelled
        entries.update(fm.entries())
        if labels is not None:
            domains = [d for shard in labels for d in shard[0]]
            langs = [g for shard in labels for g in shard[1]]
            if dropped is not None:
                keep = np.flatnonzero(~dropped)
                domains, langs = [domains[i] for i in keep], [langs[i] for i in keep]
            row_labels[tag] = (domains, langs)
    out: dict[str, Mix] = {}
    start = 0
    for s in staged:
        tag = "base" if start < base_rows else "new"
        offset = start - (0 if tag == "base" else base_rows)
        if s.xxh3_128 in entries:
            out[s.xxh3_128] = entries[s.xxh3_128]
        else:
            table = fmt.mapped_shards(tmp, [s.filename])[0]
            domains, langs = row_labels[tag]
            out[s.xxh3_128] = Mix.of_labels(domains[offset : offset + s.num_rows], langs[offset : offset + s.num_rows],
                                            num_tokens_of(table))
        start += s.num_rows
    return out, counts


class _LazyTokenizer:
    """The target's tokenizer, loaded only if some shard must be decoded (a recorded base needs none)."""

    def __init__(self, info: TargetInfo):
        self.info, self.tok = info, None

    def decode_batch(self, *a: Any, **kw: Any) -> Any:
        if self.tok is None:
            self.tok = load_tokenizer(self.info).backend_tokenizer
        return self.tok.decode_batch(*a, **kw)


def mix_report(staged: list[fmt.ShardInfo], entries: dict[str, Mix], base_rows: int) -> dict[str, Any]:
    """The report's ``mix``: rows, tokens and languages of the base's shards, the new ones and the merged set, with
    each domain's share of rows and of tokens."""
    parts = {"base": Mix(), "new": Mix()}
    start = 0
    for s in staged:
        key = "base" if start < base_rows else "new"
        parts[key] = parts[key] + entries[s.xxh3_128]
        start += s.num_rows
    parts["merged"] = parts["base"] + parts["new"]
    return {k: {**m.to_dict(), "row_shares": shares(m.amounts("samples")), "token_shares": shares(m.amounts("tokens")),
                "language_shares": shares(dict(sorted(m.languages.items())))} for k, m in parts.items()}


@dataclass(frozen=True, kw_only=True)
class MergeArgs(StageArgs):
    """``stages/merge.py``'s paths (dvc.yaml passes them): the tokenize stage's folder, the target's
    ``target.json``, the merged folder written, the headline metrics and the mix plot. The base is ``merge.base``
    (a param), which must lie under ``bases``, as must ``merge.base_tokenizer``; its rows are checked against the
    benchmark sets' conversations (``sets``, where ``decontaminate.extra`` must lie too) and the prompt stage's
    held-out prompts (``heldout``, its ``eval.jsonl``)."""

    tokenized: Path
    target: Path
    out: Path
    metrics: Path
    plot: Path
    bases: Path  # where the bases and their tokenizers live (a dependency of the stage)
    sets: Path = Path()
    heldout: Path = Path()


def run_merge(p: MergeParams, args: MergeArgs, stage: StageRun) -> None:
    """The whole stage. Raises :class:`MergeGuardError`, leaving ``args.out`` as it was, when the base does not
    fit the new data."""
    require_tracked(p.base, args.bases, "merge.base")
    require_tracked(p.base_tokenizer, args.bases, "merge.base_tokenizer")
    info = load_target(args.target)
    new = open_new(p, args, info)
    new_table = pa.concat_tables(new.tables)
    base = check_base(p, info, new) if p.base else None
    contamination = decontaminate_base(p, args, base.part, info) if base else None
    base_drop = contamination.drop if contamination else np.zeros(base.part.num_rows if base else 0, bool)
    overlap = overlap_with(base, new, new_table)
    drop = overlap["by_id"] | overlap["by_prompt"]
    kept = kept_rows(new_table, drop)

    carrier = Carrier(p.carry)
    b = base.part if base else None
    with atomic_path(args.out) as tmp:
        tmp.mkdir(parents=True)
        staged, base_tables = _write_shards(tmp, b, base.legacy_keys if base else None, base_drop, new, kept, drop,
                                            carrier)
        fmt.write_folder_index(tmp, [s.filename for s in staged], _fingerprint(b, base_drop, new, drop))
        base_counts = Counts.of(base_tables) if b is not None else None
        meta = merged_meta(new, base_counts, b, staged)
        fmt.write_meta(tmp, meta)
        started = time.perf_counter()
        mix_entries, mix_counts = merged_mix(tmp, staged, b, base_drop, new, drop, info)
        write_record(tmp, mix_entries)
        stage.run["mix"] = {**mix_counts, "seconds": round(time.perf_counter() - started, 2)}
        np.save(tmp / fmt.ORDER_FILE, fmt.training_order(meta.num_rows, p.seed), allow_pickle=False)
        # The last guard: its verdict comes before the folder is published (a refusal discards it).
        reencoded = base.reencode() if base else {}
        for s in staged:
            make_read_only(tmp / s.filename)
            make_read_only(fmt.keys_path(tmp / s.filename))

    details = merge_details(base, new, kept, base_counts, overlap, reencoded, carrier, staged, base_drop)
    details["mix"] = mix_report(staged, mix_entries, b.num_rows - int(base_drop.sum()) if b else 0)
    details["provenance"] = provenance_report(b, new, staged)
    if contamination is not None:
        details["decontamination"] = contamination.report(p.decontaminate)
        stage.run["decontaminate_seconds"] = round(contamination.seconds, 2)
    _publish(stage, details, args.plot, b)
    if contamination is not None:
        stage.headline["contaminated"] = contamination.headline()
    log.info(
        "merged %d base rows (%s, %d dropped as contaminated) + %d new rows, %d of them dropped as already in the "
        "base: %d rows in %d shards (files carried by %s)",
        b.num_rows if b else 0, ("carried" if b.plan.identity else "rewritten") if b else "none",
        int(base_drop.sum()), new.num_rows, int(drop.sum()), meta.num_rows, len(staged), details["carried_by"],
    )  # fmt: skip


def open_new(p: MergeParams, args: MergeArgs, info: TargetInfo) -> Part:
    """The tokenize stage's rows, checked: tokenized with the target's tokenizer, generated by the target."""
    if not (Path(args.tokenized) / fmt.META_FILE).is_file():
        raise MissingInput(f"{Path(args.tokenized) / fmt.META_FILE} is missing: {args.tokenized} is not a tokenized "
                           "dataset; run the tokenize stage first (dvc repro tokenize)")
    new = open_part(args.tokenized, str(args.tokenized), False, [], info.vocab_size)
    if new.meta.tokenizer_fingerprint != info.tokenizer_fingerprint:
        raise MergeGuardError(
            f"{args.tokenized} was tokenized with another tokenizer than {args.target} describes: re-run tokenize"
        )
    check_target(p, info, new)
    return new


def decontaminate_base(p: MergeParams, args: MergeArgs, base: Part, info: TargetInfo) -> BaseContamination | None:
    """Check the base's rows against every evaluation prompt (:mod:`draftline.merge.contamination`); None when
    ``decontaminate`` is off (or not loaded)."""
    if p.decontaminate is None or not p.decontaminate.enabled:
        return None
    for path in p.decontaminate.extra:
        require_tracked(path, args.sets, "decontaminate.extra")
    skips = Skips(get_logger("draftline.merge.contamination"))
    prompts = evaluation_prompts(p.decontaminate, p.sets or [], args.sets, args.heldout, skips)
    return check_base_rows(base.tables, base.where, prompts, p.decontaminate,
                               load_tokenizer(info).backend_tokenizer, skips)


def _publish(stage: StageRun, details: dict[str, Any], plot: Path, b: Part | None) -> None:
    """The report, the headline metrics, the mix plot and the printed mix table."""
    stage.details.update(details)
    merged = details["merged"]
    stage.headline.update(rows=merged["samples"], tokens=merged["total_tokens"], loss_tokens=merged["loss_tokens"],
                          dropped=details["overlap"]["dropped"], base_rows=b.num_rows if b else 0,
                          mix={d: details["mix"]["merged"]["row_shares"][d] for d in DOMAINS})
    write_csv(plot, [{"domain": d, "series": k, "share": details["mix"][k]["row_shares"][d]}
                     for d in DOMAINS for k in ("base", "new", "merged")])
    print(format_mix(details["mix"]), flush=True)


def check_target(p: MergeParams, info: TargetInfo, part: Part) -> None:
    """Refuse rows generated by another target model than ``info``'s (by the model fingerprint their provenance
    records; rows that record none are unknown, not refused) unless ``merge.allow_other_target``."""
    target = provenance.model_identity(info)
    other = provenance.other_targets((runs for runs, _, _ in part.recorded_provenance()), target)
    if other and not p.allow_other_target:
        found = ", ".join(f"{n} rows of {fp[:12]}" for fp, n in sorted(other.items()))
        raise MergeGuardError(
            f"{part.where} holds rows generated by another target model ({found}); the target's model fingerprint is "
            f"{target[:12]}: a drafter learns the target it is trained on. Set merge.allow_other_target: true to "
            "merge them anyway (the report gives each target's rows and tokens)")


def provenance_report(base: Part | None, new: Part, staged: list[fmt.ShardInfo]) -> dict[str, Any]:
    """The report's ``provenance``: for the base, the new rows (before dropping overlaps) and the merged set, the
    rows and tokens per target model fingerprint, engine, sampling and thinking mode, and their shares."""
    return {"base": provenance.mix(base.recorded_provenance()) if base is not None else None,
            "new": provenance.mix(new.recorded_provenance()),
            "merged": provenance.mix((s.provenance, s.num_rows, s.num_tokens) for s in staged)}


def format_mix(mix: dict[str, Any]) -> str:
    """The printed table: rows per domain and share of rows / tokens, for base, new and merged."""
    head = ["set", *DOMAINS, "rows", "top languages"]
    body = []
    for k in ("base", "new", "merged"):
        m = mix[k]
        rows = sum(m["rows"].values())
        body.append([k, *(f"{m['rows'].get(d, 0)} ({m['row_shares'][d]:.1%})" for d in DOMAINS), str(rows),
                     ", ".join(f"{g} {x:.1%}" for g, x in sorted(m["language_shares"].items(), key=lambda kv: -kv[1])[:3])])
    cells = [head, *body]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i in (0, len(r) - 1) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in cells)
