"""The checks a merge makes before it writes anything: the base's rows must be made with the target's tokenizer,
and its columns must cast to the draftline schema without losing or changing a value.

A wrong tokenizer does not crash training: every token id silently means another token. So a base is accepted
only on evidence (its ``draftline.json`` fingerprint, or for a legacy folder the tokenizer it names) and the
evidence is then tested: a sample of its rows must decode and re-encode to the same ids under the target's
tokenizer, which no other vocabulary survives.

Whatever reads tokens here reads them a piece at a time (:func:`draftline.core.dataset.pieces`): memory stays
bounded by a piece, never by a shard or by the new data (numpy copies of every token cost ~19 bytes a token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from draftline.core.dataset import KEY_BYTES, SCHEMA, build_table, flat_tokens, pieces, prompt_key_digests
from draftline.core.errors import Refusal

# Ids given to legacy rows that had none: the hash of their prompt tokens, so a later round can still match
# new rows against them (merge.parts.find_overlap looks for this prefix).
PROMPT_KEY_PREFIX = "prompt-xxh3:"
# The source recorded for legacy rows that carry no `source` column.
LEGACY_SOURCE = "legacy"
_INT32_MAX = np.iinfo(np.int32).max


class MergeGuardError(Refusal, ValueError):
    """A base that must not be merged: the message says which guard fired and what to change."""


@dataclass
class CastPlan:
    """How one dataset's columns become :data:`draftline.core.dataset.SCHEMA`, decided from its schema alone."""

    # column -> "int64 -> int32" for every column whose type changes.
    casts: dict[str, str] = field(default_factory=dict)
    # Columns the base lacks and that are derived from its tokens (id, source, counts).
    derived: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    @property
    def identity(self) -> bool:
        """True when the shards already have the schema: they can be carried byte-identical."""
        return not (self.casts or self.derived or self.dropped)


def plan_casts(schema: pa.Schema, where: str, legacy: bool, drop_columns: list[str]) -> CastPlan:
    """Decide the safe cast of every column, or refuse naming the column.

    Safe means no value can change: integer ids to int32 (their range is checked on the data later), an
    integer or bool mask to bool (0/1 checked later), large strings to strings. A draftline dataset must hold
    every column; a legacy one may lack ``id``, ``source`` and the counts, which are derived from its tokens.
    """
    plan = CastPlan()
    names = set(schema.names)
    for name in schema.names:
        if name not in SCHEMA.names:
            if name in drop_columns:
                plan.dropped.append(name)
                continue
            raise MergeGuardError(
                f"{where}: column {name!r} is not part of the draftline schema {SCHEMA.names}; "
                f"add it to merge.drop_columns to drop it"
            )
        have, want = schema.field(name).type, SCHEMA.field(name).type
        if have == want:
            continue
        if name in ("input_ids", "loss_mask"):
            inner = have.value_type if (pat.is_list(have) or pat.is_large_list(have)) else None
            ok = inner is not None and (pat.is_integer(inner) or (name == "loss_mask" and pat.is_boolean(inner)))
        elif name in ("id", "source"):
            ok = pat.is_large_string(have)
        else:  # num_tokens, num_loss_tokens: recomputed from the tokens, so any integer type will do
            ok = pat.is_integer(have)
        if not ok:
            raise MergeGuardError(
                f"{where}: column {name!r} has type {have}, which does not cast safely to {want}; "
                f"convert it (or re-tokenize the base) before merging"
            )
        plan.casts[name] = f"{have} -> {want}"
    for name in ("input_ids", "loss_mask"):
        if name not in names:
            raise MergeGuardError(f"{where}: column {name!r} is missing; a tokenized dataset needs input_ids and loss_mask")
    for name in ("id", "source", "num_tokens", "num_loss_tokens"):
        if name not in names:
            if not legacy:
                raise MergeGuardError(f"{where}: column {name!r} is missing although the folder has a draftline.json")
            plan.derived.append(name)
    return plan


