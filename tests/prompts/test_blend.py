"""Blend arithmetic: Hamilton quotas, overflow, exact totals in samples and tokens, infeasible requests."""

from __future__ import annotations

import pytest

from draftline.core.params import ParamsError
from draftline.core.splits import split_of
from draftline.prompts.blend import (
    BlendError,
    BlendSource,
    Pool,
    hamilton,
    hash_rank,
    quotas,
    select,
    source_plan,
    split_eval,
)
from draftline.prompts.params import HeldOutParams


def test_hamilton_largest_remainder() -> None:
    assert hamilton(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}
    assert hamilton(7, {"a": 0.5, "b": 0.3, "c": 0.2}) == {"a": 4, "b": 2, "c": 1}  # 3.5, 2.1, 1.4
    assert sum(hamilton(1001, {"x": 3, "y": 7, "z": 11}).values()) == 1001


def test_overflow_goes_to_the_others_by_weight() -> None:
    # b wants 50 but has 10; its 40 go to a and c in proportion 1:3.
    q = quotas(100, {"a": 1, "b": 2, "c": 3}, {"a": 1000, "b": 10, "c": 1000})
    assert q == {"a": 23, "b": 10, "c": 67}
    # Cascading: after b overflows, a overflows too.
    q = quotas(100, {"a": 1, "b": 2, "c": 3}, {"a": 20, "b": 10, "c": 1000})
    assert q == {"a": 20, "b": 10, "c": 70}


def _pool(name: str, n: int, cost=1, **kw) -> Pool:
    costs = [cost(i) if callable(cost) else cost for i in range(n)]
    return Pool(name, [f"{name}{i}" for i in range(n)], costs, **kw)


def test_samples_blend_is_exact_with_whole_sources() -> None:
    pools = [_pool("whole", 30, whole=True), _pool("a", 500, weight=1), _pool("b", 40, weight=3)]
    sel = select(pools, 200, "samples")
    assert sel.achieved == {"whole": 30, "a": 130, "b": 40}
    assert sum(map(len, sel.train_ids.values())) == 200
    assert sel.train_ids["a"] == [f"a{i}" for i in range(130)]  # a prefix of the ranked pool


def test_tokens_blend_meets_total_within_one_row() -> None:
    pools = [_pool("a", 400, cost=lambda i: 50 + (i * 37) % 400, weight=2), _pool("b", 400, cost=lambda i: 20 + (i * 11) % 90, weight=1)]
    for total in (1000, 12345, 40000):
        sel = select(pools, total, "tokens")
        got = sum(sel.achieved.values())
        largest = max(max(p.costs[: len(sel.train_ids[p.name])]) for p in pools if sel.train_ids[p.name])
        assert total <= got < total + largest
        assert abs(sel.achieved["a"] / got - 2 / 3) < 0.05


def test_infeasible_requests_name_their_numbers() -> None:
    with pytest.raises(BlendError, match=r"blend.total=500 samples but only 300 are available .*a 100, b 200"):
        select([_pool("a", 100, weight=1), _pool("b", 200, weight=1)], 500, "samples")
    with pytest.raises(BlendError, match=r"whole sources hold 200 samples \(b 200\), more than blend.total=150"):
        select([_pool("a", 100, weight=1), _pool("b", 200, whole=True)], 150, "samples")
    with pytest.raises(BlendError, match="not in params.yaml"):
        source_plan(["a"], {"zzz": BlendSource(weight=1)})
    with pytest.raises(ParamsError, match="not both"):
        BlendSource.parse({"whole": True, "weight": 2}, "blend.sources.a")


def test_hash_rank_is_stable_when_a_source_grows() -> None:
    ids = [f"id{i}" for i in range(1000)]
    grown = ids + [f"new{i}" for i in range(100)]
    take = lambda pool: set(sorted(pool, key=lambda i: hash_rank(0, i))[:300])  # noqa: E731
    before, after = take(ids), take(grown)
    # Only rows pushed out by better-ranked new rows change; old rows never swap among themselves.
    assert len(before - after) == len(after - before) == len({i for i in after if i.startswith("new")})
    assert len(before - after) < 60
    assert take(ids) != set(sorted(ids, key=lambda i: hash_rank(1, i))[:300])  # the seed matters


def test_each_split_takes_the_first_ids_of_its_own_split_capped_at_half_a_source() -> None:
    ids = [f"p{i}" for i in range(400)]
    dev = [i for i in ids if split_of(i) == "dev"]
    test = [i for i in ids if split_of(i) == "test"]
    assert 100 < len(dev) < 167  # about a third of ids hash to dev
    held, train = split_eval(ids, HeldOutParams(dev=24, test=48))
    assert held == dev[:24] + test[:48]
    assert train == [i for i in ids if i not in set(held)]  # the rest, in selection order
    # More than half the source asked: both quotas shrink in proportion (10 of 21 ids: 3 dev, 7 test).
    small = ids[:21]
    held, train = split_eval(small, HeldOutParams(dev=24, test=48))
    small_dev = [i for i in small if split_of(i) == "dev"]
    small_test = [i for i in small if split_of(i) == "test"]
    assert held == small_dev[:3] + small_test[:7] and len(held) == 10 and len(train) == 11
    # A prompt's split is its id's: ranking the ids differently never moves one between splits.
    shuffled = ids[::-1]
    assert {split_of(i) for i in split_eval(shuffled, HeldOutParams(dev=24, test=0))[0]} == {"dev"}
