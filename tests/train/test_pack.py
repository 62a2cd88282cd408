"""Packs: rows laid end to end train exactly as each would alone, and every label the objective can learn."""

from __future__ import annotations

import copy

import datasets
import drafter_support as S
import numpy as np
import pytest
import torch

from draftline.core.params import ParamsError
from draftline.core.target_loader import load_model, load_target
from draftline.drafter.config import make_config
from draftline.drafter.model import DFlashDrafter
from draftline.train.anchors import anchor_candidates, sample_anchors
from draftline.train.data import collate
from draftline.train.greedy import greedy_chains, greedy_path, pack_chains
from draftline.train.masks import block_mask, row_masks
from draftline.train.objective import dflash_loss, draft_blocks, pack_features


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("pack")
    info = load_target(S.make_target(root))
    target = load_model(info, dtype=torch.float32, device="cpu").requires_grad_(False)
    torch.manual_seed(0)
    config = make_config(target.config, num_layers=2, block_size=4, mask_token_id=S.MASK_ID,
                         target_layer_ids=[1, 3], lineage=S.lineage(info))
    return target, DFlashDrafter(config).bind(target)


def _dataset(n: int = 3) -> datasets.Dataset:
    return datasets.Dataset.from_dict({k: v for k, v in S.make_rows(n, seed=5).items()
                                       if k in ("input_ids", "loss_mask")})


def test_each_packed_row_gets_what_it_gets_alone(models):
    """Features, block hidden states: a row's blocks in a pack see only their own row, at their own positions."""
    target, drafter = models
    ds = _dataset()
    pack = collate(ds, np.array([0, 1, 2]), 64)
    features, final = pack_features(target, pack, drafter.target_layer_ids, final=True)
    anchors, keep = sample_anchors(pack.loss_mask, 3, torch.Generator().manual_seed(0), pack.row_of)
    packed = draft_blocks(drafter, features, pack, anchors)
    starts = (pack.positions == 0).nonzero()[:, 1].tolist()
    for r in range(3):
        alone = collate(ds, np.array([r]), 64)
        f, h = pack_features(target, alone, drafter.target_layer_ids, final=True)
        n = alone.num_tokens
        assert torch.equal(f[0], features[0, starts[r]: starts[r] + n])  # the target ran on the row alone
        assert torch.equal(h[0], final[0, starts[r]: starts[r] + n])
        mine = (pack.row_of[0, anchors[0]] == r).nonzero().flatten()
        own = (anchors[0, mine] - starts[r])[None]
        hidden = draft_blocks(drafter, f, alone, own)
        blocks = torch.cat([packed[0, 4 * j: 4 * j + 4] for j in mine.tolist()])
        torch.testing.assert_close(blocks, hidden[0], atol=1e-5, rtol=1e-5)


def test_anchors_stay_in_their_rows_up_to_the_cap_per_row():
    ds = _dataset()
    pack = collate(ds, np.array([0, 1, 2]), 64)
    ok = anchor_candidates(pack.loss_mask, pack.row_of)[0]
    assert not ok[:-1][pack.row_of[0, 1:] != pack.row_of[0, :-1]].any()  # never across a row's end
    per_row = ok.long().new_zeros(3).index_add_(0, pack.row_of[0], ok.long())
    for seed in range(20):
        anchors, keep = sample_anchors(pack.loss_mask, 5, torch.Generator().manual_seed(seed), pack.row_of)
        assert keep.all() and ok[anchors[0]].all() and (anchors[0].diff() > 0).all()
        got = torch.bincount(pack.row_of[0, anchors[0]], minlength=3)
        assert got.tolist() == per_row.clamp(max=5).tolist()


def test_anchors_per_token_follow_each_rows_candidates():
    """per_token: the pack's anchors (per_row x rows of them) fall on rows in proportion to their candidates."""
    ds = datasets.Dataset.from_dict({"input_ids": [list(range(40)), list(range(10))],
                                     "loss_mask": [[False] * 4 + [True] * 36, [False] * 4 + [True] * 6]})
    pack = collate(ds, np.array([0, 1]), 64)
    ok = anchor_candidates(pack.loss_mask, pack.row_of)[0]
    share = torch.zeros(2)
    for seed in range(200):
        anchors, keep = sample_anchors(pack.loss_mask, 4, torch.Generator().manual_seed(seed), pack.row_of,
                                       per_token=True)
        assert anchors.shape == (1, 8) and keep.all() and ok[anchors[0]].all() and (anchors[0].diff() > 0).all()
        share += torch.bincount(pack.row_of[0, anchors[0]], minlength=2)
    # 35 and 5 candidates: 7/8 of the anchors on the long row (per_row would give 4 and 4)
    assert abs(float(share[0] / share.sum()) - 35 / 40) < 0.03