def check_values(table: pa.Table, plan: CastPlan, where: str, vocab_size: int | None) -> None:
    """Check on the data what :func:`plan_casts` assumed: ids in int32 range (and in the vocabulary when it is
    known), a mask of 0/1 as long as its row, no missing values. Refuses naming the column."""
    ids = table.column("input_ids")
    mask = table.column("loss_mask")
    for name, col in (("input_ids", ids), ("loss_mask", mask)):
        if col.null_count or pc.list_flatten(col).null_count:
            raise MergeGuardError(f"{where}: column {name!r} has missing values")
    flat = pc.list_flatten(ids)
    if len(flat):
        lo, hi = pc.min_max(flat).values()
        lo, hi = lo.as_py(), hi.as_py()
        limit = min(_INT32_MAX, vocab_size - 1) if vocab_size else _INT32_MAX
        if lo < 0 or hi > limit:
            raise MergeGuardError(
                f"{where}: column 'input_ids' holds ids in [{lo}, {hi}], outside [0, {limit}]"
                + (" (the target's vocabulary): made with another tokenizer?" if vocab_size else " (int32)")
            )
    if "loss_mask" in plan.casts:
        values = pc.list_flatten(mask)
        if not pat.is_boolean(values.type) and len(values):
            lo, hi = (v.as_py() for v in pc.min_max(values).values())
            if lo < 0 or hi > 1:
                raise MergeGuardError(f"{where}: column 'loss_mask' holds values in [{lo}, {hi}]; only 0/1 cast to bool")
    if len(table) and not pc.all(pc.equal(pc.list_value_length(ids), pc.list_value_length(mask))).as_py():
        raise MergeGuardError(f"{where}: columns 'input_ids' and 'loss_mask' differ in length on some rows")
    for name in ("id", "source"):
        if name in table.column_names and table.column(name).null_count:
            raise MergeGuardError(f"{where}: column {name!r} has missing values")
    for piece in pieces(table):
        offsets, _, flat_mask = flat_tokens(piece)
        cum_loss = np.concatenate([[0], np.cumsum(flat_mask, dtype=np.int64)])
        for name, counts in (("num_tokens", np.diff(offsets)), ("num_loss_tokens", np.diff(cum_loss[offsets]))):
            if name in piece.column_names and not np.array_equal(piece.column(name).to_numpy(), counts):
                raise MergeGuardError(f"{where}: column {name!r} disagrees with the tokens it counts; drop it or fix it")


def legacy_ids(digests: np.ndarray) -> list[str]:
    """The ids legacy rows without one get: :data:`PROMPT_KEY_PREFIX` + the hex of their prompt key."""
    return [PROMPT_KEY_PREFIX + d.tobytes().hex() for d in digests]


def recorded_digests(ids: pa.ChunkedArray) -> np.ndarray:
    """The prompt keys of the rows whose id is one (legacy rows converted in an earlier round), ``(k, 16)``
    uint8, chunk by chunk: read from the ids the shards record, never by hashing a token."""
    parts = [np.zeros((0, KEY_BYTES), np.uint8)]
    for chunk in ids.chunks:
        keyed = chunk.filter(pc.starts_with(chunk, PROMPT_KEY_PREFIX))
        if len(keyed):
            hexes = pc.utf8_slice_codeunits(keyed, len(PROMPT_KEY_PREFIX)).to_pylist()
            parts.append(np.frombuffer(bytes.fromhex("".join(hexes)), np.uint8).reshape(-1, KEY_BYTES))
    return np.concatenate(parts)


def apply_casts(table: pa.Table, plan: CastPlan, digests: np.ndarray | None = None) -> pa.Table:
    """The table in the draftline schema (after :func:`check_values` passed). A legacy table without ids gets
    :func:`legacy_ids` of its prompt keys (pass ``digests`` when they are already computed); without sources,
    ``legacy``."""
    if plan.identity:
        return table
    offsets, tokens, mask = flat_tokens(table)
    if "id" in plan.derived:
        ids = legacy_ids(digests if digests is not None else prompt_key_digests(table))
    else:
        ids = table.column("id").to_pylist()
    sources = [LEGACY_SOURCE] * len(table) if "source" in plan.derived else table.column("source").to_pylist()
    return build_table(ids, sources, offsets, tokens, mask)


