"""Aiming the merged set (base + new rows) at ``blend.target_mix``, and the ``blend.max_domain_share`` guard.

The merged set's share of domain d is ``(base_d + new_d) / (base + total)``, in ``blend.unit`` (samples: rows;
tokens: the base's recorded tokens per row, the new rows' prompt + reference estimate). So the new amounts that meet
a target exactly are ``x_d = target_d * (base + total) - base_d``; they are feasible when every ``x_d`` lies
between what the ``whole: true`` sources bring of d (taken in full, so a floor) and what all sources with a non-zero
weight hold of d after dedup and the eval split (a cap). Otherwise the closest achievable mix (least squares over
the shares) is ``clip(x_d + lambda, floor_d, cap_d)`` with the one ``lambda`` that makes them sum to ``total``, and
the request is refused with it before anything is written (:class:`~draftline.prompts.blend.BlendError`).

Within a domain, the per-source params keep their meaning: whole sources give every row they have of it, and the
weighted sources share the rest of the domain's amount by weight (Hamilton rounding, a source short of rows in
that domain gives its overflow to the others; :func:`draftline.prompts.blend.select`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from draftline.core.classify import DOMAINS
from draftline.prompts.blend import BlendError, Pool, Selection, select
from draftline.prompts.params import BlendParams


def _fmt(shares: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{d}: {shares[d]:.3f}" for d in DOMAINS) + "}"


def project(x: Mapping[str, float], floor: Mapping[str, int], cap: Mapping[str, int], total: int) -> dict[str, float]:
    """``clip(x_d + lam, floor_d, cap_d)`` summing to ``total`` (requires sum(floor) <= total <= sum(cap))."""
    def at(lam: float) -> dict[str, float]:
        return {d: min(max(x[d] + lam, floor[d]), cap[d]) for d in DOMAINS}

    lo, hi = -float(total + sum(abs(v) for v in x.values()) + 1), float(total + sum(abs(v) for v in x.values()) + 1)
    for _ in range(200):
        mid = (lo + hi) / 2
        if sum(at(mid).values()) < total:
            lo = mid
        else:
            hi = mid
    return at(hi)


def integer_amounts(y: Mapping[str, float], floor: Mapping[str, int], cap: Mapping[str, int], total: int) -> dict[str, int]:
    """Whole amounts summing to ``total`` within [floor, cap], the remainders given by largest fraction (then name)."""
    out = {d: max(floor[d], min(cap[d], math.floor(y[d] + 1e-9))) for d in DOMAINS}
    left = total - sum(out.values())
    order = sorted(DOMAINS, key=lambda d: (-(y[d] - math.floor(y[d] + 1e-9)), d))
    while left > 0:
        moved = False
        for d in order:
            if left and out[d] < cap[d]:
                out[d] += 1
                left -= 1
                moved = True
        if not moved:
            break
    while left < 0:
        for d in reversed(order):
            if left and out[d] > floor[d]:
                out[d] -= 1
                left += 1
    return out


def aim(target: Mapping[str, float], base: Mapping[str, int], floor: Mapping[str, int], cap: Mapping[str, int],
        total: int, unit: str) -> dict[str, int]:
    """New amounts per domain (in ``unit``) that bring base + new to ``target``, or :class:`BlendError` naming the
    closest achievable mix when the sources cannot."""
    b = sum(base.values())
    if sum(floor.values()) > total:
        raise BlendError(f"whole sources hold {sum(floor.values())} {unit}, more than blend.total={total}")
    if sum(cap.values()) < total:
        raise BlendError(f"blend.total={total} {unit} but only {sum(cap.values())} are available after dedup and the "
                         "eval split; lower blend.total or add data")
    x = {d: target[d] * (b + total) - base[d] for d in DOMAINS}
    y = project(x, floor, cap, total)
    amounts = integer_amounts(y, floor, cap, total)
    if any(abs(y[d] - x[d]) > 0.5 for d in DOMAINS):
        merged = {d: (base[d] + amounts[d]) / (b + total) for d in DOMAINS}
        why = "; ".join(
            f"{d}: needs {x[d]:.0f} new {unit}, " + (f"the sources hold {cap[d]}" if x[d] > cap[d] else
                                                     f"the base alone holds {base[d]}" if x[d] < 0 else
                                                     f"whole sources bring {floor[d]}")
            for d in DOMAINS if x[d] > cap[d] + 0.5 or x[d] < floor[d] - 0.5)
        raise BlendError(
            f"blend.target_mix {_fmt(target)} cannot be met with blend.total={total} {unit} on a base of {b} {unit} "
            f"({_fmt({d: base[d] / b if b else 0.0 for d in DOMAINS})}): {why}. The closest achievable merged mix is "
            f"{_fmt(merged)}; set blend.target_mix to it, or change blend.total, blend.sources or the base (merge.base)"
        )
    return amounts


def check_max_share(merged: Mapping[str, int], limit: float | None, unit: str, base: Mapping[str, int]) -> None:
    """``blend.max_domain_share``: refuse a merged set in which one domain holds more than ``limit``."""
    if limit is None:
        return
    total = sum(merged.values())
    for d in DOMAINS:
        if total and merged[d] / total > limit + 1e-12:
            raise BlendError(
                f"the merged set would be {merged[d] / total:.1%} {d} ({merged[d]} of {total} {unit}: base "
                f"{base[d]}, new {merged[d] - base[d]}), over blend.max_domain_share={limit}; set blend.target_mix "
                f"to bring {d} down, or raise blend.max_domain_share"
            )


def by_domain(pools: list[Pool], domain_of: Callable[[str], str]) -> dict[str, list[Pool]]:
    """Each source's pool cut into one pool per domain, selection order kept."""
    out: dict[str, list[Pool]] = {d: [] for d in DOMAINS}
    for p in pools:
        for d in DOMAINS:
            keep = [i for i, id_ in enumerate(p.ids) if domain_of(id_) == d]
            out[d].append(Pool(p.name, [p.ids[i] for i in keep], [p.costs[i] for i in keep], whole=p.whole,
                               weight=p.weight))
    return out


def aimed_selection(pools: list[Pool], blend: BlendParams, domain_of: Callable[[str], str], base: dict[str, int]
                    ) -> tuple[Selection, dict[str, int]]:
    """``blend.target_mix``: the amount of each domain (:func:`draftline.prompts.aim.aim`), then per domain the
    usual whole / weighted selection among the sources' rows of that domain (``domain_of``: a prompt id's domain)."""
    per_domain = by_domain(pools, domain_of)
    floor = {d: sum(p.capacity for p in per_domain[d] if p.whole) for d in DOMAINS}
    cap = {d: floor[d] + sum(p.capacity for p in per_domain[d] if not p.whole and p.weight > 0) for d in DOMAINS}
    target = blend.requested_mix()
    assert target is not None
    amounts = aim(target, base, floor, cap, blend.total, blend.unit)
    train = {p.name: [] for p in pools}
    requested = {p.name: 0 for p in pools}
    achieved = {p.name: 0 for p in pools}
    for d in DOMAINS:
        sel = select(per_domain[d], amounts[d], blend.unit)
        for name in train:
            train[name] += sel.train_ids[name]
            requested[name] += sel.requested[name]
            achieved[name] += sel.achieved[name]
    rank = {id_: i for p in pools for i, id_ in enumerate(p.ids)}
    train = {name: sorted(ids, key=rank.__getitem__) for name, ids in train.items()}
    return Selection({p.name: p.eval_ids for p in pools}, train, requested, achieved), amounts
