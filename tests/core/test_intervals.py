"""The paired bootstrap of ``draftline.core.intervals``: degenerate where the two drafters agree, exact for a
constant shift, excluding 0 only for a real difference, of the normal width for many requests, and the same bytes
for the same seed; per-request acceptance read from the evaluate stage's per-step records as z-lab computes it."""

from __future__ import annotations

import json
from statistics import mean

import numpy as np
import pytest

from draftline.core.intervals import (
    bootstrap,
    clustered_bootstrap,
    compare,
    compare_seeds,
    first,
    paired,
    paired_bootstrap,
    ratio,
    request_acceptance,
)


def acceptances(n: int, seed: int) -> np.ndarray:
    """Per-request acceptances in [1, 8] in steps of 1/8 (exact in binary, so shifts are exact too)."""
    return np.random.default_rng(seed).integers(8, 65, size=n) / 8


def test_identical_pair_is_a_degenerate_interval_at_zero():
    a = acceptances(56, 0)
    iv = paired_bootstrap(a, a.copy(), resamples=2000)
    assert (iv.estimate, iv.low, iv.high) == (0.0, 0.0, 0.0)
    assert not iv.excludes_zero() and iv.n == 56


def test_a_constant_shift_is_recovered_exactly():
    a = acceptances(56, 1)
    iv = paired_bootstrap(a, a + 0.5, resamples=2000)
    assert (iv.estimate, iv.low, iv.high) == (-0.5, -0.5, -0.5)
    assert iv.excludes_zero()


def test_a_noisy_shift_excludes_zero_and_noise_alone_does_not():
    rng = np.random.default_rng(2)
    a = acceptances(56, 3)
    shifted = paired_bootstrap(a + 0.6 + rng.normal(0, 0.5, 56), a, resamples=4000)
    assert shifted.low > 0.3 and shifted.excludes_zero()
    noise = paired_bootstrap(a + rng.normal(0, 0.5, 56) - 0.0, a, resamples=4000)
    assert noise.low < noise.estimate < noise.high
    assert noise.low < 0.05 and noise.high > -0.05 and noise.high - noise.low < 0.4


def test_the_interval_has_the_normal_width_for_many_requests():
    # d ~ N(0.3, 1), n = 2500: the 95% interval is 0.3 +- 1.96 / 50 (0.039 wide each side), within resampling noise.
    d = np.random.default_rng(4).normal(0.3, 1.0, 2500)
    iv = paired_bootstrap(d, np.zeros_like(d), resamples=4000, confidence=0.95)
    half = 1.96 * d.std(ddof=1) / 50
    assert iv.estimate - iv.low == pytest.approx(half, rel=0.08)
    assert iv.high - iv.estimate == pytest.approx(half, rel=0.08)
    narrow = paired_bootstrap(d, np.zeros_like(d), resamples=4000, confidence=0.5)
    assert iv.low < narrow.low < narrow.high < iv.high


def test_one_drafters_mean_and_pooled_ratio_get_their_own_intervals():
    acc = acceptances(400, 9)
    iv = bootstrap(acc[:, None], first, resamples=4000)
    half = 1.96 * acc.std(ddof=1) / 20
    assert iv.estimate == pytest.approx(acc.mean())
    assert iv.estimate - iv.low == pytest.approx(half, rel=0.1) and iv.high - iv.estimate == pytest.approx(half, rel=0.1)
    steps = np.random.default_rng(10).integers(1, 30, size=400)
    produced = np.round(acc * steps)
    tau = bootstrap(np.column_stack([produced, steps]), ratio, resamples=2000)
    assert tau.estimate == pytest.approx(produced.sum() / steps.sum()) and tau.low < tau.estimate < tau.high
    # every turn alike: no spread, whatever the resample
    flat = bootstrap(np.column_stack([np.full(30, 12.0), np.full(30, 4.0)]), ratio, resamples=1000)
    assert (flat.estimate, flat.low, flat.high) == (3.0, 3.0, 3.0)


def test_same_seed_same_bytes_other_seed_other_bounds():
    rng = np.random.default_rng(5)
    a, b = acceptances(40, 6), acceptances(40, 6) + rng.normal(0, 0.7, 40)
    one = json.dumps(paired_bootstrap(a, b, resamples=1500, seed=7).as_dict(), sort_keys=True)
    two = json.dumps(paired_bootstrap(a, b, resamples=1500, seed=7).as_dict(), sort_keys=True)
    other = paired_bootstrap(a, b, resamples=1500, seed=8)
    assert one == two
    assert (other.low, other.high) != (json.loads(one)["low"], json.loads(one)["high"])
    assert other.estimate == json.loads(one)["estimate"]


def test_refuses_unpaired_or_empty_input():
    with pytest.raises(ValueError):
        paired_bootstrap([1.0, 2.0], [1.0], resamples=10)
    with pytest.raises(ValueError):
        paired_bootstrap([], [], resamples=10)
    with pytest.raises(ValueError):
        paired({"x#0": 1.0}, {"y#0": 1.0})


