"""Greedy speculative decoding: a proposer drafts a block, the target verifies the whole block in one forward pass.

Lossless by construction: every token emitted is the target's own argmax given the tokens before it. The proposer
only decides how many of those tokens one target forward pass yields (the acceptance length, tau).

One step, with ``n`` tokens accepted so far and the target's KV cache holding the first ``n - 1`` of them::

    block     = [last accepted token, d_1 .. d_m]        m <= B - 1 drafted tokens
    posterior = argmax(target(block, cache))              p_i predicts the token after block[i]
    a         = longest prefix with d_{i+1} == p_i        accepted drafts
    emit        d_1 .. d_a, p_a                           a + 1 tokens: the accepted drafts and the target's bonus
    crop        the cache back to n + a positions         the rejected drafts' keys and values leave it

so a step costs one target forward over the block only. The target-only baseline is the same loop with no drafts
(one token per forward), which makes the forward-pass counts of the two directly comparable.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

from draftline.drafter.model import DFlashDrafter, target_features


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


class Proposer(Protocol):
    """Anything that drafts up to ``block_size - 1`` tokens after the last accepted one."""

    block_size: int
    # Decoder layers (0-based) whose outputs the proposer reads: layer i is ``output.hidden_states[i + 1]``,
    # the convention of DFlash's ``target_layer_ids``. Empty: no hidden states are gathered.
    target_layer_ids: Sequence[int]

    def reset(self) -> None:
        """Forget any per-prompt state (a drafter KV cache) before a new prompt."""

    def propose(self, ctx: DraftContext) -> torch.Tensor:
        """Return a 1-D tensor of at most ``block_size - 1`` token ids to verify."""


class NoDraft:
    """Proposes nothing: the loop becomes plain target-only greedy decoding with a KV cache."""

    block_size = 1
    target_layer_ids: Sequence[int] = ()

    def reset(self) -> None:
        pass

    def propose(self, ctx: DraftContext) -> torch.Tensor:
        return ctx.tokens.new_empty(0)


class DFlashProposer:
    """Drafts with a DFlash drafter: one drafter pass over [last accepted token, B-1 mask tokens] per step.

    The drafter's cache holds the projected context of every committed position; each step appends only the
    features of the tokens accepted since the previous step (``ctx.new``).
    """

    def __init__(self, drafter: DFlashDrafter):
        self.drafter = drafter
        self.block_size = drafter.block_size
        self.target_layer_ids = tuple(drafter.target_layer_ids)
        self.cache = drafter.new_cache()

    def reset(self) -> None:
        self.cache = self.drafter.new_cache()

    def propose(self, ctx: DraftContext) -> torch.Tensor:
        if self.cache.length + ctx.new != len(ctx.tokens) - 1:
            raise RuntimeError(
                f"drafter cache out of step: it holds {self.cache.length} positions, {ctx.new} arrive, "
                f"but {len(ctx.tokens) - 1} are committed"
            )
        logits = self.drafter.draft_logits(ctx.hidden[None, len(ctx.hidden) - ctx.new :], ctx.tokens[-1:], self.cache)
        return logits[0].argmax(dim=-1)


@dataclass
class Generation:
    """One prompt's output and the accounting that tau, the saved forward passes and acceptance plots come from."""

    tokens: list[int]  # generated ids (prompt excluded), ending at the first stop token (kept) or at max_new_tokens
    stop_reason: str  # "stop" (a stop token was generated) or "length" (max_new_tokens reached)
    target_forwards: int = 1  # the prefill, plus one per verification step
    drafted: list[int] = field(default_factory=list)  # per step: tokens the proposer drafted
    accepted: list[int] = field(default_factory=list)  # per step: drafts the target accepted (the matching prefix)
    produced: list[int] = field(default_factory=list)  # per step: tokens emitted (accepted + bonus, cut at the end)

    @property
    def steps(self) -> int:
        return len(self.produced)


def _cache_kwarg(model: PreTrainedModel) -> str:
    # transformers 5.x renamed `past_key_values` to `cache` (the old name warns and will go); 4.x knows only the old.
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
        n_layers = model.config.num_hidden_layers
        bad = [i for i in layer_ids if not 0 <= i < n_layers]
        if bad:
            raise ValueError(f"target_layer_ids {bad} are outside the target's {n_layers} decoder layers")
        self.model = model
        self.layer_ids = tuple(layer_ids)
        self.cache = DynamicCache(config=model.config)
        self.cache_kwarg = _cache_kwarg(model)
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


@torch.inference_mode()
def speculative_generate(
    target: PreTrainedModel,
    proposer: Proposer,
    prompt_ids: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
) -> Generation:
    """Greedy decoding of ``prompt_ids`` (batch size 1) where the target verifies the proposer's blocks.

    The output equals target-only greedy decoding up to floating-point differences between a block forward and a
    one-token forward (exactly equal in float32 on the models tested; bf16 can flip near-ties).
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
    tokens[n] = logits[-1].argmax()
    n += 1
    new = n - 1
    gen = Generation(tokens=[int(tokens[n - 1])], stop_reason="length", target_forwards=0)

    while not (gen.tokens[-1] in stops or len(gen.tokens) >= max_new_tokens):
        ctx = DraftContext(tokens[:n], None if hidden is None else hidden[: n - 1], new)
        draft = torch.as_tensor(proposer.propose(ctx), dtype=torch.long, device=device).reshape(-1)
        if draft.numel() > max_draft:
            raise ValueError(f"the proposer drafted {draft.numel()} tokens; a block of {max_draft + 1} holds {max_draft}")
        if draft.numel() and not (0 <= int(draft.min()) and int(draft.max()) < vocab):
            raise ValueError(f"the proposer drafted ids outside the target's vocabulary [0, {vocab})")

        logits, feats = run(torch.cat([tokens[n - 1 : n], draft]))
        posterior = logits.argmax(dim=-1)
        accepted = int((draft == posterior[: draft.numel()]).to(torch.long).cumprod(0).sum())
        emitted = torch.cat([draft[:accepted], posterior[accepted : accepted + 1]])
        # The cache read n - 1 + len(block) positions; it keeps the last accepted token and the accepted drafts.
        crop_cache(run.cache, draft.numel() - accepted)
        if hidden is not None:
            hidden[n - 1 : n + accepted] = feats[: accepted + 1]
        new = accepted + 1

        kept = _cut(emitted.tolist(), stops, max_new_tokens - len(gen.tokens))
        tokens[n : n + len(kept)] = emitted[: len(kept)]
        n += len(kept)
        gen.tokens += kept
        gen.drafted.append(draft.numel())
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


def greedy_generate(
    target: PreTrainedModel,
    prompt_ids: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    stop_ids: Collection[int] = (),
) -> Generation:
    """Target-only greedy decoding with a KV cache: the reference that speculative decoding must reproduce."""
    return speculative_generate(target, NoDraft(), prompt_ids, max_new_tokens, stop_ids)
