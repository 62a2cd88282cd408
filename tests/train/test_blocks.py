"""The training block layout: anchors, attention mask, labels, loss weights, and the plan of packs."""

from __future__ import annotations

import math

import datasets
import numpy as np
import pytest
import torch

from draftline.train.anchors import anchor_candidates, count_candidates, sample_anchors
from draftline.train.data import BatchPlan, PlanError, collate, pack_rows, scan_rows
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

def test_pack_rows_first_fit_keeps_the_budget_and_every_row_once():
    lengths = np.array([5, 9, 3, 9, 2, 7, 4, 8])
    order = np.array([3, 0, 7, 1, 6, 2, 5, 4])
    # One open pack: sequential packing, a pack closing when the next row does not fit.
    packs = pack_rows(order, lengths, 18, open_packs=1)
    assert np.concatenate(packs).tolist() == order.tolist()
    assert [int(lengths[p].sum()) for p in packs] == [14, 17, 16]
    # First fit: row 4 (2 tokens) and row 6 (4 tokens) fill the gaps the sequential packing left.
    packs = pack_rows(order, lengths, 18)
    assert sorted(np.concatenate(packs).tolist()) == list(range(8))
    assert [p.tolist() for p in packs] == [[3, 0, 6], [7, 1], [2, 5, 4]]
    assert all(lengths[p].sum() <= 18 for p in packs)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 50, 500)
    for open_packs in (1, 4, 16):
        packs = pack_rows(rng.permutation(500), lengths, 64, open_packs=open_packs)
        assert sorted(np.concatenate(packs).tolist()) == list(range(500)) and max(lengths[p].sum() for p in packs) <= 64
    assert len(pack_rows(np.arange(500), lengths, 64)) < len(pack_rows(np.arange(500), lengths, 64, open_packs=1))
    with pytest.raises(PlanError, match="max_tokens_per_batch"):
        pack_rows(order, np.array([5, 9, 3, 9, 2, 7, 4, 8]), 8)


def test_batch_plan_shuffles_packs_every_epoch_and_shards_by_rank():
    masks = [[0, 1, 1, 1]] * 12 + [[1, 0, 1, 0]]
    ds = _rows(masks)
    plan = BatchPlan(ds, np.arange(13), max_length=8, max_tokens_per_batch=8, seed=3, world_size=2)
    assert 12 not in plan.rows and plan.steps_per_epoch == 3  # 12 rows of 4 tokens: 6 packs of 2, 3 steps x 2 ranks
    epochs = []
    for epoch in range(2):
        rows = [plan.batch_rows(epoch * 3 + i, r).tolist() for i in range(3) for r in range(2)]
        assert sorted(sum(rows, [])) == list(range(12))  # every row once an epoch, ranks never share one
        epochs.append({frozenset(p) for p in rows})
    assert epochs[0] != epochs[1]  # which rows share a step changes between epochs
    assert plan.epochs_at(3) == 1.0 and plan.epochs_at(4) == pytest.approx(1 + 1 / 3)
    for step in (5, 0, 4, 1):  # out of order too, and in a fresh plan: a pure function of (seed, step, rank)
        fresh = BatchPlan(ds, np.arange(13), max_length=8, max_tokens_per_batch=8, seed=3, world_size=2)
        assert (plan.batch_rows(step, 1) == fresh.batch_rows(step, 1)).all()
    other = BatchPlan(ds, np.arange(13), max_length=8, max_tokens_per_batch=8, seed=4, world_size=2)
    assert any((other.batch_rows(s, 0) != plan.batch_rows(s, 0)).any() for s in range(3))


def test_epochs_of_different_pack_counts_add_up():
    lengths = [3, 5, 2, 6, 4, 1, 7, 3, 5]
    ds = _rows([[1] * n for n in lengths])
    plan = BatchPlan(ds, np.arange(9), max_length=8, max_tokens_per_batch=9, seed=0)
    counts = [plan.steps_in(e) for e in range(6)]
    assert len(set(counts)) > 1  # the packing of a shuffle depends on it
    assert plan.total_steps(2.5) == counts[0] + counts[1] + -(-counts[2] // 2)
    step = 0
    for epoch, n in enumerate(counts):
        for i in range(n):
            assert plan.locate(step) == (epoch, i)
            assert sorted(plan.batch_rows(step, 0).tolist()) == sorted(plan.packs(epoch)[i].tolist())
            step += 1


def test_collate_lays_rows_end_to_end_with_their_own_positions():
    ds = _rows([[0, 1, 1, 1, 1], [1, 0, 1], [0, 1, 1]])
    batch = collate(ds, np.array([2, 0]), 4)
    assert batch.input_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3]]  # row 2, then row 0 cut to 4 tokens
    assert batch.loss_mask.tolist() == [[False, True, True, False, True, True, True]]
    assert batch.row_of.tolist() == [[0, 0, 0, 1, 1, 1, 1]]
    assert batch.positions.tolist() == [[0, 1, 2, 0, 1, 2, 3]]
    assert batch.num_tokens == 7
