"""The target's greedy continuations (train/greedy.py) on the targets transformers can load: whichever keyword the
installed version takes the KV cache by, and refused in one line where a sliding window would crop that cache."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from draftline.core.params import ParamsError
from draftline.core.target_loader import load_model, load_target
from draftline.drafter.speculative import cache_kwarg
from draftline.train.greedy import greedy_chains, refuse_sliding_window

DEPTH = 4


class PastKeyValuesForward(Qwen3ForCausalLM):
    """The same model behind an older transformers' forward (4.x, early 5.x): the cache is ``past_key_values``, and
    any other keyword goes on to the attention kernels, which ignore what they do not know (a ``cache=`` is dropped,
    as there)."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None,
                **attention_kwargs):
        parent = super()  # its keyword for the cache, whichever transformers runs the test
        return parent.forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=use_cache, **{cache_kwarg(parent): past_key_values})


@pytest.fixture(scope="module")
def target(embedded_target) -> Qwen3ForCausalLM:
    model = load_model(load_target(embedded_target / "target.json"), dtype=torch.float32, device="cpu")
    assert isinstance(model, Qwen3ForCausalLM)
    return model.requires_grad_(False)


def _row(vocab: int, n: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # a prompt, then a reply
    return ids, mask


def _plain_greedy(target, ids: torch.Tensor, i: int, steps: int) -> list[int]:
    x, out = ids[:, : i + 1], []
    for _ in range(steps):
        out.append(int(target(input_ids=x).logits[0, -1].argmax()))
        x = torch.cat([x, torch.tensor([[out[-1]]])], dim=1)
    return out


@torch.no_grad()
def test_greedy_chains_pass_the_cache_by_the_keyword_the_forward_takes(target):
    """A forward that takes the cache as ``past_key_values`` (transformers 4.x) gets it so: the continuations, decoded
    at once over the cache, are token for token plain greedy decoding of the row up to each position."""
    old = PastKeyValuesForward(target.config).eval().requires_grad_(False)
    old.load_state_dict(target.state_dict())
    assert cache_kwarg(old) == "past_key_values"
    ids, mask = _row(target.config.vocab_size)
    chains = greedy_chains(old, ids, mask, DEPTH)
    assert torch.equal(chains, greedy_chains(target, ids, mask, DEPTH))
    n = ids.shape[1]
    for i in (i for i in range(n - 1) if mask[0, i + 1]):
        want = _plain_greedy(target, ids, i, min(DEPTH, n - 1 - i))
        assert chains[i, : len(want)].tolist() == want, i


def _sliding(window: int | None, window_layers: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                         use_sliding_window=window is not None, sliding_window=window, max_window_layers=window_layers)
    return Qwen3ForCausalLM(config).eval().requires_grad_(False)


@torch.no_grad()
def test_a_sliding_window_target_is_refused_in_one_line_naming_argmax_path():
    """Rows longer than the window: the cache keeps the window only, and the continuations cannot be decoded over it."""
    model = _sliding(window=8)
    ids, mask = _row(96)
    with pytest.raises(ParamsError, match=r"sliding window \(8 tokens\).*set train.argmax_path") as e:
        greedy_chains(model, ids, mask, DEPTH)
    assert "\n" not in str(e.value)
    with pytest.raises(ParamsError, match="train.argmax_path"):
        refuse_sliding_window(model.config)
    refuse_sliding_window(_sliding(window=None).config)
    refuse_sliding_window(_sliding(window=8, window_layers=2).config)  # a window set, but no layer slides


def test_train_refuses_a_sliding_window_target_before_the_data_loads(tmp_path):
    """The stage's check comes first: no training set exists here, and the refusal names the param, not the set."""
    import logging

    import drafter_support as S

    from draftline.core.skips import Skips
    from draftline.train.trainer import Dist, prepare

    target_json = S.make_target(tmp_path)
    _sliding(window=8).config.save_pretrained(load_target(target_json).path)  # the same folder, now Mistral-style
    selector = dict(S.small_params()["dflash2"], selector_labels="target")
    cfg = S.train_params(argmax_path="greedy", architecture="dflash2", dflash2=selector)
    with pytest.raises(ParamsError, match="set train.argmax_path to on_greedy_path or data"):
        prepare(cfg, tmp_path / "no-training-set", target_json, Dist(), Skips(logging.getLogger("test")))
