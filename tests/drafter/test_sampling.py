"""Sampled speculative decoding keeps the target's distribution: checked statistically, and shown able to fail.

Many seeded continuations of one prompt are drawn with the target alone and with a proposer whose draft
distribution is far from the target's; at each drafted position the two token histograms are compared with a
chi-square test of homogeneity: at temperature 1, under top-k / top-p / temperature as servers filter, and with a
DFlash 2 drafter whose selector drafts from its K-way distributions (q over the K candidates). Each check is shown
failing on a planted bug (a verifier that accepts everything, one that ignores the filter, a K-way q taken as
uniform). The seeds are fixed, so the outcome is the same on every run of one machine; the
thresholds leave room for another machine's floats (a correct verifier sits far above 1e-3, a wrong one far below).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency
from transformers import Qwen3Config, Qwen3ForCausalLM

from draftline.drafter import speculative
from draftline.drafter.speculative import Draft, DraftContext, Sampling, draw, speculative_generate, target_generate

VOCAB = 12
BLOCK = 4
DRAWS = 1500
PROMPT = [3, 1, 4, 1, 5]
SAMPLING = Sampling(temperature=1.0, top_p=1.0, top_k=0)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target() -> Qwen3ForCausalLM:
    # A wide initialisation makes the next-token distributions peaked and position-dependent, unlike any fixed one.
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, initializer_range=0.6,
    )
    return Qwen3ForCausalLM(cfg).eval()


class SkewedDraft:
    """Drafts every position from one fixed distribution, far from the target's: most mass on the last ids."""

    block_size = BLOCK
    target_layer_ids = ()
    q = torch.arange(1, VOCAB + 1, dtype=torch.float32) ** 3

    def reset(self) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Draft:
        probs = (self.q / self.q.sum()).expand(BLOCK - 1, VOCAB)
        return Draft(draw(probs, ctx.generator), probs)


def histograms(generate) -> np.ndarray:
    """(positions 1..3, VOCAB) token counts over DRAWS seeded continuations."""
    counts = np.zeros((BLOCK - 1, VOCAB), dtype=np.int64)
    for seed in range(DRAWS):
        tokens = generate(seed)
        for pos in range(1, BLOCK):
            counts[pos - 1, tokens[pos]] += 1
    return counts


def homogeneity_pvalues(a: np.ndarray, b: np.ndarray) -> list[float]:
    """Per position, the chi-square p-value that both histograms come from one distribution (empty bins dropped)."""
    pvalues = []
    for row_a, row_b in zip(a, b):
        keep = (row_a + row_b) > 0
        pvalues.append(float(chi2_contingency(np.stack([row_a[keep], row_b[keep]]))[1]))
    return pvalues


def accept_everything(draft, logits, sampling, generator):
    """A wrong verifier: keeps every draft and appends a target sample."""
    m = draft.tokens.numel()
    return m, draw(sampling.probs(logits[m]), generator)


@pytest.fixture(scope="module")
def alone(target) -> np.ndarray:
    return histograms(lambda s: target_generate(target, PROMPT, BLOCK, sampling=SAMPLING, seed=s).tokens)


def test_sampled_speculative_decoding_has_the_targets_distribution(target, alone):
    drafted = histograms(lambda s: speculative_generate(target, SkewedDraft(), PROMPT, BLOCK, sampling=SAMPLING, seed=s).tokens)
    assert min(homogeneity_pvalues(alone, drafted)) > 1e-3
    # The check has power: the draft distribution itself is far from the target's at these positions.
    q = SkewedDraft.q / SkewedDraft.q.sum()
    skewed = np.stack([np.bincount(torch.multinomial(q, DRAWS, replacement=True, generator=torch.Generator().manual_seed(p)).numpy(), minlength=VOCAB) for p in range(BLOCK - 1)])
    assert max(homogeneity_pvalues(alone, skewed)) < 1e-6


def test_a_wrong_verifier_fails_the_same_check(target, alone, monkeypatch):
    monkeypatch.setattr(speculative, "verify_block", accept_everything)
    wrong = histograms(lambda s: speculative_generate(target, SkewedDraft(), PROMPT, BLOCK, sampling=SAMPLING, seed=s).tokens)
    assert min(homogeneity_pvalues(alone, wrong)) < 1e-6


