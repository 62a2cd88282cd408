"""The training block layout: anchors, attention mask, labels, loss weights, and the batch plan."""

from __future__ import annotations

import math

import datasets
import numpy as np
import pytest
import torch

from draftline.train.anchors import anchor_candidates, count_candidates, sample_anchors
from draftline.train.data import BatchPlan, collate, pack_batches, scan_rows
from draftline.train.masks import block_inputs, block_mask, block_positions, block_targets, position_weights


def test_block_mask_shape_and_content():
    anchors = torch.tensor([[2, 5]])
    keep = torch.tensor([[True, True]])
    s, B = 8, 3
    m = block_mask(anchors, keep, s, B)
    assert m.shape == (1, 1, 2 * B, s + 2 * B) and m.dtype == torch.bool
    m = m[0, 0]
    for q in range(2 * B):
        j, a = q // B, anchors[0, q // B].item()
        # the context strictly before the anchor, nothing at or after it
        assert m[q, :a].all() and not m[q, a:s].any()
        # its own block in both directions, never the other block
        own = slice(s + j * B, s + (j + 1) * B)
        other = slice(s + (1 - j) * B, s + (2 - j) * B)
        assert m[q, own].all() and not m[q, other].any()


def test_block_mask_dropped_block_sees_only_itself():
    m = block_mask(torch.tensor([[4, 0]]), torch.tensor([[True, False]]), 6, 2)[0, 0]
    assert not m[2:, :6].any()  # no context for the dropped block
    assert m[2:, 8:].all() and not m[2:, 6:8].any()


def test_position_weights():
    w = position_weights(8, 4.0)
    assert w[0] == 0
    for k in range(1, 8):
        assert w[k].item() == pytest.approx(math.exp(-(k - 1) / 4.0))
    assert w[1] == 1.0 and (w[1:-1] > w[2:]).all()
    with pytest.raises(ValueError):
        position_weights(8, 0)


def test_block_targets_inputs_positions():
    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    loss = torch.tensor([[0, 1, 1, 1, 0, 1]], dtype=torch.bool)
    anchors, keep = torch.tensor([[1, 4]]), torch.tensor([[True, False]])
    labels, weights = block_targets(ids, loss, anchors, keep, 3, 2.0)
    assert labels[0, 0].tolist() == [11, 12, 13]
    assert weights[0, 0].tolist() == pytest.approx([0.0, 1.0, math.exp(-0.5)])
    assert (weights[0, 1] == 0).all()  # dropped block
    labels, weights = block_targets(ids, loss, torch.tensor([[4]]), torch.tensor([[True]]), 3, 2.0)
    assert weights[0, 0].tolist() == pytest.approx([0.0, 1.0, 0.0])  # position 6 is past the row's end
    assert block_inputs(ids, torch.tensor([[1, 4]]), 99, 3).tolist() == [[11, 99, 99, 14, 99, 99]]
    assert block_positions(torch.tensor([[1, 4]]), 3).tolist() == [[1, 2, 3, 4, 5, 6]]


def test_anchors_only_on_supervised_pairs():
    loss = torch.tensor([
        [0, 1, 1, 0, 1, 1, 1, 0, 0, 1],  # pairs start at 1, 4, 5
        [0, 0, 0, 0, 0, 0, 0, 1, 1, 0],  # one pair, at 7
    ], dtype=torch.bool)
    assert anchor_candidates(loss)[0].nonzero().flatten().tolist() == [1, 4, 5]
    seen = set()
    for seed in range(50):
        anchors, keep = sample_anchors(loss, 8, torch.Generator().manual_seed(seed))
        assert anchors.shape == (2, 3)
        assert keep[0].all() and keep[1].tolist() == [True, False, False]
        assert sorted(anchors[0].tolist()) == [1, 4, 5]
        assert anchors[1, 0].item() == 7
        sub, _ = sample_anchors(loss, 2, torch.Generator().manual_seed(seed))
        assert set(sub[0].tolist()) <= {1, 4, 5} and len(set(sub[0].tolist())) == 2
        seen.add(tuple(sub[0].tolist()))
    assert len(seen) == 3  # every pair of candidates is drawn: sampling is random, not fixed


def _rows(masks):
    return datasets.Dataset.from_dict({
        "input_ids": [list(range(len(m))) for m in masks],
        "loss_mask": [list(map(bool, m)) for m in masks],
    })


def test_scan_rows_counts_pairs_after_the_cut():
    masks = [[0, 1, 1, 1], [1, 0, 1, 0], [1, 1], [1], [0, 0, 1, 1, 1, 1, 1]]
    stats = scan_rows(_rows(masks), max_length=5)
    assert stats.lengths.tolist() == [4, 4, 2, 1, 5]
    assert stats.anchors.tolist() == [count_candidates(m[:5]) for m in masks] == [2, 0, 1, 0, 2]
    assert stats.cut_loss_tokens == 2 and stats.kept_loss_tokens == sum(sum(m[:5]) for m in masks)



def test_scan_rows_across_scan_batches(monkeypatch):
    """Batches after the first are slices of the mapped column: counts must not depend on where a batch starts."""
    rng = np.random.default_rng(0)
    masks = [rng.integers(0, 2, int(rng.integers(1, 12))).tolist() for _ in range(23)]
    monkeypatch.setattr("draftline.train.data._SCAN_ROWS", 4)
    stats = scan_rows(_rows(masks), max_length=7)
    assert stats.lengths.tolist() == [min(len(m), 7) for m in masks]
    assert stats.anchors.tolist() == [count_candidates(m[:7]) for m in masks]
    assert stats.kept_loss_tokens == sum(sum(m[:7]) for m in masks)
    assert stats.cut_loss_tokens == sum(sum(m[7:]) for m in masks)

def test_pack_batches_respects_the_budget():
    lengths = np.array([5, 9, 3, 9, 2, 7, 4, 8])
    batches = pack_batches(np.arange(8), lengths, 18)
    assert sorted(np.concatenate(batches).tolist()) == list(range(8))
    for b in batches:
        assert len(b) * lengths[b].max() <= 18
    with pytest.raises(ValueError, match="max_tokens_per_batch"):
        pack_batches(np.arange(8), lengths, 8)


def test_batch_plan_skips_rows_without_anchors_and_shards_by_rank():
    masks = [[0, 1, 1, 1]] * 6 + [[1, 0, 1, 0]]
    ds = _rows(masks)
    plans = [BatchPlan(ds, np.arange(7), max_length=8, max_tokens_per_batch=4, seed=3, world_size=2) for _ in range(2)]
    plan = plans[0]
    assert 6 not in plan.rows and plan.steps_per_epoch == 3
    for step in range(6):
        a, b = plan.batch_rows(step, 0), plan.batch_rows(step, 1)
        assert not set(a) & set(b)
        assert (plans[1].batch_rows(step, 0) == a).all()  # a pure function of (seed, step, rank)
    for step in (5, 0, 4, 1):  # out of order too: the remembered epoch never leaks into another
        fresh = BatchPlan(ds, np.arange(7), max_length=8, max_tokens_per_batch=4, seed=3, world_size=2)
        assert (plan.batch_rows(step, 1) == fresh.batch_rows(step, 1)).all()
    batch = collate(ds, np.array([0, 6]), 3, pad_token_id=0)
    assert batch.input_ids.shape == (2, 3) and batch.loss_mask[0].tolist() == [False, True, True]