def _greedy_rows(target, n: int) -> datasets.Dataset:
    ds = _dataset(n)
    return S.greedy_rows(target, [ids[: mask.index(True)] for ids, mask in zip(ds["input_ids"], ds["loss_mask"])])


def _loss(drafter, target, pack, labels: str, seed: int = 1):
    features, final = pack_features(target, pack, drafter.target_layer_ids, final=labels != "data")
    return dflash_loss(drafter, features, pack, anchors_per_seq=4, gamma=4.0, generator=torch.Generator().manual_seed(seed),
                       labels={labels: 1.0}, target_final=final)


def test_target_labels_are_the_targets_own_next_token_at_each_position(models):
    """On replies the target itself wrote greedily, its argmax at a + k - 1 is the data's token a + k: both labels
    give the same loss and hits, bit for bit. On other replies they differ."""
    target, drafter = models
    greedy = collate(_greedy_rows(target, 3), np.array([0, 1, 2]), 64)
    a, b = _loss(drafter, target, greedy, "data"), _loss(drafter, target, greedy, "target_argmax")
    assert torch.equal(a.loss, b.loss) and torch.equal(a.correct, b.correct)
    other = collate(_dataset(), np.array([0, 1, 2]), 64)
    assert not torch.equal(_loss(drafter, target, other, "data").loss, _loss(drafter, target, other, "target_argmax").loss)


def test_the_greedy_path_ends_after_the_first_token_the_data_sampled_off_it():
    """Block 0 leaves the path at k = 2 (its k = 3 and 4 are off), block 1 never does, block 2's k = 2 is unsupervised
    (not used), so its k = 3 is off even though the token there is greedy; the anchor's own position is never used."""
    weights = torch.tensor([[[0, 1, 1, 1, 1], [0, 1, 1, 1, 0], [0, 1, 0, 1, 1]]]).float()
    used = weights.flatten() > 0
    greedy = torch.tensor([1, 0, 1, 1,  1, 1, 1,  1, 1, 1]).bool()  # per used position, in order
    on = greedy_path(weights.shape, used, greedy)
    assert on.tolist() == [True, True, False, False,  True, True, True,  True, False, False]


@pytest.mark.parametrize("path", ["on_greedy_path", "greedy"])
def test_argmax_labels_on_the_greedy_path(models, path):
    """On replies the target wrote greedily the data is the greedy path: either choice changes nothing, bit for bit.
    On sampled replies ``on_greedy_path`` drops the argmax label past each block's first off-path token, and
    ``greedy`` replaces it by the path's token: both change the loss."""
    target, drafter = models

    def loss(pack, argmax_path: str):
        features, final = pack_features(target, pack, drafter.target_layer_ids, final=True)
        chains = pack_chains(target, pack.input_ids, pack.loss_mask, pack.row_of, 3)
        return dflash_loss(drafter, features, pack, anchors_per_seq=4, gamma=4.0, labels={"target_argmax": 1.0},
                           generator=torch.Generator().manual_seed(1), target_final=final,
                           argmax_path=argmax_path, target_chains=chains).loss

    greedy = collate(_greedy_rows(target, 3), np.array([0, 1, 2]), 64)
    assert torch.equal(loss(greedy, path), loss(greedy, "data"))
    other = collate(_dataset(), np.array([0, 1, 2]), 64)
    assert not torch.equal(loss(other, path), loss(other, "data"))