def test_sampling_is_seeded_and_filters_as_servers_do(target):
    a = speculative_generate(target, SkewedDraft(), PROMPT, 16, sampling=SAMPLING, seed=7)
    b = speculative_generate(target, SkewedDraft(), PROMPT, 16, sampling=SAMPLING, seed=7)
    assert a == b
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    top2 = Sampling(temperature=1.0, top_p=1.0, top_k=2).probs(logits)[0]
    assert (top2[2:] == 0).all() and torch.allclose(top2[:2], torch.softmax(logits[0, :2], -1))
    # top_p 0.6: the first token holds 0.56 of the mass, short of 0.6, so the second stays too (0.77 together).
    nucleus = Sampling(temperature=1.0, top_p=0.6, top_k=0).probs(logits)[0]
    assert (nucleus[2:] == 0).all() and torch.allclose(nucleus[:2], torch.softmax(logits[0, :2], -1))
    with pytest.raises(ValueError):
        Sampling(temperature=-1.0, top_p=1.0, top_k=0)


FILTERED = Sampling(temperature=0.8, top_p=0.9, top_k=4)


@pytest.fixture(scope="module")
def filtered(target) -> np.ndarray:
    """The tempered, filtered target alone (drawn before any test swaps the verifier: target-only decoding draws
    through it too)."""
    return histograms(lambda s: target_generate(target, PROMPT, BLOCK, sampling=FILTERED, seed=s).tokens)


def test_top_k_and_top_p_keep_the_filtered_targets_distribution(target, alone, filtered):
    """Servers sample from the filtered, tempered target: speculative decoding must too. The filter is strong here
    (top 4 of 12, then 90% of the mass), so the unfiltered target's histogram is far from it: the check has power."""
    drafted = histograms(lambda s: speculative_generate(target, SkewedDraft(), PROMPT, BLOCK, sampling=FILTERED,
                                                        seed=s).tokens)
    assert min(homogeneity_pvalues(filtered, drafted)) > 1e-3
    assert max(homogeneity_pvalues(alone, filtered)) < 1e-6


def test_a_verifier_that_ignores_the_filter_fails_the_same_check(target, filtered, monkeypatch):
    verify = speculative.verify_block
    monkeypatch.setattr(speculative, "verify_block", lambda d, logits, _s, g: verify(d, logits, SAMPLING, g))
    wrong = histograms(lambda s: speculative_generate(target, SkewedDraft(), PROMPT, BLOCK, sampling=FILTERED,
                                                     seed=s).tokens)
    assert min(homogeneity_pvalues(filtered, wrong)) < 1e-6


@pytest.fixture(scope="module")
def dflash2_drafter(target):
    """A DFlash 2 drafter on the tiny target, every weight perturbed so that its selector's K-way distributions are
    far from uniform and from the target's (a fresh selector walks the unary path)."""
    from drafter_support import lineage

    from draftline.drafter.config import make_config
    from draftline.drafter.model import DFlashDrafter

    torch.manual_seed(1)
    cfg = make_config(target.config, num_layers=1, block_size=BLOCK, mask_token_id=VOCAB - 1, target_layer_ids=[0],
                      lineage=lineage(), architecture="dflash2",
                      dflash2={"conv_kernel_size": 3, "conv_group_size": 16, "selector_rank": 4, "selector_top_k": 4})
    drafter = DFlashDrafter(cfg)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return drafter.bind(target).eval()


def test_dflash2_k_way_sampling_keeps_the_targets_distribution(target, alone, dflash2_drafter):
    """The selector drafts from its K-way distribution over each position's top K (temperature only); the rejection
    step takes that K-way distribution as q. The output must still be the target's (the next test shows the check
    would see a wrong q on these very drafts)."""
    from draftline.drafter.speculative import DFlashProposer

    proposer = DFlashProposer(dflash2_drafter)
    with torch.no_grad():
        drafted = histograms(lambda s: speculative_generate(target, proposer, PROMPT, BLOCK, sampling=SAMPLING,
                                                            seed=s).tokens)
    assert min(homogeneity_pvalues(alone, drafted)) > 1e-3


def test_a_k_way_q_taken_as_uniform_fails_the_same_check(target, alone, dflash2_drafter, monkeypatch):
    """Power: the same drafts verified with q claimed uniform over the K candidates (not the selector's) bias the
    output, and the check sees it."""
    from draftline.drafter.speculative import DFlashProposer

    select = DFlashProposer._select

    def uniform_q(self, block, ctx):
        draft = select(self, block, ctx)
        return speculative.Draft(draft.tokens, torch.full_like(draft.probs, 1.0 / draft.probs.shape[-1]), draft.support)

    monkeypatch.setattr(DFlashProposer, "_select", uniform_q)
    proposer = DFlashProposer(dflash2_drafter)
    with torch.no_grad():
        wrong = histograms(lambda s: speculative_generate(target, proposer, PROMPT, BLOCK, sampling=SAMPLING,
                                                         seed=s).tokens)
    assert min(homogeneity_pvalues(alone, wrong)) < 1e-6