def step(setting: str, set_name: str, source: str, rid: str, produced: list[int], turn: int = 0) -> dict:
    return {"setting": setting, "set": set_name, "source": source, "id": rid, "turn": turn, "prompt_tokens": 9,
            "drafted": [7] * len(produced), "accepted": [p - 1 for p in produced], "produced": produced,
            "stop_reason": "stop"}


def test_request_acceptance_is_z_labs_per_request_mean():
    records = [step("greedy", "heldout", "agent", "r1", [3, 4, 8]), step("greedy", "heldout", "agent", "r2", [1]),
               step("greedy", "heldout", "hermes_fc", "r3", [5, 6]), step("greedy", "heldout", "agent", "r4", []),
               step("sampled", "heldout", "agent", "r1", [2]), step("greedy", "gsm8k", "gsm8k", "g1", [2, 2])]
    got = request_acceptance(records, "greedy")
    assert got == {"r1#0": ("agent", 5.0), "r2#0": ("agent", 1.0), "r3#0": ("hermes_fc", 5.5)}
    # z-lab's acceptance of the setting is the mean of these (the turn without a step left out, as in report.figures)
    assert mean(v for _, v in got.values()) == pytest.approx((5.0 + 1.0 + 5.5) / 3)
    assert request_acceptance(records, "greedy", "gsm8k") == {"g1#0": ("gsm8k", 2.0)}
    records[1]["split"], records[2]["split"] = "dev", "test"  # the stage's records name their split
    assert request_acceptance(records, "greedy", split="dev") == {"r2#0": ("agent", 1.0)}


def test_compare_pairs_by_request_and_filters_by_source():
    a = {"r1#0": ("agent", 5.0), "r2#0": ("agent", 3.0), "r3#0": ("hermes_fc", 6.0), "r9#0": ("agent", 9.0)}
    b = {"r1#0": ("agent", 4.0), "r2#0": ("agent", 2.0), "r3#0": ("hermes_fc", 6.5)}
    overall = compare(a, b, resamples=500)
    assert overall.n == 3 and overall.estimate == pytest.approx((1.0 + 1.0 - 0.5) / 3)
    agent = compare(a, b, source="agent", resamples=500)
    assert (agent.n, agent.estimate, agent.low, agent.high) == (2, 1.0, 1.0, 1.0)


def seeds_with_offsets(offsets: list[float], n: int = 200) -> tuple[list[dict], list[dict]]:
    """Per target seed, ``n`` paired requests whose differences are that seed's offset plus small noise."""
    rng = np.random.default_rng(5)
    a, b = [], []
    for i, offset in enumerate(offsets):
        base = rng.uniform(2, 6, size=n)
        diff = offset + rng.normal(0, 0.05, size=n)
        a.append({f"{i}/r{j}": ("agent", float(base[j] + diff[j])) for j in range(n)})
        b.append({f"{i}/r{j}": ("agent", float(base[j])) for j in range(n)})
    return a, b


def test_seed_to_seed_variance_widens_the_pooled_interval():
    # Per seed the difference is sure (+0.30, +0.00, -0.10); pooled over requests alone it looks sure too, which the
    # seeds do not support: resampling the seeds brings their spread into the interval.
    a, b = seeds_with_offsets([0.30, 0.0, -0.10])
    requests_only = compare({k: v for s in a for k, v in s.items()}, {k: v for s in b for k, v in s.items()},
                            resamples=2000)
    clustered = compare_seeds(a, b, resamples=2000)
    assert clustered.estimate == pytest.approx(requests_only.estimate) and clustered.n == requests_only.n == 600
    assert requests_only.excludes_zero() and requests_only.high - requests_only.low < 0.05
    assert not clustered.excludes_zero() and clustered.high - clustered.low > 0.3


def test_seeds_that_agree_keep_a_narrow_interval():
    a, b = seeds_with_offsets([0.2, 0.2, 0.2])
    iv = compare_seeds(a, b, resamples=2000)
    assert iv.excludes_zero() and iv.low > 0.18 and iv.high < 0.22


def test_one_seed_is_the_request_bootstrap():
    a, b = seeds_with_offsets([0.1], n=100)
    one, plain = compare_seeds(a, b, resamples=4000), compare(a[0], b[0], resamples=4000)
    assert one.estimate == pytest.approx(plain.estimate)
    assert one.low == pytest.approx(plain.low, abs=0.005) and one.high == pytest.approx(plain.high, abs=0.005)


def test_clustered_is_seeded_and_refuses_bad_groups():
    groups = [acceptances(30, 1)[:, None], acceptances(40, 2)[:, None]]
    assert clustered_bootstrap(groups, first, 300, seed=4) == clustered_bootstrap(groups, first, 300, seed=4)
    assert clustered_bootstrap(groups, first, 300, seed=4) != clustered_bootstrap(groups, first, 300, seed=5)
    with pytest.raises(ValueError, match="one width"):
        clustered_bootstrap([np.ones((3, 1)), np.ones((3, 2))], first)
    with pytest.raises(ValueError, match="one width"):
        clustered_bootstrap([], first)
    with pytest.raises(ValueError, match="same non-zero number of seeds"):
        compare_seeds([{}], [], resamples=10)