@torch.no_grad()
def test_greedy_chains_are_what_greedy_decoding_from_each_position_gives(models):
    """Every supervised position's continuation, decoded at once over the KV cache, is token for token what
    step-by-step greedy decoding of the row up to that position gives (within the row). The replies are the
    target's own greedy ones with one token changed half-way, as sampled data leaves the path now and then: both
    ways of computing a chain are taken, the next position's shifted (the data's next token is the argmax) and
    decoded (it is not)."""
    target, _ = models
    ds = _greedy_rows(target, 2)
    for ids, mask in zip(ds["input_ids"], ds["loss_mask"]):
        off = mask.index(True) + 8
        ids = [*ids[:off], (ids[off] + 1) % (S.VOCAB - 2), *ids[off + 1:]]  # never eos (VOCAB - 2) or the mask
        ids_t, mask_t = torch.tensor(ids)[None], torch.tensor(mask)[None]
        argmax = target(input_ids=ids_t).logits[0].argmax(-1).tolist()
        supervised = [i for i in range(len(ids) - 1) if mask[i + 1]]
        follows = [i for i in supervised if ids[i + 1] == argmax[i]]
        assert len(follows) >= 4 and len(supervised) - len(follows) >= 1, (len(follows), len(supervised))
        chains = greedy_chains(target, ids_t, mask_t, 4)
        for i in (i for i in range(len(ids) - 1) if mask[i + 1]):
            x, want = ids_t[:, : i + 1], []
            for _ in range(min(4, len(ids) - 1 - i)):
                want.append(int(target(input_ids=x).logits[0, -1].argmax()))
                x = torch.cat([x, torch.tensor([[want[-1]]])], dim=1)
            assert chains[i, : len(want)].tolist() == want, i


def test_argmax_path_needs_an_argmax_label():
    with pytest.raises(ParamsError, match="argmax_path"):
        S.train_params(argmax_path="greedy")  # labels: data only
    labels = {"data": 0.0, "target_argmax": 0.5, "target_distribution": 1.0}
    assert S.train_params(argmax_path="on_greedy_path", labels=labels).argmax_path == "on_greedy_path"
    selector = dict(S.small_params()["dflash2"], selector_labels="target")
    assert S.train_params(argmax_path="greedy", architecture="dflash2", dflash2=selector).argmax_path == "greedy"


def test_the_target_distribution_loss_is_a_kl_that_training_lowers(models):
    target, drafter = models
    drafter = copy.deepcopy(drafter)
    pack = collate(_dataset(), np.array([0, 1, 2]), 64)
    before = _loss(drafter, target, pack, "target_distribution")
    assert before.loss > 0
    optimizer = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(20):
        optimizer.zero_grad()
        _loss(drafter, target, pack, "target_distribution").loss.backward()
        optimizer.step()
    assert 0 < _loss(drafter, target, pack, "target_distribution").loss < 0.8 * before.loss


@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, 5), (False, 7)])
def test_row_by_row_attention_is_the_dense_masks_attention(causal, window):
    """RowMasks computes, row by row, exactly what one dense mask over the whole pack allows."""
    ds = _dataset(4)
    pack = collate(ds, np.array([3, 0, 2, 1]), 64)
    anchors, keep = sample_anchors(pack.loss_mask, 3, torch.Generator().manual_seed(2), pack.row_of)
    starts = anchors - pack.positions.gather(1, anchors)
    s, B = pack.num_tokens, 4
    rows = row_masks(anchors, starts, s, B, causal=causal, window=window)
    dense = block_mask(anchors, keep, s, B, starts=starts, causal=causal, window=window)
    assert len(rows.masks) == 4
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, anchors.shape[1] * B, 8, generator=g)
    k, v = torch.randn(1, 2, s + q.shape[2], 8, generator=g), torch.randn(1, 2, s + q.shape[2], 8, generator=g)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=0.3)
    torch.testing.assert_close(rows.attend(q, k, v, 0.3), expected, atol=1e-6, rtol=1e-5)


def test_the_losses_add_up_by_their_weights(models):
    target, drafter = models
    pack = collate(_dataset(), np.array([0, 1, 2]), 64)
    features, final = pack_features(target, pack, drafter.target_layer_ids, final=True)

    def loss(**weights) -> float:
        return float(dflash_loss(drafter, features, pack, anchors_per_seq=4, gamma=4.0, labels=weights,
                                 generator=torch.Generator().manual_seed(3), target_final=final).loss)

    parts = {name: loss(**{name: 1.0}) for name in ("data", "target_argmax", "target_distribution")}
    assert len(set(parts.values())) == 3
    mixed = loss(data=0.2, target_argmax=0.5, target_distribution=1.5)
    assert mixed == pytest.approx(0.2 * parts["data"] + 0.5 * parts["target_argmax"] + 1.5 * parts["target_distribution"])


def test_label_weights_must_say_something():
    with pytest.raises(ParamsError, match="labels"):
        S.train_params(labels={"data": 0.0, "target_argmax": 0.0, "target_distribution": 0.0})
    with pytest.raises(ParamsError, match="labels"):
        S.train_params(labels={"data": 1.0, "target_argmax": -0.5, "target_distribution": 0.0})
    assert S.train_params(labels={"data": 0.0, "target_argmax": 0.0, "target_distribution": 1.0}).labels.from_target
