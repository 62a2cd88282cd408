"""The warm start (``train.warm_start``) on a tiny target: a DFlash 2 drafter started from a DFlash 1 one drafts exactly
what its source drafts; a DFlash 2 source for a DFlash 1 drafter, or tensors of other shapes, are refused by name.
Misfits in a config field are refused through the stage, naming ``train.init_from`` (``test_dflash2.py``)."""

from __future__ import annotations

import drafter_support as S
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from draftline.drafter.config import DrafterMismatch, make_config
from draftline.drafter.model import DFlashDrafter, target_features
from draftline.train.warm_start import warm_start

COMMON = dict(num_layers=2, block_size=6, mask_token_id=S.MASK_ID, lineage=S.lineage(), target_layer_ids=[1, 3])


@pytest.fixture(scope="module")
def target() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=S.VOCAB, hidden_size=S.HIDDEN, num_hidden_layers=S.LAYERS,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                        intermediate_size=128, initializer_range=0.2)).eval()


def dflash2(**overrides) -> dict:
    return {**S.small_params()["dflash2"], **overrides}


def test_a_warm_started_dflash2_drafts_exactly_what_its_dflash1_source_drafts(tmp_path, target):
    """Step 0 of a warm start: identity convolutions and a zero successor codebook leave the drafts as they were."""
    source = DFlashDrafter(make_config(target.config, **COMMON)).bind(target).eval()
    with torch.no_grad():  # a trained-looking source: norms off one
        for name, p in source.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    source.save_pretrained(tmp_path / "d1", dtype=torch.float32)
    fresh = DFlashDrafter(make_config(target.config, **COMMON, architecture="dflash2",
                                      dflash2=dflash2(selector_top_k=5)))
    info = warm_start(fresh, tmp_path / "d1")
    fresh.bind(target).eval()
    assert info["architecture"] == "dflash" and info["tensors_at_their_start"] > 0

    ids = torch.randint(0, S.VOCAB - 2, (1, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        feats = target_features(target(ids, output_hidden_states=True).hidden_states, [1, 3])
    c1, c2 = source.new_cache(), fresh.new_cache()
    for start, end in ((0, 12), (12, 17), (17, 30)):
        last = ids[:, end - 1]
        a = source.draft(feats[:, start:end], last, c1)
        b = fresh.draft(feats[:, start:end], last, c2)
        assert torch.equal(a.logits, b.logits)
        path, candidates, _ = fresh.select(b, last)
        assert torch.equal(path, a.logits.argmax(-1))
        assert torch.equal(candidates[..., 0], a.logits.argmax(-1))


def test_a_dflash2_source_for_a_dflash1_drafter_is_refused(tmp_path, target):
    DFlashDrafter(make_config(target.config, **COMMON, architecture="dflash2", dflash2=dflash2())).save_pretrained(
        tmp_path / "d2")
    with pytest.raises(DrafterMismatch, match="is DFlash 2: start a dflash2 drafter from it"):
        warm_start(DFlashDrafter(make_config(target.config, **COMMON)), tmp_path / "d2")


def test_a_tensor_of_another_shape_is_refused_naming_it(tmp_path, target):
    """Every config field checked fits, but the source's MLP is wider (another intermediate_size)."""
    wide = Qwen3Config(**{**target.config.to_dict(), "intermediate_size": 256})
    DFlashDrafter(make_config(wide, **COMMON)).save_pretrained(tmp_path / "wide")
    with pytest.raises(DrafterMismatch, match=r"mlp\.\w+_proj\.weight of shape .* this run needs"):
        warm_start(DFlashDrafter(make_config(target.config, **COMMON)), tmp_path / "wide")
