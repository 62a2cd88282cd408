"""The verification loop, checked against a tiny random Qwen3 target and hand-made proposers (no drafter needed)."""

from __future__ import annotations

import math

import pytest
import torch
from drafter_support import lineage
from transformers import AutoModelForCausalLM, DynamicCache, Qwen3Config, Qwen3ForCausalLM

from draftline.drafter.speculative import (
    DraftContext,
    cache_kwarg,
    crop_cache,
    greedy_generate,
    greedy_reference,
    speculative_generate,
)

VOCAB = 96
BLOCK = 4
MAX_NEW = 23  # not a multiple of the block, so the last block is partial


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Batch-1 decoding of a tiny model: on a loaded CI box a second OpenMP thread only spins (10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256, tie_word_embeddings=False,
    )
    d = tmp_path_factory.mktemp("tiny-qwen3")
    Qwen3ForCausalLM(cfg).save_pretrained(d)
    return AutoModelForCausalLM.from_pretrained(d, local_files_only=True, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 11, 17)]


def naive_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding by recomputing the whole sequence every token: no cache, nothing shared with the loop."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


class Oracle:
    """Drafts the target's own greedy continuation (or, ``wrong=True``, a token that is never it)."""

    target_layer_ids = ()

    def __init__(self, sequence: list[int], block_size: int = BLOCK, wrong: bool = False):
        self.sequence, self.block_size, self.wrong = sequence, block_size, wrong

    def reset(self) -> None:
        pass

    def propose(self, ctx: DraftContext) -> torch.Tensor:
        assert ctx.tokens.tolist() == self.sequence[: len(ctx.tokens)]
        draft = torch.tensor(self.sequence[len(ctx.tokens) : len(ctx.tokens) + self.block_size - 1])
        return (draft + 1) % VOCAB if self.wrong else draft


class RandomDraft:
    target_layer_ids = ()
    block_size = BLOCK

    def __init__(self, seed: int):
        self.g = torch.Generator().manual_seed(seed)

    def reset(self) -> None:
        pass

    def propose(self, ctx: DraftContext) -> torch.Tensor:
        k = int(torch.randint(0, self.block_size, (1,), generator=self.g))  # sometimes drafts nothing
        return torch.randint(0, VOCAB, (k,), generator=self.g)


def test_greedy_matches_full_recompute(target, prompts):
    for p in prompts:
        gen = greedy_generate(target, p, MAX_NEW)
        assert gen.tokens == naive_greedy(target, p, MAX_NEW)
        assert gen.stop_reason == "length"
        # One forward per token: the prefill yields the first, each step one more.
        assert gen.target_forwards == MAX_NEW == 1 + gen.steps
        assert set(gen.accepted) == {0} and set(gen.produced) == {1}


