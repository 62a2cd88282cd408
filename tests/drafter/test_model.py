"""The DFlash drafter: z-lab checkpoint layout, exact reload, and training/decoding consistency."""

from __future__ import annotations

import json

import pytest
import torch
from drafter_support import lineage
from safetensors import safe_open
from transformers import Qwen3Config, Qwen3ForCausalLM

from draftline.drafter.config import build_target_layer_ids, make_config
from draftline.drafter.model import DFlashDrafter, target_features


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    target = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=128, hidden_size=32, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=64, initializer_range=0.2,
    )).eval()
    config = make_config(target.config, num_layers=2, block_size=4, mask_token_id=127,
                         lineage=lineage(), target_layer_ids=build_target_layer_ids(6, 3))
    drafter = DFlashDrafter(config).bind(target).eval()
    # Norm weights start at one; perturb them so that a wrongly loaded norm would show.
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    ids = torch.randint(0, 120, (1, 20))
    with torch.no_grad():
        feats = target_features(target(ids, output_hidden_states=True).hidden_states, drafter.target_layer_ids)
    return target, drafter, ids, feats


def test_target_layer_ids_spread_from_1_to_l_minus_3():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(6, 3) == [1, 2, 3]
    assert build_target_layer_ids(8, 1) == [4]


def test_checkpoint_follows_zlab_layout(pair, tmp_path):
    _, drafter, _, _ = pair
    drafter.save_pretrained(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["model_type"] == "qwen3"
    assert config["block_size"] == 4 and config["num_target_layers"] == 6 and config["num_hidden_layers"] == 2
    assert config["dflash_config"] == {"target_layer_ids": [1, 2, 3], "mask_token_id": 127}
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "rms_norm_eps", "vocab_size", "rope_parameters"):
        assert key in config
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert tuple(f.get_tensor("fc.weight").shape) == (32, 3 * 32)
    layer = {"input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
             "mlp.up_proj.weight", "mlp.down_proj.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
             "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
             "self_attn.k_norm.weight"}
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {f"layers.{i}.{n}" for i in range(2) for n in layer}
    assert names == expected  # nothing of the target (embed_tokens, lm_head) is saved


def test_reload_gives_identical_logits(pair, tmp_path):
    target, drafter, ids, feats = pair
    drafter.save_pretrained(tmp_path / "ckpt")
    again = DFlashDrafter.from_pretrained(tmp_path / "ckpt", target)
    a = drafter.draft_logits(feats[:, :12], ids[:, 12], drafter.new_cache())
    b = again.draft_logits(feats[:, :12], ids[:, 12], again.new_cache())
    assert a.shape == (1, 3, 128)
    assert torch.equal(a, b)


def test_cached_drafting_equals_recomputing(pair):
    _, drafter, ids, feats = pair
    cache = drafter.new_cache()
    drafter.draft_logits(feats[:, :9], ids[:, 9], cache)
    step = drafter.draft_logits(feats[:, 9:14], ids[:, 14], cache)
    assert cache.length == 14
    fresh = drafter.draft_logits(feats[:, :14], ids[:, 14], drafter.new_cache())
    torch.testing.assert_close(step, fresh, rtol=1e-5, atol=1e-5)


DFLASH2 = {"conv_kernel_size": 3, "conv_group_size": 8, "selector_rank": 4, "selector_top_k": 5}


@pytest.fixture(scope="module", params=["dflash", "dflash2", "dflash2-sliding"])
def variant(request, pair):
    """The drafter of ``pair``, and DFlash 2 ones (with a sliding-window layer) whose new parts are off their start."""
    target, drafter, ids, feats = pair
    if request.param == "dflash":
        return target, drafter, ids, feats
    window = {"sliding_window": 5, "max_window_layers": 1} if request.param.endswith("sliding") else {}
    config = make_config(target.config, num_layers=2, block_size=4, mask_token_id=127, lineage=lineage(),
                         target_layer_ids=drafter.target_layer_ids, architecture="dflash2", dflash2=DFLASH2, **window)
    torch.manual_seed(1)
    d2 = DFlashDrafter(config).bind(target).eval()
    with torch.no_grad():
        for name, p in d2.named_parameters():
            if "conv" in name or "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return target, d2, ids, feats


