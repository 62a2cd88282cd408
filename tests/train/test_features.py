"""The feature cache: the target's features of every row computed once, read back per pack, counted by the preflight."""

from __future__ import annotations

import shutil

import drafter_support as S
import numpy as np
import pytest
import torch

from draftline.train import trainer as T
from draftline.train.greedy import pack_chains
from draftline.train.objective import pack_features


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
def test_cached_features_are_each_packs_online_features(workdir, labels):
    run = _run(workdir, architecture="dflash2", dflash2={**S.small_params()["dflash2"], "selector_labels": labels})
    assert run.features is not None and run.needs_final == (labels == "target")
    for step in range(2 * run.plan.steps_per_epoch):  # two epochs: other packs of the same rows
        rows = run.plan.batch_rows(step, 0)
        online, online_final = pack_features(run.target, run.batch(rows), run.drafter.target_layer_ids,
                                             run.needs_final)
        cached, cached_final = run.features.pack(rows)
        # The cache ran the target on each row alone, as a step does: the same computation, bit for bit.
        assert torch.equal(cached, online)
        if labels == "data":
            assert online_final is None and cached_final is None
        else:
            assert torch.equal(cached_final, online_final)


@torch.no_grad()
def greedy_decode(target, ids: list[int], i: int, depth: int) -> list[int]:
    """The target's greedy continuation of ``ids[: i + 1]``, one plain forward a token, within the row."""
    x, out = torch.tensor([ids[: i + 1]]), []
    for _ in range(min(depth, len(ids) - 1 - i)):
        out.append(int(target(input_ids=x).logits[0, -1].argmax()))
        x = torch.cat([x, torch.tensor([[out[-1]]])], dim=1)
    return out


def test_cached_greedy_paths_are_each_packs_online_paths(workdir):
    """``argmax_path: greedy``: the cache holds every row's greedy continuations, read back per pack as a step
    computing them online (``pack_chains``) would, bit for bit; and what it holds is the target's greedy decoding
    from each supervised position, token by token (checked on two rows), not only what the same function gives."""
    selector = {**S.small_params()["dflash2"], "selector_labels": "target"}
    run = _run(workdir, architecture="dflash2", dflash2=selector, argmax_path="greedy")
    assert run.chain_depth == 7 and run.features.chains is not None
    for step in range(run.plan.steps_per_epoch):
        rows = run.plan.batch_rows(step, 0)
        batch = run.batch(rows)
        online = pack_chains(run.target, batch.input_ids, batch.loss_mask, batch.row_of, run.chain_depth)
        assert torch.equal(run.features.pack_chains(rows), online)
    for row in run.plan.batch_rows(0, 0)[:2]:
        batch = run.batch(np.array([row]))
        ids, mask = batch.input_ids[0].tolist(), batch.loss_mask[0].tolist()
        chains = run.features.pack_chains(np.array([row]))[0]
        for i in (i for i in range(len(ids) - 1) if mask[i + 1]):
            want = greedy_decode(run.target, ids, i, run.chain_depth)
            assert chains[i, : len(want)].tolist() == want, (int(row), i)


def test_rows_outside_the_plan_are_refused():
    cache = T.FeatureCache(torch.arange(10.0).view(5, 2), np.array([0, -1]), np.array([5, 3]))
    assert torch.equal(cache.pack(np.array([0]))[0], torch.arange(10.0).view(1, 5, 2))
    with pytest.raises(KeyError, match="row 1 is not in the feature cache"):
        cache.pack(np.array([1]))


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
