"""DFlash 2 training on a tiny target: from scratch and warm-started from a DFlash 1 drafter (step 0 of a warm start:
``test_warm_start.py``), the selector loss and its figures, and starting drafters that do not fit, refused naming
``train.init_from``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import drafter_support as S
import numpy as np
import pytest
import torch

from draftline.core.params import ParamsError
from draftline.drafter.config import build_target_layer_ids, make_config
from draftline.drafter.model import DFlashDrafter
from draftline.train.data import collate
from draftline.train.greedy import pack_chains
from draftline.train.objective import SelectorObjective, dflash_loss, pack_features, selector_loss
from draftline.train.params import TrainParams


@pytest.fixture
def train(monkeypatch):
    def run(cfg, root: Path, **paths):
        monkeypatch.setenv("DRAFTLINE_CACHE", str(S.cache(root)))
        return S.train(cfg, S.args(root, **paths))

    return run


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train2")
    S.make_target(root)
    S.make_merged(root, S.make_rows(96))
    return root


def _copy_inputs(src: Path, dst: Path) -> Path:
    for sub in ("data/target", "data/merged"):
        os.makedirs(dst / sub, exist_ok=True)
        subprocess.run(["cp", "-r", f"{src / sub}/.", str(dst / sub)], check=True)
    return dst


def dflash2(**overrides) -> dict:
    return {**S.small_params()["dflash2"], **overrides}


def _fresh_dflash2(workdir, **overrides):
    """The tiny target, a fresh 1-layer DFlash 2 drafter bound to it (seed 0; ``dflash2`` values overridden), and a
    batch of 4 training rows."""
    from transformers import Qwen3ForCausalLM

    from draftline.core.dataset import load_training_set

    target = Qwen3ForCausalLM.from_pretrained(workdir / "target-model").eval()
    config = make_config(target.config, num_layers=1, block_size=8, mask_token_id=S.MASK_ID, lineage=S.lineage(),
                         target_layer_ids=[1, 3], architecture="dflash2", dflash2=dflash2(**overrides))
    torch.manual_seed(0)
    drafter = DFlashDrafter(config).bind(target)
    dataset, order, _ = load_training_set(workdir / "data" / "merged")
    return target, drafter, collate(dataset, order[:4], 64)


@pytest.fixture(scope="module")
def trained(workdir):
    """:func:`_fresh_dflash2`'s drafter after 60 Adam steps on its batch, learning the data's tokens and the
    target's argmax. A fresh drafter hits nothing and ranks no gold in its top K: every count is 0 whatever the
    labels, so no comparison of counts could fail on it."""
    target, drafter, batch = _fresh_dflash2(workdir)
    feats, final = pack_features(target, batch, [1, 3], final=True)
    optimizer = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    for step in range(60):
        optimizer.zero_grad()
        dflash_loss(drafter, feats, batch, anchors_per_seq=4, gamma=4.0, generator=torch.Generator().manual_seed(step),
                    labels={"data": 1.0, "target_argmax": 1.0}, target_final=final,
                    selector=SelectorObjective(1.0, "target")).loss.backward()
        optimizer.step()
    return target, drafter.requires_grad_(False), batch


def test_the_selector_loss_trains_the_selector_alone_unless_told_to_train_the_drafter(workdir):
    """The selector's loss reaches the selector's weights and leaves the drafter's layers to the block loss; with
    ``selector_trains_drafter`` it reaches the layers too."""
    target, drafter, batch = _fresh_dflash2(workdir)
    feats, _ = pack_features(target, batch, [1, 3])

    def grads(weight, gold_outside_top_k="drop", trains_drafter=False):
        drafter.zero_grad()
        stats = dflash_loss(drafter, feats, batch, anchors_per_seq=4, gamma=4.0,
                            generator=torch.Generator().manual_seed(0),
                            selector=SelectorObjective(weight, outside_top_k=gold_outside_top_k,
                                                       trains_drafter=trains_drafter))
        stats.loss.backward()
        return stats, {n: p.grad.clone() if p.grad is not None else None for n, p in drafter.named_parameters()}

    base, g0 = grads(0.0)
    with_selector, g1 = grads(1.0)
    loss, in_top, picks, labels = with_selector.selector.tolist()
    assert labels > 0 and 0 < in_top <= labels and picks <= in_top and loss > 0
    for name, g in g0.items():
        if "candidate_selector" in name:
            assert g is None or not g.any()
            assert g1[name] is not None
        else:
            torch.testing.assert_close(g1[name], g, rtol=0, atol=0)
    assert g1["candidate_selector.successor_codebook"].abs().sum() > 0  # the zero codebook gets to move
    # Inserted, a gold token outside the top K is the K-th candidate: every label counts, the loss is larger
    # (the inserted gold has a low logit), recall and accuracy are counted on the true top K as before.
    inserted, _ = grads(1.0, "insert")
    i_loss, i_in_top, i_picks, i_labels = inserted.selector.tolist()
    assert (i_in_top, i_labels) == (in_top, labels) and i_loss > loss
    assert float(inserted.loss) > float(with_selector.loss)
    # selector_trains_drafter: the same loss, and now it also moves the layers (speculators' way); the selector's
    # own gradients are those of the detached loss.
    through, g2 = grads(1.0, trains_drafter=True)
    torch.testing.assert_close(through.loss, with_selector.loss, rtol=0, atol=0)
    moved = [n for n, g in g2.items() if "candidate_selector" not in n and not torch.equal(g, g0[n])]
    assert any(n.startswith("layers.") for n in moved)
    for name in (n for n in g1 if "candidate_selector" in n):
        torch.testing.assert_close(g2[name], g1[name])


def test_selector_labels_from_the_target_are_its_greedy_choice_at_each_label(trained):
    """``selector_labels: target``: the selector's gold for token j is the target's argmax from position j - 1.
    On replies the target wrote greedily that choice is the data's token, so the loss and counts are exactly the
    data labels'; on other replies the target's choices differ from the data somewhere and give other counts; the
    block loss never changes. Each side is computed as the trainer computes it: with ``data`` labels the target's
    last hidden state is not read, so its counts are against the data's tokens, the other's against the target's
    choices."""
    target, drafter, batch = trained

    def stats(pack, selector_labels):
        feats, final = pack_features(target, pack, [1, 3], final=selector_labels != "data")
        with torch.no_grad():
            return dflash_loss(drafter, feats, pack, anchors_per_seq=4, gamma=4.0,
                               generator=torch.Generator().manual_seed(0),
                               selector=SelectorObjective(1.0, selector_labels), target_final=final)

    data, real = stats(batch, "data"), stats(batch, "target")
    assert data.correct.sum() > 0 and real.correct.sum() > 0 and data.selector[1] > 0 < real.selector[1]
    assert not torch.equal(real.selector, data.selector)
    assert not torch.equal(real.correct, data.correct)  # the target's choices are not the data's here
    block_loss = float(data.loss) - float(data.selector[0])
    assert abs(float(real.loss) - float(real.selector[0]) - block_loss) < 1e-5
    prompts = [ids[: int((~mask).sum())] for ids, mask in zip(batch.input_ids[0].split(
        torch.bincount(batch.row_of[0]).tolist()), batch.loss_mask[0].split(torch.bincount(batch.row_of[0]).tolist()))]
    greedy = collate(S.greedy_rows(target, [p.tolist() for p in prompts]), np.arange(4), 64)
    on_greedy, on_data = stats(greedy, "target"), stats(greedy, "data")
    assert torch.equal(on_greedy.selector, on_data.selector) and torch.equal(on_greedy.correct, on_data.correct)


@pytest.mark.parametrize("path", ["on_greedy_path", "greedy"])
def test_the_selectors_target_label_on_the_greedy_path(trained, path):
    """``argmax_path`` with ``selector_labels: target``: the selector's hard label is kept only on the target's
    greedy path, or is that path's token (its predecessor the path's too), so on sampled replies its loss changes;
    a soft label from the target, for sampled walks, is left as it is: its argmax share (half here) and its counts
    stay those of the target's distribution after the data's tokens (nonzero here: a trained drafter's top K holds
    the target's choice at some positions)."""
    target, drafter, batch = trained
    feats, final = pack_features(target, batch, [1, 3], final=True)
    chains = pack_chains(target, batch.input_ids, batch.loss_mask, batch.row_of, 7)

    def selector(labels, argmax_path):
        with torch.no_grad():
            return dflash_loss(drafter, feats, batch, anchors_per_seq=4, gamma=4.0, labels={"target_distribution": 1.0},
                               generator=torch.Generator().manual_seed(0), target_final=final,
                               selector=SelectorObjective(1.0, labels, 0.5 if labels == "target_distribution" else 0.0,
                                                          outside_top_k="insert"),
                               argmax_path=argmax_path, target_chains=chains).selector

    assert not torch.equal(selector("target", path)[0], selector("target", "data")[0])
    soft = selector("target_distribution", "data")
    assert soft[1] > 0 and soft[2] > 0  # the target's choice in the top K, and picked, somewhere
    assert torch.equal(selector("target_distribution", path), soft)


def test_dflash2_trains_from_scratch_and_from_a_dflash1_drafter(tmp_path, workdir, train):
    root = _copy_inputs(workdir, tmp_path / "a")
    torch.set_num_threads(1)
    first = train(S.train_params(epochs=3, log_every=5), root)
    d1 = root / "data" / "drafters" / "round1"
    d1.parent.mkdir(parents=True)
    subprocess.run(["cp", "-r", str(root / "data" / "checkpoints"), str(d1)], check=True)

    scratch = train(S.train_params(epochs=3, log_every=5, architecture="dflash2"), root)
    report = scratch.details
    assert report["architecture"] == "dflash2" and report["init_from"] is None
    assert 0 < report["selector_accuracy"] <= report["topk_recall"] <= 1
    header = (root / "plots" / "train_loss.csv").read_text().splitlines()[0]
    assert header.endswith("selector_loss,topk_recall,selector_accuracy")
    config = json.loads((root / "data" / "checkpoints" / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"]

    # Warm-started (the selector's loss off, so the loss is the block loss alone), the first logged loss is near the
    # trained DFlash 1 drafter's last, below a fresh drafter's first.
    warm = train(S.train_params(epochs=3, log_every=1, architecture="dflash2", init_from=str(d1),
                                dflash2=dflash2(selector_loss_weight=0.0)), root)
    assert warm.details["init_from"]["architecture"] == "dflash"
    assert warm.details["first_loss"] < min(0.9 * first.details["first_loss"], 1.1 * first.details["final_loss"])


@pytest.mark.parametrize("field,change", [
    ("mask_token_id", lambda c: c["dflash_config"].update(mask_token_id=3)),
    ("target_layer_ids", lambda c: c["dflash_config"].update(target_layer_ids=[0, 2])),
    ("hidden_size", lambda c: c.update(hidden_size=32, head_dim=8)),
    ("vocab_size", lambda c: c.update(vocab_size=300)),
    ("block_size", lambda c: c.update(block_size=16)),
    ("tokenizer_fingerprint", lambda c: c["draftline"].update(tokenizer_fingerprint="0" * 64)),
    ("records no mask_token_id", lambda c: c["dflash_config"].pop("mask_token_id")),
])
def test_a_starting_drafter_that_does_not_fit_is_refused_naming_the_field(tmp_path, workdir, train, field, change):
    from transformers import Qwen3ForCausalLM

    target = Qwen3ForCausalLM.from_pretrained(workdir / "target-model")
    layer_ids = build_target_layer_ids(6, 3)  # what the run's target_layers=3 picks on the 6-layer target: all fits but `field`
    config = make_config(target.config, num_layers=1, block_size=8, mask_token_id=S.MASK_ID, lineage=S.lineage(),
                         target_layer_ids=layer_ids)
    root = _copy_inputs(workdir, tmp_path / "p")
    folder = root / "data" / "drafters" / "bad"
    DFlashDrafter(config).save_pretrained(folder)
    raw = json.loads((folder / "config.json").read_text())
    change(raw)
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ParamsError, match=rf"train\.init_from .*{field}"):
        train(S.train_params(max_steps=1, init_from=str(folder)), root)


def test_a_starting_drafter_outside_the_tracked_folder_is_refused_with_the_fix(tmp_path, workdir, train):
    """DVC cannot see a drafter outside data/drafters change: refused before anything runs, naming the commands."""
    from draftline.core.tracked import Untracked

    root = _copy_inputs(workdir, tmp_path / "p")
    outside = tmp_path / "elsewhere" / "round1"
    with pytest.raises(Untracked, match=r"train\.init_from .* is outside .*data/drafters.*cp -r .* && dvc add"):
        train(S.train_params(max_steps=1, init_from=str(outside)), root)
    assert not (root / "data" / "checkpoints").exists()


def test_params_name_a_bad_dflash2_section():
    with pytest.raises(ParamsError, match="gold_outside_top_k"):
        TrainParams.parse(S.small_params(dflash2=dflash2(gold_outside_top_k="keep")), "train")
    with pytest.raises(ParamsError, match="selector_argmax_share is read only with selector_labels: target_distribution"):
        TrainParams.parse(S.small_params(dflash2=dflash2(selector_labels="target", selector_argmax_share=0.5)), "train")
    with pytest.raises(ParamsError, match="max_window_layers"):
        TrainParams.parse(S.small_params(sliding_window=8, max_window_layers=1), "train")


def test_the_same_dflash2_params_give_the_same_checkpoint_bytes(tmp_path, workdir, train):
    """Same params, same bytes; the target's labels, cached or computed online at every step, train the same weights
    (and other weights than the data's labels)."""
    runs = {"a": {}, "b": {}, "target cached": {"selector_labels": "target"},
            "target online": {"selector_labels": "target", "feature_cache_gb": 0}}
    outs = {}
    for name, change in runs.items():
        root = _copy_inputs(workdir, tmp_path / name.replace(" ", "-"))
        labels = change.get("selector_labels", "data")
        train(S.train_params(max_steps=6, architecture="dflash2", sliding_window=16, max_window_layers=0,
                             dflash2=dflash2(selector_labels=labels), feature_cache_gb=change.get("feature_cache_gb", 1.0)),
              root)
        outs[name] = (root / "data" / "checkpoints" / "model.safetensors").read_bytes()
    assert outs["a"] == outs["b"] and outs["target cached"] == outs["target online"] != outs["a"]


def test_dflash2_under_two_process_gloo_ddp(tmp_path, workdir):
    """The selector's loss is computed beside DDP's forward: every rank's selector still gets (and all-reduces) its
    gradients, and the run finishes with the selector's figures."""
    import sys

    root = _copy_inputs(workdir, tmp_path)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{repo / 'src'}:{repo / 'tests'}", "OMP_NUM_THREADS": "1",
           "DRAFTLINE_CACHE": str(S.cache(root))}
    params = S.small_params(gpus=2, epochs=1, log_every=2, architecture="dflash2")
    done = subprocess.run([sys.executable, str(repo / "tests" / "drafter_support.py"), str(root), json.dumps(params)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((root / "reports" / "train.json").read_text())
    assert report["architecture"] == "dflash2" and 0 <= report["selector_accuracy"] <= 1


def test_an_argmax_share_of_one_makes_the_soft_label_the_hard_one(workdir):
    """``selector_argmax_share``: 1 turns the target's distribution into the one-hot of its argmax (here a candidate
    everywhere), so the loss is the hard ``target`` label's; 0 keeps the distribution, a different loss."""
    _, drafter, _ = _fresh_dflash2(workdir)
    g = torch.Generator().manual_seed(0)
    n = 6
    hidden = torch.randn(n, drafter.config.hidden_size, generator=g)
    logits = torch.randn(n, drafter.config.vocab_size, generator=g)
    target_logits = logits * 2  # the same argmax: a candidate at every position
    gold, previous, w = target_logits.argmax(-1), torch.zeros(n, dtype=torch.long), torch.ones(n)

    def loss(objective, soft=None):
        return selector_loss(drafter, hidden, logits, previous, gold, w, objective, soft)[0]

    hard = loss(SelectorObjective(labels="target"))
    torch.testing.assert_close(loss(SelectorObjective(labels="target_distribution", argmax_share=1.0), target_logits),
                               hard)
    assert not torch.allclose(loss(SelectorObjective(labels="target_distribution"), target_logits), hard)
