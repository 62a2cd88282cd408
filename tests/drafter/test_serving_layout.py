"""A replay of how SGLang and vLLM map a DFlash checkpoint's tensors onto their fused serving layers, written from
their source (they need a GPU, so their loaders cannot run here):

- SGLang ``python/sglang/srt/models/dflash.py`` (read at commit 003b23d7): ``DFlashDraftModel.load_weights`` stacks ``q_proj`` /
  ``k_proj`` / ``v_proj`` into ``qkv_proj`` (shards q, k, v) and ``gate_proj`` / ``up_proj`` into ``gate_up_proj``
  (shards 0, 1), strips or adds a ``model.`` prefix, checks ``fc.weight``'s shape against the number of context
  features, and silently skips any tensor it cannot place (so a misnamed tensor would serve random weights);
- vLLM ``vllm/model_executor/models/qwen3_dflash.py`` (read at commit 036a00d1): ``DFlashQwen3Model.hf_to_vllm_mapper``
  maps the same suffixes
  (``orig_to_new_stacked``) and renames ``midlayer.`` / ``encoder.fc.`` / ``encoder.output_norm_enc.``;
  ``_dflash_layer_causal`` makes a layer causal only when ``is_causal``, ``dflash_config.causal`` or a sliding
  ``layer_types`` entry says so.

Cited by symbol: the stored copies could not be checked out here to pin line numbers. The replay asserts what
those loaders leave unchecked: every tensor lands in a parameter, every fused parameter is
filled by all its shards at the shapes their layers allocate, and the drafter's layers are non-causal.
"""

from __future__ import annotations

import json

import pytest
import torch
from drafter_support import lineage
from safetensors import safe_open
from transformers import Qwen3Config, Qwen3ForCausalLM

from draftline.drafter.config import make_config
from draftline.drafter.model import DFlashDrafter

STACKED = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
           "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def serving_params(config: dict) -> dict[str, tuple[int, ...]]:
    """The parameters (and shapes) SGLang's and vLLM's DFlash modules allocate for this config (tp_size 1)."""
    h, heads, kv, hd, inter = (config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                                   "head_dim", "intermediate_size"))
    n_features = len(config["dflash_config"]["target_layer_ids"])
    params = {"norm.weight": (h,), "hidden_norm.weight": (h,), "fc.weight": (h, n_features * h)}
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        params |= {
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.qkv_proj.weight": ((heads + 2 * kv) * hd, h), p + "self_attn.o_proj.weight": (h, heads * hd),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_up_proj.weight": (2 * inter, h), p + "mlp.down_proj.weight": (h, inter),
        }
    return params


def replay_load(tensors: dict[str, torch.Tensor], params: dict[str, tuple[int, ...]]) -> dict[str, list]:
    """Where each tensor goes under the stacked mapping: ``{param: [(shard, shape), ...]}``; unplaced ones raise."""
    placed: dict[str, list] = {}
    for name, tensor in tensors.items():
        for weight, (fused, shard) in STACKED.items():
            if f".{weight}." in name:
                target, shard_id = name.replace(weight, fused), shard
                break
        else:
            target, shard_id = name, None
        target = target.removeprefix("model.")
        assert target in params, f"{name} has no place in the serving model: SGLang would skip it silently"
        placed.setdefault(target, []).append((shard_id, tuple(tensor.shape)))
    return placed


def test_every_tensor_lands_and_every_fused_parameter_is_whole(tmp_path):
    torch.manual_seed(0)
    target = Qwen3ForCausalLM(Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16))
    config = make_config(target.config, num_layers=2, block_size=8, mask_token_id=127, lineage=lineage(),
                         target_layer_ids=[1, 2, 4])
    DFlashDrafter(config).save_pretrained(tmp_path / "d", dtype=torch.bfloat16)
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    params = serving_params(raw)
    placed = replay_load(tensors, params)
    assert set(placed) == set(params), f"parameters no tensor fills: {sorted(set(params) - set(placed))}"
    for name, parts in placed.items():
        rows = sum(shape[0] for _, shape in parts)
        assert (rows, *parts[0][1][1:]) == params[name], name
        if "qkv_proj" in name:
            assert sorted(s for s, _ in parts) == ["k", "q", "v"]
        if "gate_up_proj" in name:
            assert sorted(s for s, _ in parts) == [0, 1]
    # What both servers read from config.json to build and run it.
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["block_size"] == 8
    assert raw["dflash_config"] == {"target_layer_ids": [1, 2, 4], "mask_token_id": 127}
    assert raw["num_target_layers"] == 6 and raw["hidden_act"] == "silu"
    assert raw["torch_dtype"] == "bfloat16" and raw["rope_theta"] == raw["rope_parameters"]["rope_theta"]
    # vLLM's _dflash_layer_causal: nothing in the config may make a layer causal (DFlash blocks attend both ways).
    assert raw.get("is_causal") is None and "causal" not in raw["dflash_config"]
    assert all(t != "sliding_attention" for t in raw.get("layer_types") or [])


