"""Exact blending: how many rows (or tokens) each source gives, and which rows.

Whole sources are taken in full; the rest of the total is split by weight with largest-remainder (Hamilton)
rounding, a source that has less than its share gives its overflow to the others. Within a source, rows are
taken in the order of a seeded hash of their id: adding rows to a source changes the choice minimally.
Every quota is checked before anything is written; an impossible request fails with its numbers. Before any
of it, each source's held-out prompts are set aside for evaluation (``blend.eval``: dev and test quotas).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

import xxhash

from draftline.core.errors import Refusal
from draftline.core.splits import DEV, TEST, split_of
from draftline.prompts.params import BlendSource, HeldOutParams, Unit


class BlendError(Refusal, ValueError):
    """A blend that cannot be met; the message names the numbers and what to change."""


def hash_rank(seed: int, id_: str) -> int:
    """A row's place in its source's selection order: depends on the seed and its own id only."""
    return xxhash.xxh3_64_intdigest(f"{seed}:{id_}".encode("utf-8"))


def hamilton(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split ``total`` by ``weights`` into integers summing to ``total`` (largest remainder; ties by name)."""
    wsum = sum(weights.values())
    if total <= 0 or wsum <= 0:
        return {k: 0 for k in weights}
    exact = {k: total * w / wsum for k, w in weights.items()}
    out = {k: math.floor(v) for k, v in exact.items()}
    left = total - sum(out.values())
    for k in sorted(weights, key=lambda k: (-(exact[k] - out[k]), k))[:left]:
        out[k] += 1
    return out


def quotas(total: int, weights: Mapping[str, float], capacity: Mapping[str, int]) -> dict[str, int]:
    """Hamilton quotas capped at each source's capacity, the overflow redistributed over the others by weight."""
    out: dict[str, int] = {}
    active = {k: w for k, w in weights.items() if w > 0}
    remaining = total
    while active:
        share = hamilton(remaining, active)
        full = [k for k in active if share[k] >= capacity[k]]
        if not full:
            out.update(share)
            break
        for k in full:
            out[k] = capacity[k]
            remaining -= capacity[k]
            del active[k]
    return {k: out.get(k, 0) for k in weights}


@dataclass
class Pool:
    """One source's rows that survived dedup, in selection order, with their cost in the blend's unit."""

    name: str
    ids: list[str]
    costs: list[int]
    whole: bool = False
    weight: float = 0.0
    eval_ids: list[str] = field(default_factory=list)

    @property
    def capacity(self) -> int:
        return sum(self.costs)


@dataclass
class Selection:
    """The outcome per source: eval ids, train ids, and requested vs achieved in the blend's unit."""

    eval_ids: dict[str, list[str]]
    train_ids: dict[str, list[str]]
    requested: dict[str, int]
    achieved: dict[str, int]


def source_plan(names: Sequence[str], sources: Mapping[str, BlendSource]) -> dict[str, dict[str, Any]]:
    """``blend.sources`` for every source: ``{name: {whole, weight}}``; a source not listed has weight 1."""
    unknown = sorted(set(sources) - set(names))
    if unknown:
        raise BlendError(f"blend.sources names {unknown}, which are not in params.yaml: sources")
    out = {}
    for name in names:
        p = sources.get(name) or BlendSource()
        whole = bool(p.whole)
        out[name] = {"whole": whole, "weight": float(p.weight if p.weight is not None else 0.0 if whole else 1.0)}
    return out


def unweighted(names: Sequence[str], sources: Mapping[str, BlendSource]) -> list[str]:
    """The sources ``weight: 0`` leaves out of the train blend (their eval rows are still held out)."""
    return [n for n, x in source_plan(names, sources).items() if not x["whole"] and x["weight"] == 0]


def split_eval(ranked_ids: Sequence[str], held_out: HeldOutParams) -> tuple[list[str], list[str]]:
    """The held-out ids (dev, then test) and the train pool. Each split's quota is filled with the first ids of that
    split in selection order (a prompt's split is its id's: core/splits.py); the quotas shrink together so that at
    most half a source is held out and train keeps rows."""
    want = {DEV: held_out.dev, TEST: held_out.test}
    total, cap = held_out.dev + held_out.test, len(ranked_ids) // 2
    if total > cap:
        want = {DEV: held_out.dev * cap // total, TEST: cap - held_out.dev * cap // total}
    taken: dict[str, list[str]] = {DEV: [], TEST: []}
    train = []
    for id_ in ranked_ids:
        split = split_of(id_)
        (taken[split] if len(taken[split]) < want[split] else train).append(id_)
    return taken[DEV] + taken[TEST], train


def select(pools: Sequence[Pool], total: int, unit: str) -> Selection:
    """Choose train rows so that the blend holds ``total`` units (exactly for samples, within one row for tokens)."""
    if unit not in get_args(Unit):
        raise BlendError(f"blend.unit must be one of {list(get_args(Unit))}, not {unit!r}")
    if total < 0:
        raise BlendError(f"blend.total must be >= 0, not {total}")
    whole = [p for p in pools if p.whole]
    weighted = [p for p in pools if not p.whole and p.weight > 0]
    whole_sum = sum(p.capacity for p in whole)
    listing = ", ".join(f"{p.name} {p.capacity}" for p in pools)
    if whole_sum > total:
        raise BlendError(
            f"whole sources hold {whole_sum} {unit} ({', '.join(f'{p.name} {p.capacity}' for p in whole)}), "
            f"more than blend.total={total}; raise blend.total or give them a weight instead of whole: true"
        )
    rest = total - whole_sum
    cap = {p.name: p.capacity for p in weighted}
    if sum(cap.values()) < rest:
        raise BlendError(
            f"blend.total={total} {unit} but only {whole_sum + sum(cap.values())} are available after dedup and the "
            f"eval split (whole: {whole_sum}; weighted: {sum(cap.values())}; per source: {listing}); "
            f"lower blend.total or add data"
        )
    quota = quotas(rest, {p.name: p.weight for p in weighted}, cap)
    taken: dict[str, int] = {p.name: 0 for p in pools}
    count: dict[str, int] = {p.name: 0 for p in pools}
    for p in whole:
        taken[p.name], count[p.name] = p.capacity, len(p.ids)
    for p in weighted:
        # Stop at the first row that does not fit: skipping to smaller rows would favour short prompts.
        while count[p.name] < len(p.ids) and taken[p.name] + p.costs[count[p.name]] <= quota[p.name]:
            taken[p.name] += p.costs[count[p.name]]
            count[p.name] += 1
    # Token quotas leave each source short by less than one row; top up from the source furthest below its quota.
    achieved = sum(taken.values())
    while achieved < total:
        open_ = [p for p in weighted if count[p.name] < len(p.ids)]
        p = min(open_, key=lambda p: (taken[p.name] - quota[p.name], p.name))
        taken[p.name] += p.costs[count[p.name]]
        count[p.name] += 1
        achieved += p.costs[count[p.name] - 1]
    requested = {p.name: p.capacity if p.whole else quota.get(p.name, 0) for p in pools}
    return Selection(
        eval_ids={p.name: p.eval_ids for p in pools},
        train_ids={p.name: p.ids[: count[p.name]] for p in pools},
        requested=requested,
        achieved=taken,
    )