def test_training_blocks_match_decoding(variant):
    """A block trained at anchor a sees exactly what decoding shows it when a is the last accepted token: the
    convolutions never reach into the previous block, a sliding layer's training mask is its decoding mask."""
    from draftline.train.data import Batch
    from draftline.train.objective import draft_blocks

    _, drafter, ids, feats = variant
    B, s = drafter.block_size, ids.shape[1]
    anchors = torch.tensor([[3, 10, 15]])
    row = Batch(ids, torch.ones_like(ids, dtype=torch.bool), torch.zeros_like(ids), torch.arange(s)[None])
    with torch.no_grad():
        train_logits = drafter.logits(draft_blocks(drafter, feats, row, anchors)).view(1, 3, B, -1)[:, :, 1:]
    for j, a in enumerate(anchors[0].tolist()):
        decode = drafter.draft_logits(feats[:, :a], ids[:, a], drafter.new_cache())
        torch.testing.assert_close(train_logits[:, j], decode, rtol=1e-4, atol=1e-5)


def test_unbound_drafter_says_what_to_do(pair):
    _, drafter, _, _ = pair
    bare = DFlashDrafter(drafter.config)
    with pytest.raises(RuntimeError, match="bind"):
        bare.embed(torch.tensor([[1]]))


def test_features_are_raw_layer_outputs_and_the_last_layer_is_refused(pair):
    """hidden_states[i + 1] is layer i's own output for i < L-1; transformers norms the last entry, so L-1 is refused."""
    target, _, ids, _ = pair
    outputs = []
    hooks = [layer.register_forward_hook(lambda m, i, o: outputs.append(o[0] if isinstance(o, tuple) else o))
             for layer in target.model.layers]
    try:
        with torch.no_grad():
            hs = target(ids, output_hidden_states=True).hidden_states
    finally:
        for h in hooks:
            h.remove()
    for i in range(len(outputs) - 1):
        torch.testing.assert_close(target_features(hs, [i]), outputs[i])
    with pytest.raises(ValueError, match="last layer"):
        make_config(target.config, num_layers=1, block_size=4, mask_token_id=127, lineage=lineage(), target_layer_ids=[1, 5])


def test_the_selector_samples_from_the_probabilities_it_returns(pair):
    """select() at a temperature: each position drawn from ``probs`` over its candidates (a fresh selector's are the
    softmax of the top-K logits at that temperature), reproducibly from the generator; greedy: the best score."""
    target, drafter, ids, feats = pair
    config = make_config(target.config, num_layers=2, block_size=4, mask_token_id=127, lineage=lineage(),
                         target_layer_ids=drafter.target_layer_ids, architecture="dflash2", dflash2=DFLASH2)
    torch.manual_seed(2)
    d2 = DFlashDrafter(config).bind(target).eval()
    block = d2.draft(feats[:, :12], ids[:, 12], d2.new_cache())
    draws = [d2.select(block, ids[:, 12], 0.7, torch.Generator().manual_seed(s)) for s in (0, 0, 1)]
    path, candidates, probs = draws[0]
    assert torch.equal(path, draws[1][0])
    top = block.logits.topk(DFLASH2["selector_top_k"], dim=-1)
    assert torch.equal(candidates, top.indices)
    torch.testing.assert_close(probs, torch.softmax(top.values / 0.7, dim=-1))
    assert bool((candidates == path[..., None]).any(-1).all())
    greedy_path, _, _ = d2.select(block, ids[:, 12])
    assert torch.equal(greedy_path, block.logits.argmax(-1))
    with pytest.raises(ValueError, match="DFlash 2"):
        drafter.select(drafter.draft(feats[:, :12], ids[:, 12], drafter.new_cache()), ids[:, 12])