# -- DFlash 2 ------------------------------------------------------------------------------------------------------
# Replayed from:
# - SGLang ``python/sglang/srt/speculative/dflash_utils.py`` (read at commit 00731f0b): ``parse_dflash_draft_config``
#   reads ``dflash_config`` first and the top level second; num_hidden_layers >= 1, block_size >= 1,
#   conv_kernel_size and conv_group_size both or neither, selector_rank and selector_top_k both or neither,
#   output_multiplier > 0, target_layer_ids a non-empty list, mask_token_id a non-negative int;
#   ``get_dflash_attention_sliding_window_size``: a ``sliding_attention`` entry in ``layer_types`` requires
#   ``sliding_window`` (SGLang keeps window_left = sliding_window - 1: the HF window counts the token itself);
# - vLLM ``vllm/model_executor/models/qwen3_dflash2.py`` (read at commit 1b1712a0, the registry's
#   ``DFlash2DraftModel``): per layer ``attention_conv`` / ``mlp_conv`` with ``base_kernel`` [2, taps, hidden] and
#   ``kernel_projection`` [2 * taps * groups, hidden] (conv_group_size must divide hidden_size), the convolution's
#   block = 1 + num_speculative_tokens (serve with num_speculative_tokens = block_size - 1), and
#   ``candidate_selector.{predecessor,successor}_codebook`` [vocab, rank] and ``.hidden_projection`` [rank, hidden];
#   ``qwen3_dflash.py`` ``_resolve_layer_attention``: a sliding layer's window is ``dflash_config.swa_window_size``
#   or ``sliding_window`` and the layer is causal (``_dflash_layer_causal``).

def sglang_parse(raw: dict) -> dict:
    """The checks of SGLang's ``parse_dflash_draft_config`` (and its sliding-window lookup) on a config dict."""
    d = raw.get("dflash_config") or {}

    def field(name, default=None):
        return d.get(name, raw.get(name, default))

    assert int(raw["num_hidden_layers"]) >= 1
    assert int(field("block_size")) >= 1
    kernel, group = int(d.get("conv_kernel_size", 0)), int(d.get("conv_group_size", 0))
    assert bool(kernel) == bool(group), "conv_kernel_size and conv_group_size go together"
    rank, top_k = int(d.get("selector_rank", 0)), int(d.get("selector_top_k", 0))
    assert bool(rank) == bool(top_k), "selector_rank and selector_top_k go together"
    assert float(d.get("output_multiplier", 1.0)) > 0
    layers = field("target_layer_ids")
    assert isinstance(layers, list) and layers and all(isinstance(i, int) for i in layers)
    mask = field("mask_token_id")
    assert isinstance(mask, int) and not isinstance(mask, bool) and mask >= 0
    window = None
    if "sliding_attention" in (raw.get("layer_types") or []):
        assert raw.get("sliding_window") is not None, "sliding_attention layers require sliding_window"
        window = int(raw["sliding_window"]) - 1  # window_left
    return {"block_size": int(field("block_size")), "conv": (kernel, group), "selector": (rank, top_k),
            "target_layer_ids": layers, "mask_token_id": mask, "window_left": window}


