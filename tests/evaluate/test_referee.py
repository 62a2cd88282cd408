"""The referee: z-lab's own decoding loop (``dflash.model.dflash_generate`` from the real ``dflash`` 0.1.0 package,
unchanged) on our drafter checkpoint and target gives the same acceptance lengths as ours, prompt for prompt.

The drafter is trained here for a few seconds on the tiny target's own greedy continuations, so that some steps
accept several tokens and the comparison is not a list of ones (a random tiny target is hard to predict: most
steps still accept none). Where the two loops disagree, ours is wrong
until shown otherwise. Never skipped: a missing ``dflash`` or another version than 0.1.0 fails, naming the fix
(scripts/install.sh installs it, without deps).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from drafter_support import VOCAB, args, make_merged, make_target, train, train_params, zlab_dflash

from draftline.core.target_loader import load_model, load_target
from draftline.drafter.model import DFlashDrafter
from draftline.drafter.speculative import DFlashProposer, greedy_generate, speculative_generate

dflash = zlab_dflash()

MAX_NEW = 40


def target_rows(target, n: int, seed: int) -> dict[str, list]:
    """Random prompts and the target's greedy continuation of each: what the generate stage would produce."""
    g = torch.Generator().manual_seed(seed)
    rows = {"id": [], "source": [], "input_ids": [], "loss_mask": [], "num_tokens": [], "num_loss_tokens": []}
    for i in range(n):
        prompt = torch.randint(1, VOCAB - 3, (6,), generator=g).tolist()
        reply = greedy_generate(target, prompt, MAX_NEW).tokens
        rows["id"].append(f"r{i}")
        rows["source"].append("synthetic")
        rows["input_ids"].append(prompt + reply)
        rows["loss_mask"].append([False] * len(prompt) + [True] * len(reply))
        rows["num_tokens"].append(len(prompt) + len(reply))
        rows["num_loss_tokens"].append(len(reply))
    return rows


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("referee")
    info_path = make_target(root, initializer_range=0.05)
    target = load_model(load_target(info_path))
    torch.set_num_threads(1)
    make_merged(root, target_rows(target, 96, seed=0))
    train(train_params(max_steps=150, lr=3e-3, bf16=False, save_every=1000), args(root))
    return root


def test_zlab_dflash_generate_gives_our_acceptance_lengths(trained, monkeypatch):
    # Its statistics time with torch.cuda.synchronize(); on the CPU the same clock without the synchronize. The
    # decoding loop itself runs unchanged.
    import time

    monkeypatch.setattr(dflash, "_cuda_time", time.perf_counter)
    info = load_target(trained / "data" / "target" / "target.json")
    target = load_model(info)
    ckpt = trained / "data" / "checkpoints"
    ours = DFlashProposer(DFlashDrafter.from_pretrained(ckpt, target))
    theirs = dflash.DFlashDraftModel.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    assert theirs.block_size == ours.block_size and list(theirs.target_layer_ids) == list(ours.target_layer_ids)
    assert theirs.mask_token_id == info.mask_token_id
    g = torch.Generator().manual_seed(1)
    ours_all, theirs_all = [], []
    for _ in range(6):
        prompt = torch.randint(1, VOCAB - 3, (6,), generator=g)
        mine = speculative_generate(target, ours, prompt.tolist(), MAX_NEW, stop_ids=())
        ref = dflash.dflash_generate(theirs, target, prompt[None], MAX_NEW, None, temperature=0.0, return_stats=True)
        assert ref.output_ids[0, len(prompt):].tolist() == mine.tokens
        assert ref.acceptance_lengths == mine.produced
        ours_all += mine.produced
        theirs_all += ref.acceptance_lengths
    # A drafter that accepts: the comparison covers multi-token steps (a whole block among them), not only ones.
    assert sum(n > 1 for n in theirs_all) >= 5 and max(theirs_all) >= 4, json.dumps(theirs_all)
