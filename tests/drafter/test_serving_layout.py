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

import torch
from drafter_support import lineage
from safetensors import safe_open
from transformers import Qwen3Config, Qwen3ForCausalLM

from draftline.drafter.model import DFlashDrafter, make_config

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