def test_cache_crop_gives_the_logits_of_recomputation(target):
    ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(2))
    kw = cache_kwarg(target)
    with torch.no_grad():
        full = target(ids).logits
        cache = DynamicCache(config=target.config)
        target(ids[:, :10], use_cache=True, **{kw: cache})
        target(ids[:, 10:16], use_cache=True, **{kw: cache})  # a block of 6, of which 3 are rejected
        crop_cache(cache, 3)
        assert cache.get_seq_length() == 13
        crop_cache(cache, 0)  # no-op (in transformers 4.x a bare crop(0) would empty the cache)
        assert cache.get_seq_length() == 13
        again = target(ids[:, 13:24], use_cache=True, **{kw: cache}).logits
    torch.testing.assert_close(again, full[:, 13:24], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        crop_cache(cache, -1)


def test_oracle_proposer_reaches_the_block_size(target, prompts):
    for p in prompts:
        ref = naive_greedy(target, p, MAX_NEW + BLOCK)
        gen = speculative_generate(target, Oracle(p + ref), p, MAX_NEW)
        assert gen.tokens == ref[:MAX_NEW]
        steps = math.ceil((MAX_NEW - 1) / BLOCK)
        assert gen.steps == steps and gen.target_forwards == 1 + steps
        assert gen.produced[:-1] == [BLOCK] * (steps - 1)
        assert gen.produced[-1] == (MAX_NEW - 1) - BLOCK * (steps - 1)  # the final partial block
        assert gen.accepted == [BLOCK - 1] * steps


def test_always_wrong_proposer_gives_one_token_per_step(target, prompts):
    for p in prompts:
        ref = naive_greedy(target, p, MAX_NEW + BLOCK)
        gen = speculative_generate(target, Oracle(p + ref, wrong=True), p, MAX_NEW)
        assert gen.tokens == ref[:MAX_NEW]
        assert gen.accepted == [0] * (MAX_NEW - 1) and gen.produced == [1] * (MAX_NEW - 1)
        assert gen.target_forwards == MAX_NEW


def test_random_proposer_is_lossless(target, prompts):
    for seed, p in enumerate(prompts):
        gen = speculative_generate(target, RandomDraft(seed), p, MAX_NEW)
        assert gen.tokens == naive_greedy(target, p, MAX_NEW)
        assert sum(gen.produced) == MAX_NEW - 1
        assert gen.target_forwards == 1 + gen.steps
        assert all(0 <= a <= d for a, d in zip(gen.accepted, gen.drafted))


def test_stop_token_inside_an_accepted_block(target, prompts):
    p = prompts[1]
    ref = naive_greedy(target, p, MAX_NEW + BLOCK)
    # Stop at a token first generated mid-sequence, so it arrives among accepted drafts.
    stop = next(t for i, t in enumerate(ref) if i >= 2 and t not in ref[:i])
    end = ref.index(stop) + 1
    gen = speculative_generate(target, Oracle(p + ref), p, MAX_NEW, stop_ids={stop})
    assert gen.tokens == ref[:end] and gen.stop_reason == "stop"
    assert greedy_generate(target, p, MAX_NEW, stop_ids={stop}).tokens == ref[:end]
    # A stop token as the very first token ends before any verification step.
    first = speculative_generate(target, Oracle(p + ref), p, MAX_NEW, stop_ids={ref[0]})
    assert first.tokens == ref[:1] and first.steps == 0 and first.target_forwards == 1


def test_the_one_forward_reference_is_target_only_greedy_decoding(target, prompts):
    """What evaluate checks greedy outputs against: equal to token-by-token decoding (ended at max_new_tokens or at a
    stop token), and where an output differs, it ends at the target's own token there, so the check fails."""
    for p in prompts:
        ref = greedy_generate(target, p, MAX_NEW)
        got = greedy_reference(target, p, ref.tokens)
        assert (got.tokens, got.stop_reason, got.target_forwards) == (ref.tokens, "length", ref.target_forwards)
        stop = ref.tokens[5]
        ended = greedy_generate(target, p, MAX_NEW, stop_ids={stop})
        assert greedy_reference(target, p, ended.tokens, {stop}).tokens == ended.tokens
        assert greedy_reference(target, p, ended.tokens, {stop}).stop_reason == "stop" == ended.stop_reason
        wrong = list(ref.tokens)
        wrong[7] = (wrong[7] + 1) % VOCAB  # a verification bug's output: one token not the target's choice
        assert greedy_reference(target, p, wrong).tokens == ref.tokens[:8] != wrong


def test_hidden_states_follow_the_accepted_positions(target, prompts):
    """A drafter reads the target's layer outputs for every committed position, and only for those."""
    layers = (0, 2)

    class Recorder(RandomDraft):
        target_layer_ids = layers

        def __init__(self):
            super().__init__(seed=7)
            self.seen: list[tuple[torch.Tensor, torch.Tensor, int]] = []

        def propose(self, ctx):
            self.seen.append((ctx.tokens.clone(), ctx.hidden.clone(), ctx.new))
            return super().propose(ctx)

    p = prompts[0]
    rec = Recorder()
    speculative_generate(target, rec, p, MAX_NEW)
    previous = 0
    for tokens, hidden, new in rec.seen:
        assert hidden.shape == (len(tokens) - 1, 2 * target.config.hidden_size)
        assert new == len(tokens) - 1 - previous
        previous = len(tokens) - 1
        with torch.no_grad():
            hs = target(tokens[None, :-1], output_hidden_states=True).hidden_states
        torch.testing.assert_close(hidden, torch.cat([hs[i + 1][0] for i in layers], -1), rtol=1e-4, atol=1e-5)
    assert rec.seen[0][2] == len(p)


def test_bad_proposals_are_refused(target, prompts):
    p = prompts[0]
    too_long = Oracle(p + [0] * 50, block_size=BLOCK)
    too_long.propose = lambda ctx: torch.zeros(BLOCK, dtype=torch.long)
    with pytest.raises(ValueError, match="drafted 4 tokens"):
        speculative_generate(target, too_long, p, MAX_NEW)
    out_of_vocab = RandomDraft(0)
    out_of_vocab.propose = lambda ctx: torch.tensor([VOCAB])
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(target, out_of_vocab, p, MAX_NEW)
    deep = RandomDraft(0)
    deep.target_layer_ids = (3,)
    with pytest.raises(ValueError, match="outside the target"):
        speculative_generate(target, deep, p, MAX_NEW)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_generate(target, p, 0)


def test_untrained_dflash_drafter_is_lossless(target, prompts, tmp_path):
    from draftline.drafter.config import make_config
    from draftline.drafter.model import DFlashDrafter
    from draftline.drafter.speculative import DFlashProposer

    torch.manual_seed(3)
    cfg = make_config(target.config, num_layers=1, block_size=BLOCK, mask_token_id=VOCAB - 1, target_layer_ids=[0, 1], lineage=lineage())
    DFlashDrafter(cfg).save_pretrained(tmp_path / "drafter")
    proposer = DFlashProposer(DFlashDrafter.from_pretrained(tmp_path / "drafter", target))
    for p in prompts:
        gen = speculative_generate(target, proposer, p, MAX_NEW)
        assert gen.tokens == naive_greedy(target, p, MAX_NEW)
        assert gen.drafted == [BLOCK - 1] * gen.steps
        # At the last step the drafter had read every committed position: the prompt and all but the last step.
        assert proposer.cache.length == len(p) + sum(gen.produced[:-1])
