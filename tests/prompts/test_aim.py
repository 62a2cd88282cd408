"""Aiming the merged set at a target mix: exact where the sources allow, else the closest mix, named."""

from __future__ import annotations

import pytest

from draftline.prompts.aim import aim, check_max_share, integer_amounts, project
from draftline.prompts.blend import BlendError

ZERO = {"code": 0, "math": 0, "tool_use": 0, "general": 0}
BIG = {"code": 10_000, "math": 10_000, "tool_use": 10_000, "general": 10_000}


def test_exact_when_feasible() -> None:
    base = {"code": 770, "math": 80, "tool_use": 50, "general": 100}
    target = {"code": 0.4, "math": 0.25, "tool_use": 0.15, "general": 0.2}
    new = aim(target, base, ZERO, BIG, 1000, "samples")
    assert sum(new.values()) == 1000
    assert {d: (base[d] + new[d]) / 2000 for d in new} == target


def test_whole_sources_are_a_floor_and_weights_a_cap() -> None:
    new = aim({"code": 0.0, "math": 0.5, "tool_use": 0.0, "general": 0.5}, ZERO,
              {"code": 0, "math": 0, "tool_use": 0, "general": 0}, {"code": 0, "math": 100, "tool_use": 0, "general": 100},
              100, "samples")
    assert new == {"code": 0, "math": 50, "tool_use": 0, "general": 50}
    with pytest.raises(BlendError, match=r"code: needs 0 new samples, whole sources bring 10\. The closest achievable "
                                         r"merged mix is \{code: 0\.100, math: 0\.450, tool_use: 0\.000, general: 0\.450\}"):
        aim({"code": 0.0, "math": 0.5, "tool_use": 0.0, "general": 0.5}, ZERO,
            {"code": 10, "math": 0, "tool_use": 0, "general": 0}, {"code": 10, "math": 100, "tool_use": 0, "general": 100},
            100, "samples")


def test_the_closest_mix_is_the_least_squares_one_within_the_box() -> None:
    x = {"code": -30.0, "math": 60.0, "tool_use": 40.0, "general": 30.0}  # code cannot go below 0
    y = project(x, ZERO, BIG, 100)
    assert y["code"] == 0 and sum(y.values()) == pytest.approx(100)
    # the other three move down by the same amount (10): the Euclidean projection onto the box and the total
    assert [round(y[d] - x[d], 6) for d in ("math", "tool_use", "general")] == [-10.0, -10.0, -10.0]
    assert sum(integer_amounts(y, ZERO, BIG, 100).values()) == 100


def test_max_share_names_the_domain_and_its_share() -> None:
    check_max_share({"code": 50, "math": 50, "tool_use": 0, "general": 0}, 0.5, "samples", ZERO)
    check_max_share({"code": 99, "math": 1, "tool_use": 0, "general": 0}, None, "samples", ZERO)
    with pytest.raises(BlendError, match=r"77\.0% code \(77 of 100 tokens: base 70, new 7\), over blend.max_domain_share=0\.5"):
        check_max_share({"code": 77, "math": 23, "tool_use": 0, "general": 0}, 0.5, "tokens",
                        {"code": 70, "math": 0, "tool_use": 0, "general": 0})
