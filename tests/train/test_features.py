"""The feature cache: the target's features of every row computed once, read back per batch, counted by the preflight."""

from __future__ import annotations

import shutil

import drafter_support as S
import numpy as np
import pytest
import torch

from draftline.train import trainer as T
from draftline.train.objective import capture_features


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    S.make_target(root)
    S.make_merged(root, S.make_rows(40))
    return root


def _run(workdir, **params) -> T.Run:
    from draftline.core.logs import get_logger
    from draftline.core.skips import Skips

    torch.set_num_threads(1)
    a = S.args(workdir)
    run = T.prepare(S.train_params(**params), a.merged, a.target, T.Dist(), Skips(get_logger("test")))
    T.build(run)
    T.cache_features(run)
    return run


@pytest.mark.parametrize("labels", ["data", "target"])
def test_cached_features_are_each_rows_online_features_zero_padded(workdir, labels):
    run = _run(workdir, architecture="dflash2", dflash2={**S.small_params()["dflash2"], "selector_labels": labels})
    assert run.features is not None and run.target_labels == (labels == "target")
    for step in range(run.plan.steps_per_epoch):
        rows = run.plan.batch_rows(step, 0)
        batch = run.batch(rows)
        online, online_ids = capture_features(run.target, batch, run.drafter.target_layer_ids, run.target_labels)
        cached, cached_ids = run.features.batch(rows, batch.input_ids.shape[1])
        real = batch.attention_mask.bool()
        # The cache was filled from the plan's own batches: the very computation a step would run, bit for bit.
        assert torch.equal(cached[real], online[real])
        assert not cached[~real].any()
        if labels == "data":
            assert online_ids is None and cached_ids is None
        else:
            assert torch.equal(cached_ids[real], online_ids[real]) and not cached_ids[~real].any()


def test_rows_outside_the_plan_are_refused():
    cache = T.FeatureCache(torch.zeros(5, 2), np.array([0, -1]), np.array([5, 3]))
    assert cache.batch(np.array([0]), 6)[0][0, :5].eq(0).all()
    with pytest.raises(KeyError, match="row 1 is not in the feature cache"):
        cache.batch(np.array([1]), 6)


def test_the_budget_decides_and_the_report_and_preflight_say_which(tmp_path, workdir, monkeypatch):
    cached, online = _run(workdir), _run(workdir, feature_cache_gb=0)
    assert online.features is None and online.feature_bytes == 0
    rows = cached.plan.tokens * len(cached.drafter.target_layer_ids) * S.HIDDEN * 4
    assert cached.feature_bytes == rows
    # The preflight counts the cache as memory held for the whole run.
    assert T.check_memory(cached).estimated_bytes - T.check_memory(online).estimated_bytes == rows
    # Both paths train to the same weights (the features are the same bits), so the budget is not in the resume key.
    weights = {}
    for name, budget in (("cached", 1.0), ("online", 0.0)):
        root = tmp_path / name
        for sub in ("data/target", "data/merged"):
            shutil.copytree(workdir / sub, root / sub)
        monkeypatch.setenv("DRAFTLINE_CACHE", str(S.cache(root)))  # each run its own states: nothing to resume
        stage = S.train(S.train_params(max_steps=3, feature_cache_gb=budget), S.args(root))
        assert stage.details["target_features"] == name
        weights[name] = (root / "data" / "checkpoints" / "model.safetensors").read_bytes()
    assert weights["cached"] == weights["online"]


def test_a_padded_batch_gives_each_row_the_features_it_has_alone(workdir):
    """capture_features runs the target unmasked on right-padded rows (its causal kernel): each real position must
    get the features, and the greedy next token, the row gets when it is run alone, unpadded."""
    run = _run(workdir, architecture="dflash2", dflash2={**S.small_params()["dflash2"], "selector_labels": "target"})
    rows = max((run.plan.batch_rows(step, 0) for step in range(run.plan.steps_per_epoch)), key=len)
    batch = run.batch(rows)
    assert len(rows) > 1 and not batch.attention_mask.bool().all()  # the check needs a padded row
    padded, padded_ids = capture_features(run.target, batch, run.drafter.target_layer_ids, next_ids=True)
    agree = total = 0
    for i, n in enumerate(batch.attention_mask.sum(1).tolist()):
        alone = run.batch(rows[i : i + 1])
        assert alone.input_ids.shape[1] == n
        feats, ids = capture_features(run.target, alone, run.drafter.target_layer_ids, next_ids=True)
        torch.testing.assert_close(padded[i, :n], feats[0], atol=1e-4, rtol=1e-4)
        agree, total = agree + int((padded_ids[i, :n] == ids[0]).sum()), total + n
    assert agree / total >= 0.99  # an argmax may flip on a near-tie at float precision, never more than that
