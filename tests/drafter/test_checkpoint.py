"""The drafter checkpoint as its consumers read it: transformers' AutoModel through the modeling file in the folder
(trust_remote_code), a config that transformers 4.5x and 5.x read with the same RoPE, weights in the target's dtype."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from drafter_support import lineage
from safetensors import safe_open
from transformers import AutoConfig, AutoModel, DynamicCache, Qwen3Config, Qwen3ForCausalLM

from draftline.drafter.checkpoint import MODELING_FILE
from draftline.drafter.config import make_config
from draftline.drafter.model import DFlashDrafter, target_features

ROPE_THETA = 1_000_000.0
BLOCK = 4


def tiny_target(rope: dict | None = None) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, initializer_range=0.2,
        rope_parameters=rope or {"rope_type": "default", "rope_theta": ROPE_THETA},
    )
    return Qwen3ForCausalLM(config).eval()


def drafter_for(target: Qwen3ForCausalLM) -> DFlashDrafter:
    config = make_config(target.config, num_layers=2, block_size=BLOCK, mask_token_id=127, lineage=lineage(),
                         target_layer_ids=[1, 3])
    torch.manual_seed(1)
    drafter = DFlashDrafter(config).bind(target).eval()
    with torch.no_grad():  # norm weights start at one: perturb them, so that a wrongly loaded norm would show
        for name, p in drafter.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return drafter


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Qwen3ForCausalLM, DFlashDrafter, Path]:
    target = tiny_target()
    drafter = drafter_for(target)
    folder = tmp_path_factory.mktemp("ckpt") / "drafter"
    drafter.save_pretrained(folder, dtype=torch.float32)
    return target, drafter, folder


def test_the_folder_carries_its_own_modeling_file_and_auto_map(saved):
    _, _, folder = saved
    assert sorted(p.name for p in folder.iterdir()) == sorted(["config.json", MODELING_FILE, "model.safetensors"])
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == {"AutoModel": "modeling_dflash.DFlashDraftModel"}
    assert config["architectures"] == ["DFlashDraftModel"]
    # The modeling file is self-contained: transformers imports it from the folder, without draftline.
    assert "draftline" not in (folder / MODELING_FILE).read_text().split('"""', 2)[2]


def test_automodel_with_trust_remote_code_runs_the_same_draft_forward(saved):
    target, drafter, folder = saved
    model, info = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32,
                                            output_loading_info=True)
    assert type(model).__name__ == "DFlashDraftModel"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.block_size == BLOCK and model.mask_token_id == 127 and model.target_layer_ids == [1, 3]

    ids = torch.randint(0, 120, (1, 9))
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
    features = target_features(hidden, [1, 3])
    block = torch.full((1, BLOCK), 127)
    block[0, 0] = 5
    noise = target.get_input_embeddings()(block)
    positions = torch.arange(9 + BLOCK)[None]
    with torch.no_grad():
        theirs = model(position_ids=positions, noise_embedding=noise, target_hidden=features)
        ours = drafter(position_ids=positions, noise_embedding=noise, target_hidden=features)
        logits = model.compute_logits(theirs, target.get_output_embeddings())
    assert theirs.shape == (1, BLOCK, 64)
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, drafter.logits(ours), rtol=1e-5, atol=1e-5)


def test_z_lab_style_decoding_with_a_dynamic_cache_matches_draftlines_cache(saved):
    """Two decoding steps as z-lab's loop makes them: the cache takes context and block keys, and is cropped back
    to the accepted length after each call; draftline's own cache keeps the context alone. Same drafts."""
    target, drafter, folder = saved
    model = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
    ids = torch.randint(0, 120, (1, 12))
    with torch.no_grad():
        features = target_features(target(ids, output_hidden_states=True).hidden_states, [1, 3])
    ours_cache, theirs_cache = drafter.new_cache(), DynamicCache()
    # Step 1: the prompt's 8 tokens are context; step 2: 4 more tokens were accepted.
    for start, end in ((0, 8), (8, 12)):
        last = ids[:, end - 1] + 1
        with torch.no_grad():
            ours = drafter.draft_logits(features[:, start:end], last, ours_cache)
            block = torch.full((1, BLOCK), 127)
            block[:, 0] = last
            hidden = model(position_ids=torch.arange(start, end + BLOCK)[None],
                           noise_embedding=target.get_input_embeddings()(block),
                           target_hidden=features[:, start:end], past_key_values=theirs_cache, use_cache=True)
            theirs = model.compute_logits(hidden[:, 1:], target.get_output_embeddings())
        theirs_cache.crop(end - theirs_cache.get_seq_length())  # drop the block, as z-lab's _crop_to does
        torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
        assert theirs_cache.get_seq_length() == end


def test_weights_are_saved_in_the_targets_dtype(tmp_path):
    target = tiny_target()
    drafter_for(target).save_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    # draftline's own loader and transformers' both take it back.
    assert DFlashDrafter.from_pretrained(tmp_path / "bf16").fc.weight.dtype == torch.float32
    assert AutoModel.from_pretrained(tmp_path / "bf16", trust_remote_code=True).fc.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("rope", [
    {"rope_type": "default", "rope_theta": ROPE_THETA},
    {"rope_type": "yarn", "rope_theta": ROPE_THETA, "factor": 4.0, "original_max_position_embeddings": 128},
], ids=["default", "yarn"])
def test_rope_reads_the_same_under_both_conventions(tmp_path, rope):
    """transformers 5 reads ``rope_parameters``; 4.5x (z-lab pins 4.57.1) reads top-level ``rope_theta`` and
    ``rope_scaling`` and would silently take rope_theta 10000 without them."""
    target = tiny_target(rope)
    drafter_for(target).save_pretrained(tmp_path / "d", dtype=torch.float32)
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    assert raw["rope_theta"] == ROPE_THETA == raw["rope_parameters"]["rope_theta"]
    if rope["rope_type"] == "default":
        assert raw.get("rope_scaling") is None
    else:
        assert raw["rope_scaling"] == {k: v for k, v in rope.items() if k != "rope_theta"}
    assert AutoConfig.from_pretrained(tmp_path / "d").rope_parameters == target.config.rope_parameters
    # 4.5x's reader: Qwen3Config(rope_theta=..., rope_scaling=...) from the same file, as transformers 5 converts it.
    legacy = Qwen3Config(rope_theta=raw["rope_theta"], rope_scaling=raw.get("rope_scaling"))
    assert legacy.rope_parameters == target.config.rope_parameters


def test_the_train_stage_saves_in_the_dtype_the_targets_config_names(tmp_path):
    from draftline.core.records import TargetInfo
    from draftline.train.trainer import checkpoint_dtype

    def info(config: dict) -> TargetInfo:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        return TargetInfo(path=str(folder), tokenizer_fingerprint="t", chat_template_sha256="t", eos_token="e",
                          eos_token_id=1, pad_token_id=0, end_of_turn_token="e", end_of_turn_token_id=1,
                          think_start_token=None, think_end_token=None, mask_token_id=2, vocab_size=8)

    assert checkpoint_dtype(info({"torch_dtype": "bfloat16"})) == torch.bfloat16  # a Qwen3 checkpoint (4.5x key)
    assert checkpoint_dtype(info({"dtype": "float16"})) == torch.float16
    assert checkpoint_dtype(info({"text_config": {"dtype": "bfloat16"}})) == torch.bfloat16  # Qwen3.5/3.6
    assert checkpoint_dtype(info({})) == torch.float32
    with pytest.raises(ValueError, match="not a torch float dtype"):
        checkpoint_dtype(info({"dtype": "int8"}))