# The fix for a base of another tokenizer: its ids cannot be translated, only remade from its text.
REMAKE_BASE = "set merge.base to a set tokenized with the target, or tokenize the base's conversations with it"


@dataclass(frozen=True)
class Claim:
    """What says which tokenizer made a base that has no ``draftline.json``: ``by`` (the report's
    ``tokenizer_claim``: export.json or base_tokenizer), the fingerprint it gives, and, for its refusal, the
    ``subject`` that names the param and what says so, and the ``fix``."""

    by: str
    fingerprint: str
    subject: str
    fix: str = REMAKE_BASE


def check_fingerprint(subject: str, claimed: str, target: str, fix: str = REMAKE_BASE) -> None:
    """Refuse a base whose tokenizer fingerprint, as ``subject`` (the param, what says so) gives it, is not the
    target's: one line naming both fingerprints (12 hex digits, as every lineage refusal gives them) and the fix."""
    if claimed != target:
        raise MergeGuardError(f"params.yaml: {subject} tokenizer fingerprint {claimed[:12]}, the target's is "
                              f"{target[:12]}: the base's token ids mean other tokens under the target; {fix}")


def check_tokenizer_claim(
    base_meta: Any | None, new_meta: Any, claim: Claim | None, assume_same_tokenizer: bool, base: str
) -> str:
    """Decide whether the base (``merge.base``: ``base``) may claim the new data's tokenizer, which is the
    target's (the stage refuses new data of another before any base is opened); return how the claim was made.

    ``base_meta`` is the base's :class:`DatasetMeta` (None without ``draftline.json``): its tokenizer fingerprint,
    then every other compatibility field, must match the new data's. A base without one needs a ``claim`` (its
    ``export.json``, or ``merge.base_tokenizer``) of the target's fingerprint, or ``merge.assume_same_tokenizer``.
    """
    where = f"merge.base {base}"
    if base_meta is not None:
        check_fingerprint(f"merge.base ({base}) was made, says its draftline.json, with", base_meta.tokenizer_fingerprint,
                          new_meta.tokenizer_fingerprint)
        try:
            base_meta.check_compatible(new_meta, what=f"the base {where} and the new data")
        except ValueError as e:
            raise MergeGuardError(str(e)) from None
        return "draftline.json"
    if claim is not None:
        check_fingerprint(claim.subject, claim.fingerprint, new_meta.tokenizer_fingerprint, claim.fix)
        return claim.by
    if assume_same_tokenizer:
        return "assumed"
    raise MergeGuardError(
        f"the base {where} has no draftline.json, so nothing says which tokenizer made it; set merge.base_tokenizer "
        "to the tokenizer folder it was made with, or merge.assume_same_tokenizer: true if it was the target's"
    )


def check_reencoded(matched: int, checked: int, min_match: float, where: str) -> dict[str, int]:
    """Judge the re-encode check (:mod:`draftline.merge.reencode`): ``matched`` of ``checked`` sampled base rows
    decoded and re-encoded to the same ids under the target's tokenizer.

    Rows cut mid-character (truncated) or tokenized in pieces (legacy pipelines drift on ~2% of rows) may not
    round-trip under the right tokenizer either, hence a match fraction rather than all; a wrong vocabulary
    matches almost none.
    """
    if matched < min_match * checked:
        raise MergeGuardError(
            f"the base {where}: only {matched} of {checked} sampled rows decode and re-encode to the same ids "
            f"under the target's tokenizer (merge.check_min_match is {min_match}): the base was made with another "
            "tokenizer; re-tokenize it with the target instead of merging it"
        )
    return {"checked": checked, "matched": matched}
