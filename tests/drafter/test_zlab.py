"""DFlash 2 checkpoints as z-lab's own code reads them: ``dflash`` 0.1.0's ``DFlash2DraftModel.from_pretrained`` loads
the folder with no missing or unexpected keys, and its ``dflash_generate`` drafts and accepts, prompt for prompt, what
draftline's drafter does (greedy; its selector path and its logits' argmax path). Never skipped: a missing ``dflash``
or another version than 0.1.0 fails, naming the fix (``pip install --no-deps dflash==0.1.0``)."""

from __future__ import annotations

import json
import time

import pytest
import torch
from drafter_support import lineage, zlab_dflash
from transformers import AutoModel, Qwen3Config, Qwen3ForCausalLM

from draftline.drafter.config import make_config
from draftline.drafter.model import DFlashDrafter, target_features

zlab = zlab_dflash()

VOCAB, BLOCK, MASK, MAX_NEW = 96, 4, 95, 24
DFLASH2 = {"conv_kernel_size": 3, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 6}


def tiny_target() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, initializer_range=0.2,
    )).eval()


def trained_like(drafter: DFlashDrafter, seed: int) -> DFlashDrafter:
    """Every weight moved off its start (identity convolutions and a zero successor codebook would hide a wrongly
    loaded or wrongly applied part): a stand-in for a trained DFlash 2 drafter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            scale = 0.3 if ("conv" in name or "codebook" in name or "norm" in name) else 0.0
            scale = 3.0 if "hidden_projection" in name else scale  # a pairwise term that outvotes the logits
            p.add_(scale * torch.randn(p.shape, generator=g))
    return drafter


@pytest.fixture(scope="module", params=["full", "sliding"])
def saved(request, tmp_path_factory):
    target = tiny_target()
    window = {"sliding_window": 6, "max_window_layers": 1} if request.param == "sliding" else {}
    config = make_config(target.config, num_layers=2, block_size=BLOCK, mask_token_id=MASK, lineage=lineage(),
                         target_layer_ids=[1, 3], architecture="dflash2", dflash2=DFLASH2, **window)
    torch.manual_seed(1)
    drafter = trained_like(DFlashDrafter(config).bind(target).eval(), seed=2)
    folder = tmp_path_factory.mktemp("d2") / "drafter"
    drafter.save_pretrained(folder, dtype=torch.float32)
    return target, DFlashDrafter.from_pretrained(folder, target), folder


def test_the_checkpoint_is_in_z_labs_dflash2_layout(saved):
    _, _, folder = saved
    raw = json.loads((folder / "config.json").read_text())
    assert raw["architectures"] == ["DFlash2DraftModel"]
    assert raw["auto_map"] == {"AutoModel": "modeling_dflash.DFlash2DraftModel"}
    assert raw["dflash_config"] == {"block_size": BLOCK, **DFLASH2, "mask_token_id": MASK, "target_layer_ids": [1, 3]}


def test_z_labs_dflash2_draft_model_loads_every_tensor(saved):
    _, _, folder = saved
    model, info = zlab.DFlash2DraftModel.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ours = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32)
    assert type(ours).__name__ == "DFlash2DraftModel"
    theirs = {k: v for k, v in model.state_dict().items()}
    for name, tensor in ours.state_dict().items():
        zname = name + ".weight" if name.endswith("codebook") else name
        assert torch.equal(theirs[zname], tensor), name


def z_lab_block(model, target, features, block_ids, positions, cache):
    hidden = model(target_hidden=features, noise_embedding=target.get_input_embeddings()(block_ids),
                   position_ids=positions, past_key_values=cache, use_cache=True)[:, 1:]
    return hidden


def test_z_labs_forward_and_selector_equal_ours(saved):
    target, drafter, folder = saved
    model = zlab.DFlash2DraftModel.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.randint(0, VOCAB - 2, (1, 14), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        feats = target_features(target(ids, output_hidden_states=True).hidden_states, [1, 3])
        cache, ours_cache = zlab._make_cache(model.config), drafter.new_cache()
        differs = False
        for start, end in ((0, 8), (8, 14)):  # the prompt, then 6 accepted tokens
            block = torch.full((1, BLOCK), MASK)
            block[0, 0] = ids[0, end - 1]
            hidden = z_lab_block(model, target, feats[:, start:end], block, torch.arange(start, end + BLOCK)[None],
                                 cache)
            zlab._crop_to(cache, end)
            path, candidates, _ = model.propose(hidden, block[:, 0], target.lm_head, 0.0)
            ours = drafter.draft(feats[:, start:end], block[:, 0], ours_cache)
            torch.testing.assert_close(ours.hidden, hidden, rtol=1e-5, atol=1e-5)
            our_path, our_candidates, _ = drafter.select(ours, block[:, 0])
            assert torch.equal(our_path, path)
            assert set(our_candidates.flatten().tolist()) == set(candidates.flatten().tolist())
            assert ours_cache.length == end
            differs = differs or not torch.equal(our_path, ours.logits.argmax(-1))
    assert differs  # the selector's path is not the logits' argmax: a DFlash 1 path would fail the test


def test_dflash_generate_accepts_what_draftline_accepts(saved, monkeypatch):
    """Prompt for prompt: the same tokens and the same acceptance lengths from z-lab's loop and draftline's.

    At a reply's last step z-lab drafts a block shortened to the tokens still wanted, draftline a whole block cut
    at verification; the non-causal block then differs, so that one step's acceptance may too: compared up to it."""
    from draftline.drafter.speculative import DFlashProposer, speculative_generate

    target, drafter, folder = saved
    model = zlab.DFlash2DraftModel.from_pretrained(folder, dtype=torch.float32).eval()
    monkeypatch.setattr(zlab, "_cuda_time", time.perf_counter)  # its timer synchronises CUDA; the loop is untouched
    g = torch.Generator().manual_seed(7)
    steps = 0
    for _ in range(4):
        prompt = torch.randint(0, VOCAB - 2, (int(torch.randint(5, 12, (1,), generator=g)),), generator=g).tolist()
        theirs = zlab.dflash_generate(model, target, torch.tensor([prompt]), MAX_NEW, [VOCAB - 2], return_stats=True)
        ours = speculative_generate(target, DFlashProposer(drafter), prompt, MAX_NEW, [VOCAB - 2])
        assert theirs.output_ids[0, len(prompt):].tolist() == ours.tokens
        assert theirs.acceptance_lengths[:-1] == ours.produced[:-1]
        assert len(theirs.acceptance_lengths) == len(ours.produced)
        steps += len(ours.produced)
    assert steps < 4 * MAX_NEW  # the drafts were accepted at times: acceptance lengths above one were compared


def test_z_labs_dflash1_draft_model_loads_a_dflash1_checkpoint(tmp_path):
    target = tiny_target()
    config = make_config(target.config, num_layers=2, block_size=BLOCK, mask_token_id=MASK, lineage=lineage(),
                         target_layer_ids=[1, 3])
    torch.manual_seed(1)
    drafter = trained_like(DFlashDrafter(config).bind(target).eval(), seed=3)
    drafter.save_pretrained(tmp_path / "d1", dtype=torch.float32)
    model, info = zlab.DFlashDraftModel.from_pretrained(tmp_path / "d1", dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ids = torch.randint(0, VOCAB - 2, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        feats = target_features(target(ids, output_hidden_states=True).hidden_states, [1, 3])
        block = torch.full((1, BLOCK), MASK)
        block[0, 0] = ids[0, -1]
        theirs = z_lab_block(model.eval(), target, feats, block, torch.arange(9 + BLOCK)[None], None)
        ours = drafter.draft(feats, block[:, 0], drafter.new_cache())
    torch.testing.assert_close(ours.hidden, theirs, rtol=1e-5, atol=1e-5)