def vllm_dflash2_params(config: dict) -> dict[str, tuple[int, ...]]:
    """What vLLM's DFlash2Qwen3ForCausalLM allocates beyond DFlash 1's (tp_size 1)."""
    d, h, vocab = config["dflash_config"], config["hidden_size"], config["vocab_size"]
    taps, group = int(d["conv_kernel_size"]), int(d["conv_group_size"])
    assert h % group == 0, "conv_group_size must divide hidden_size"
    params = serving_params(config)
    for i in range(config["num_hidden_layers"]):
        for conv in ("attention_conv", "mlp_conv"):
            params[f"layers.{i}.{conv}.base_kernel"] = (2, taps, h)
            params[f"layers.{i}.{conv}.kernel_projection.weight"] = (2 * taps * (h // group), h)
    rank = int(d["selector_rank"])
    params |= {"candidate_selector.predecessor_codebook": (vocab, rank),
               "candidate_selector.successor_codebook": (vocab, rank),
               "candidate_selector.hidden_projection.weight": (rank, h)}
    return params


def vllm_layer_attention(config: dict, i: int) -> tuple[int | None, bool]:
    """``_resolve_layer_attention``: (sliding window, causal) of layer i."""
    d = config.get("dflash_config") or {}
    types = config.get("layer_types")
    sliding = d.get("use_swa", False) if types is None else types[i] == "sliding_attention"
    window = d.get("swa_window_size", config.get("sliding_window")) if sliding else None
    causal = config.get("is_causal")
    if causal is None:
        causal = d.get("causal")
    if causal is None:
        causal = bool(types) and types[i] == "sliding_attention"
    return window, bool(causal)


def test_a_dflash2_checkpoint_meets_sglang_and_vllm(tmp_path):
    torch.manual_seed(0)
    target = Qwen3ForCausalLM(Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16))
    d2 = {"conv_kernel_size": 4, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 6}
    config = make_config(target.config, num_layers=3, block_size=8, mask_token_id=127, lineage=lineage(),
                         target_layer_ids=[1, 2, 4], architecture="dflash2", dflash2=d2, sliding_window=32,
                         max_window_layers=1)
    drafter = DFlashDrafter(config)
    drafter.save_pretrained(tmp_path / "d", dtype=torch.bfloat16)
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    assert raw["architectures"] == ["DFlash2DraftModel"]

    parsed = sglang_parse(raw)
    assert parsed == {"block_size": 8, "conv": (4, 16), "selector": (8, 6), "target_layer_ids": [1, 2, 4],
                      "mask_token_id": 127, "window_left": 31}
    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    params = vllm_dflash2_params(raw)
    placed = replay_load(tensors, params)
    assert set(placed) == set(params), f"parameters no tensor fills: {sorted(set(params) - set(placed))}"
    for name, parts in placed.items():
        assert (sum(s[0] for _, s in parts), *parts[0][1][1:]) == params[name], name
    # Every layer attends as vLLM (and z-lab) will serve it: the first full and non-causal, the rest sliding and causal.
    for i, layer in enumerate(drafter.layers):
        window, causal = vllm_layer_attention(raw, i)
        assert (layer.self_attn.sliding_window, layer.self_attn.is_causal) == (window, causal)
    assert [vllm_layer_attention(raw, i) for i in range(3)] == [(None, False), (32, True), (32, True)]
    # Qwen3Config itself (what every reader builds first) keeps the window: use_sliding_window and
    # max_window_layers are written, without which it drops sliding_window.
    from transformers import AutoConfig
    reread = AutoConfig.from_pretrained(tmp_path / "d")
    assert reread.sliding_window == 32 and reread.layer_types == ["full_attention"] + ["sliding_attention"] * 2


def test_the_replays_reject_what_the_servers_reject():
    good = {"num_hidden_layers": 1, "block_size": 8, "dflash_config": {
        "target_layer_ids": [1], "mask_token_id": 5, "conv_kernel_size": 4, "conv_group_size": 16,
        "selector_rank": 8, "selector_top_k": 6}}
    sglang_parse(good)
    for broken in ({"conv_group_size": 0}, {"selector_top_k": 0}, {"mask_token_id": -1}, {"target_layer_ids": []}):
        bad = {**good, "dflash_config": {**good["dflash_config"], **broken}}
        with pytest.raises(AssertionError):
            sglang_parse(bad)
    with pytest.raises(AssertionError, match="sliding_window"):
        sglang_parse({**good, "layer_types": ["sliding_attention"]})
