"""Speculative decoding: a proposer drafts a block, the target verifies the whole block in one forward pass.

Lossless by construction, greedy or sampled:

* greedy (temperature 0): every token emitted is the target's own argmax given the tokens before it;
* sampled: the target verifies by speculative (rejection) sampling (Leviathan et al. 2023, Chen et al. 2023):
  draft ``d_i`` drawn from the proposer's ``q_i`` is kept with probability ``min(1, p_i(d_i) / q_i(d_i))``; at the
  first rejection the next token is drawn from ``norm(max(0, p_i - q_i))``, and after a fully accepted block the
  bonus from ``p``. The emitted tokens then have exactly the target's sampling distribution ``p`` (temperature,
  top-k and top-p applied to the target's logits, :class:`Sampling`). A proposer that drafts a fixed token
  (no distribution) is the point mass ``q = onehot(d)``, which keeps the rule exact.

The proposer only decides how many tokens one target forward pass yields (the acceptance length, tau).

One step, with ``n`` tokens accepted so far and the target's KV cache holding the first ``n - 1`` of them::

    block     = [last accepted token, d_1 .. d_m]        m <= B - 1 drafted tokens
    target    = target(block, cache)                      row i predicts the token after block[i]
    a         = accepted drafts (the matching prefix greedy; the rejection rule sampled)
    emit        d_1 .. d_a, then the target's token a     a + 1 tokens: the accepted drafts and the bonus
    crop        the cache back to n + a positions         the rejected drafts' keys and values leave it

so a step costs one target forward over the block only. The target-only baseline is the same loop with no drafts
(one token per forward), which makes the forward-pass counts of the two directly comparable.

Determinism: every random draw comes from one ``torch.Generator`` seeded per call (``seed``), so the same prompt,
seed and models give the same tokens on the same machine.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

from draftline.drafter.model import DFlashDrafter, target_features


@dataclass(frozen=True)
class Sampling:
    """How the target's next-token distribution is formed: temperature, then top-k, then top-p (the order of
    vLLM, SGLang and z-lab's ``dflash``). ``temperature == 0`` is greedy; ``top_k <= 0`` and ``top_p == 1`` are off."""

    temperature: float
    top_p: float
    top_k: int

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"temperature must be >= 0 and top_p in (0, 1], got {self}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The sampling distribution (float32) of each row of ``logits`` (..., V); rows sum to 1."""
        scores = logits.float() / self.temperature
        if 0 < self.top_k < scores.shape[-1]:
            kth = scores.topk(self.top_k, dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        probs = scores.softmax(dim=-1)
        if self.top_p < 1:
            # Keep the smallest set of most likely tokens whose mass reaches top_p: a token stays when the mass
            # strictly before it (in descending order) is below top_p, so the most likely one always stays.
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            before = sorted_probs.cumsum(dim=-1) - sorted_probs
            sorted_probs = sorted_probs.masked_fill(before >= self.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
            probs = probs / probs.sum(dim=-1, keepdim=True)
        return probs


GREEDY = Sampling(temperature=0.0, top_p=1.0, top_k=0)


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token id per row of ``probs`` (..., V)."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


@dataclass
class DraftContext:
    """What a proposer sees before a step.

    ``hidden`` grows by the committed positions only, so a proposer with its own KV cache can project the ``new``
    trailing rows and append them, instead of recomputing the whole context every step.
    """

    # (n,) prompt + generated ids; tokens[-1] is the last accepted token, which the target has not yet read.
    tokens: torch.Tensor
    # (n - 1, len(target_layer_ids) * hidden): the target's hidden states at the chosen layers, concatenated in
    # that order, for tokens[:-1]; None when the proposer asks for no layers.
    hidden: torch.Tensor | None
    # How many trailing rows of ``hidden`` arrived since the previous call (all of them on a prompt's first call).
    new: int
    # How the target samples (a proposer drafts greedily when it is greedy), and the one source of randomness.
    sampling: Sampling = GREEDY
    generator: torch.Generator | None = None


@dataclass
class Draft:
    """Drafted tokens, and for sampled decoding the distribution each was drawn from.

    ``probs`` is (m, V) over the vocabulary, or (m, K) over the ids in ``support`` (m, K) (a candidate set);
    None means each token is a point mass (a deterministic draft).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    support: torch.Tensor | None = None


class Proposer(Protocol):
    """Anything that drafts up to ``block_size - 1`` tokens after the last accepted one."""

    block_size: int
    # Decoder layers (0-based) whose outputs the proposer reads: layer i is ``output.hidden_states[i + 1]``,
    # the convention of DFlash's ``target_layer_ids``. Empty: no hidden states are gathered.
    target_layer_ids: Sequence[int]

    def reset(self) -> None:
        """Forget any per-prompt state (a drafter KV cache) before a new prompt."""

    def propose(self, ctx: DraftContext) -> Draft | torch.Tensor:
        """Return at most ``block_size - 1`` token ids to verify (a bare tensor: a deterministic draft)."""


class NoDraft:
    """Proposes nothing: the loop becomes plain target-only decoding with a KV cache."""

    block_size = 1
    target_layer_ids: Sequence[int] = ()

    def reset(self) -> None:
        pass

    def propose(self, ctx: DraftContext) -> torch.Tensor:
        return ctx.tokens.new_empty(0)


@dataclass
class SelectorStep:
    """What a DFlash 2 drafter proposed at one step, for the selector's figures: the drafts are for the positions
    from ``position`` on (``position`` = tokens committed before the step)."""

    position: int
    path: list[int]  # the selector's walk: what was drafted
    unary: list[int]  # each position's own argmax (what a DFlash 1 head would draft)
    candidates: list[list[int]]  # each position's top-K


class DFlashProposer:
    """Drafts with a DFlash drafter: one drafter pass over [last accepted token, B-1 mask tokens] per step.

    DFlash 1: greedy, each position's argmax; sampled, a draw from each position's distribution under the same
    :class:`Sampling` as the target (what z-lab's ``dflash_generate`` and the servers do). DFlash 2: the candidate
    selector walks each position's top-K from the verified token; greedy, its argmax path; sampled, a draw from its
    K-way probabilities (temperature only, as z-lab's), which the rejection step then uses as ``q``. A DFlash 2
    proposer keeps each step's path, unary argmax and candidates in ``steps`` (cleared per prompt).

    The drafter's cache holds the projected context of every committed position; each step appends only the
    features of the tokens accepted since the previous step (``ctx.new``).
    """

    def __init__(self, drafter: DFlashDrafter):
        self.drafter = drafter
        self.block_size = drafter.block_size
        self.target_layer_ids = tuple(drafter.target_layer_ids)
        self.cache = drafter.new_cache()
        self.steps: list[SelectorStep] = []

    def reset(self) -> None:
        self.cache = self.drafter.new_cache()
        self.steps = []

    def propose(self, ctx: DraftContext) -> Draft:
        if self.cache.length + ctx.new != len(ctx.tokens) - 1:
            raise RuntimeError(
                f"drafter cache out of step: it holds {self.cache.length} positions, {ctx.new} arrive, "
                f"but {len(ctx.tokens) - 1} are committed"
            )
        block = self.drafter.draft(ctx.hidden[None, len(ctx.hidden) - ctx.new :], ctx.tokens[-1:], self.cache)
        if self.drafter.candidate_selector is not None:
            return self._select(block, ctx)
        if ctx.sampling.greedy:
            return Draft(block.logits[0].argmax(dim=-1))
        probs = ctx.sampling.probs(block.logits[0])
        return Draft(draw(probs, ctx.generator), probs)

    def _select(self, block, ctx: DraftContext) -> Draft:
        temperature = 0.0 if ctx.sampling.greedy else ctx.sampling.temperature
        path, candidates, probs = self.drafter.select(block, ctx.tokens[-1:], temperature, ctx.generator)
        self.steps.append(SelectorStep(len(ctx.tokens), path[0].tolist(), block.logits[0].argmax(dim=-1).tolist(),
                                       candidates[0].tolist()))
        return Draft(path[0]) if ctx.sampling.greedy else Draft(path[0], probs[0], support=candidates[0])


@dataclass
class Generation:
    """One prompt's output and the accounting that tau, the saved forward passes and acceptance plots come from."""

    tokens: list[int]  # generated ids (prompt excluded), ending at the first stop token (kept) or at max_new_tokens
    stop_reason: str  # "stop" (a stop token was generated) or "length" (max_new_tokens reached)
    target_forwards: int = 1  # the prefill, plus one per verification step
    drafted: list[int] = field(default_factory=list)  # per step: tokens the proposer drafted
    accepted: list[int] = field(default_factory=list)  # per step: drafts the target accepted
    produced: list[int] = field(default_factory=list)  # per step: tokens emitted (accepted + bonus, cut at the end)

    @property
    def steps(self) -> int:
        return len(self.produced)


def cache_kwarg(model: PreTrainedModel) -> str:
    """The keyword ``model.forward`` takes its KV cache by, read from its signature: every forward that passes a
    cache goes through it, since a keyword the installed version does not know is swallowed by ``**kwargs`` and
    the model silently builds a cache of its own."""
    # A 5.x release renamed `past_key_values` to `cache` (the old name warns and will go); older ones know only the old.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def crop_cache(cache: DynamicCache, remove: int) -> None:
    """Drop the last ``remove`` positions from every layer.

    Only ever called with a negative argument: transformers 5.x reads ``crop(k)`` as "remove k" and refuses k > 0,
    4.x reads it as "keep k", and both read a negative k as "remove |k|". ``crop(0)`` would empty a 4.x cache.
    """
    if remove < 0:
        raise ValueError(f"cannot remove {remove} positions")
    if remove:
        cache.crop(-remove)


class _Target:
    """The target model with its KV cache for one prompt; each call reads new ids and returns logits and features."""

    def __init__(self, model: PreTrainedModel, layer_ids: Sequence[int]):
        n_layers = model.config.get_text_config().num_hidden_layers  # a multimodal config keeps it in text_config
        bad = [i for i in layer_ids if not 0 <= i < n_layers]
        if bad:
            raise ValueError(f"target_layer_ids {bad} are outside the target's {n_layers} decoder layers")
        self.model = model
        self.layer_ids = tuple(layer_ids)
        self.cache = DynamicCache(config=model.config)
        self.cache_kwarg = cache_kwarg(model)
        self.forwards = 0

    def __call__(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = self.model(
            input_ids=ids[None],
            use_cache=True,
            output_hidden_states=bool(self.layer_ids),
            **{self.cache_kwarg: self.cache},
        )
        self.forwards += 1
        hidden = None
        if self.layer_ids:
            hidden = target_features(out.hidden_states, self.layer_ids)[0]
        return out.logits[0], hidden


def verify_block(
    draft: Draft, logits: torch.Tensor, sampling: Sampling, generator: torch.Generator
) -> tuple[int, torch.Tensor]:
    """How many drafts the target accepts, and the token it emits after them (the correction or the bonus).

    ``logits`` (m + 1, V): the target's rows for the block; row i predicts the token after block[i].
    """
    m = draft.tokens.numel()
    if sampling.greedy:
        posterior = logits.argmax(dim=-1)
        accepted = int((draft.tokens == posterior[:m]).to(torch.long).cumprod(0).sum())
        return accepted, posterior[accepted]
    p = sampling.probs(logits)
    q_full = _draft_probs(draft, p.shape[-1])
    p_d = p[:m].gather(-1, draft.tokens[:, None])[:, 0]
    q_d = q_full.gather(-1, draft.tokens[:, None])[:, 0]
    u = torch.rand(m, generator=generator, device=p.device)
    accepted = int((u * q_d < p_d).to(torch.long).cumprod(0).sum())
    if accepted == m:
        return accepted, draw(p[m], generator)
    residual = (p[accepted] - q_full[accepted]).clamp_min(0)
    total = residual.sum()
    # p == q at this row leaves nothing to correct towards (a rejection there has probability 0; guard rounding).
    return accepted, draw(residual / total if total > 0 else p[accepted], generator)


def _draft_probs(draft: Draft, vocab: int) -> torch.Tensor:
    """The proposer's distributions as (m, V) rows: point masses for a deterministic draft."""
    m = draft.tokens.numel()
    if draft.probs is None:
        return torch.zeros(m, vocab, device=draft.tokens.device).scatter(-1, draft.tokens[:, None], 1.0)
    if draft.support is None:
        return draft.probs.float()
    return torch.zeros(m, vocab, device=draft.probs.device).scatter_add(-1, draft.support, draft.probs.float())


def _as_draft(proposed: Draft | torch.Tensor, device: torch.device, max_draft: int, vocab: int) -> Draft:
    draft = proposed if isinstance(proposed, Draft) else Draft(proposed)
    draft.tokens = torch.as_tensor(draft.tokens, dtype=torch.long, device=device).reshape(-1)
    if draft.tokens.numel() > max_draft:
        raise ValueError(f"the proposer drafted {draft.tokens.numel()} tokens; a block of {max_draft + 1} holds {max_draft}")
    if draft.tokens.numel() and not (0 <= int(draft.tokens.min()) and int(draft.tokens.max()) < vocab):
        raise ValueError(f"the proposer drafted ids outside the target's vocabulary [0, {vocab})")
    return draft


@torch.inference_mode()
def speculative_generate(
    target: PreTrainedModel,
    proposer: Proposer,
    prompt_ids: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
    sampling: Sampling = GREEDY,
    seed: int = 0,
) -> Generation:
    """Decoding of ``prompt_ids`` (batch size 1) where the target verifies the proposer's blocks.

    Greedy, the output equals target-only greedy decoding up to floating-point differences between a block
    forward and a one-token forward (exactly equal in float32 on the models tested; bf16 can flip near-ties).
    Sampled, it is distributed as target-only sampling (tests/drafter/test_sampling.py checks it statistically).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    device = target.device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device)
    if prompt.ndim != 1 or prompt.numel() == 0:
        raise ValueError(f"prompt_ids must be a non-empty 1-D sequence, got shape {tuple(prompt.shape)}")
    max_draft = proposer.block_size - 1
    vocab = target.get_output_embeddings().weight.shape[0]
    stops = set(int(s) for s in stop_ids)
    generator = torch.Generator(device=device).manual_seed(seed)
    proposer.reset()
    run = _Target(target, proposer.target_layer_ids)

    # Buffers sized once: handing the proposer views instead of re-concatenating keeps a step O(block), not O(n).
    n = prompt.numel()
    capacity = n + max_new_tokens + max_draft + 1
    tokens = torch.empty(capacity, dtype=torch.long, device=device)
    tokens[:n] = prompt
    logits, feats = run(prompt)
    hidden = None
    if feats is not None:
        hidden = feats.new_empty(capacity, feats.shape[-1])
        hidden[: n] = feats
    _, tokens[n] = verify_block(Draft(tokens[:0]), logits[-1:], sampling, generator)
    n += 1
    new = n - 1
    gen = Generation(tokens=[int(tokens[n - 1])], stop_reason="length", target_forwards=0)

    while not (gen.tokens[-1] in stops or len(gen.tokens) >= max_new_tokens):
        ctx = DraftContext(tokens[:n], None if hidden is None else hidden[: n - 1], new, sampling, generator)
        draft = _as_draft(proposer.propose(ctx), device, max_draft, vocab)
        logits, feats = run(torch.cat([tokens[n - 1 : n], draft.tokens]))
        accepted, after = verify_block(draft, logits, sampling, generator)
        emitted = torch.cat([draft.tokens[:accepted], after.reshape(1)])
        # The cache read n - 1 + len(block) positions; it keeps the last accepted token and the accepted drafts.
        crop_cache(run.cache, draft.tokens.numel() - accepted)
        if hidden is not None:
            hidden[n - 1 : n + accepted] = feats[: accepted + 1]
        new = accepted + 1

        kept = _cut(emitted.tolist(), stops, max_new_tokens - len(gen.tokens))
        tokens[n : n + len(kept)] = emitted[: len(kept)]
        n += len(kept)
        gen.tokens += kept
        gen.drafted.append(draft.tokens.numel())
        gen.accepted.append(accepted)
        gen.produced.append(len(kept))

    gen.target_forwards = run.forwards
    if gen.tokens[-1] in stops:
        gen.stop_reason = "stop"
    return gen


def _cut(emitted: list[int], stops: set[int], room: int) -> list[int]:
    """The emitted tokens up to and including the first stop token, and no more than ``room``."""
    kept = emitted[:room]
    for i, t in enumerate(kept):
        if t in stops:
            return kept[: i + 1]
    return kept


def target_generate(
    target: PreTrainedModel,
    prompt_ids: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
    sampling: Sampling = GREEDY,
    seed: int = 0,
) -> Generation:
    """Target-only decoding with a KV cache: the reference that speculative decoding must reproduce (greedy: the
    same tokens; sampled: the same distribution)."""
    return speculative_generate(target, NoDraft(), prompt_ids, max_new_tokens, stop_ids, sampling, seed)


@torch.inference_mode()
def greedy_reference(target: PreTrainedModel, prompt_ids: Sequence[int], output: Sequence[int],
                     stop_ids: Collection[int] = ()) -> Generation:
    """Target-only greedy decoding of ``prompt_ids`` as far as ``output`` (another decoding's tokens) agrees with
    it, from ONE forward of the target over the prompt and ``output``: at each position the target's argmax given
    everything before it, which is what :func:`target_generate` emits there token by token (tested equal), at one
    forward instead of ``len(output)``. Where ``output`` first differs, the target's own token ends the list; where
    it agrees throughout, the list is ``output`` (it ended at a stop token or at the length target-only decoding
    stops at too). ``target_forwards`` counts what target-only decoding spends: one forward per token."""
    output = list(output)
    if not output:
        raise ValueError("output must hold at least one generated token")
    ids = torch.as_tensor([*prompt_ids, *output[:-1]], dtype=torch.long, device=target.device)
    choices = target(input_ids=ids[None]).logits[0, len(prompt_ids) - 1 :].argmax(-1).tolist()
    tokens = []
    for mine, theirs in zip(output, choices):
        tokens.append(theirs)
        if mine != theirs:
            break
    reason = "stop" if tokens[-1] in set(int(s) for s in stop_ids) else "length"
    return Generation(tokens=tokens, stop_reason=reason, target_forwards=len(output))


def greedy_generate(
    target: PreTrainedModel,
    prompt_ids: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
) -> Generation:
    """Target-only greedy decoding."""
    return target_generate(target, prompt_ids, max_new_tokens, stop_ids)
