"""Memory planning before step 1: find the worst pack the run will train on and refuse to start if it won't fit.

A run that dies of out-of-memory at step 690 wastes the 689 steps before it; the pack that kills it is known
before step 1, because the plan is fixed by the data and the params. The planner

1. ranks every pack of the run's steps by an analytic estimate of its peak (:func:`estimate_bytes`; what grows
   with the pack's tokens, its longest row, the number of block queries, and queries x keys of the mask),
2. takes the worst one and, on CUDA, really runs its forward and backward and reads the allocator's peak
   (plus the optimizer state not yet allocated); on CPU the estimate is the answer,
3. compares with ``train.memory_limit_gb`` and, when over, searches the largest ``max_tokens_per_batch``
   whose worst pack fits (the estimate scaled by measured/estimated) and names it in the error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from draftline.core.errors import Refusal

GB = 1024**3


class MemoryPlanError(Refusal, RuntimeError):
    """The worst batch needs more memory than ``train.memory_limit_gb``; the message says what fits."""


@dataclass
class Shapes:
    """What the estimate needs to know about the two models."""

    target_param_bytes: int
    drafter_params: int
    target_layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    drafter_layers: int
    features: int  # number of target layers tapped
    block_size: int
    act_bytes: int  # bytes per activation element (2 for bf16, 4 for fp32)
    resident_bytes: int = 0  # held for the whole run beside the weights: the feature cache


def estimate_bytes(m: Shapes, tokens: int, longest: int, anchors: int) -> int:
    """A deliberately generous estimate of the peak of one training step on a pack, in bytes.

    ``tokens``: the pack's; ``longest``: its longest row (the target runs on one row at a time); ``anchors``: its
    blocks. Terms: weights + fp32 master/grad/Adam state of the drafter + the feature cache; the target's hidden
    states kept by ``output_hidden_states`` for its longest row and its largest transient (MLP or attention scores);
    the pack's tapped features, last hidden state and their projection; per drafter layer the saved activations of
    the block queries, the context keys and values, the attention scores and the mask over [context | blocks]; the
    drafter's and the target's logits of the supervised labels.
    """
    a = m.act_bytes
    q = anchors * m.block_size
    kv = tokens + q
    static = m.target_param_bytes + 16 * m.drafter_params + m.resident_bytes
    target = (m.target_layers + 1) * longest * m.hidden * a + max(
        3 * longest * m.intermediate * a, 2 * m.heads * longest * longest * a
    )
    features = tokens * m.hidden * (m.features + 3) * 4
    per_layer = (
        q * (10 * m.hidden + 4 * m.intermediate) * a
        + 6 * tokens * m.kv_heads * m.head_dim * a
        + 3 * m.heads * q * kv * a
    )
    mask = q * kv * (1 + a)
    logits = 5 * anchors * (m.block_size - 1) * m.vocab * 4
    return int(static + target + features + m.drafter_layers * per_layer + mask + logits)


@dataclass
class Preflight:
    """The outcome: the worst pack and its peak (measured on CUDA, estimated elsewhere)."""

    tokens: int
    longest: int
    anchors: int
    peak_bytes: int
    estimated_bytes: int
    measured: bool
    limit_bytes: int

    def as_dict(self) -> dict:
        return {
            "worst_pack_tokens": self.tokens,
            "worst_pack_longest_row": self.longest,
            "worst_pack_anchors": self.anchors,
            "peak_gb": round(self.peak_bytes / GB, 4),
            "estimated_gb": round(self.estimated_bytes / GB, 4),
            "measured": self.measured,
            "limit_gb": round(self.limit_bytes / GB, 4),
        }


def worst_pack(shapes: Shapes, packs: list[tuple[int, int, int]]) -> tuple[int, tuple[int, int, int], int]:
    """``(index, (tokens, longest, anchors), estimate)`` of the pack with the largest estimated peak."""
    best = (-1, (0, 0, 0), -1)
    for i, shape in enumerate(packs):
        est = estimate_bytes(shapes, *shape)
        if est > best[2]:
            best = (i, shape, est)
    return best


def fitting_budget(shapes: Shapes, packs_at: Callable[[int], list[tuple[int, int, int]]], longest: int, budget: int,
                   limit_bytes: int, scale: float) -> int | None:
    """The largest token budget <= ``budget`` whose worst pack (``packs_at(budget)``) fits ``limit_bytes``; None if
    none does (``longest``: the longest row, below which no budget can go)."""

    def fits(b: int) -> bool:
        return worst_pack(shapes, packs_at(b))[2] * scale <= limit_bytes

    lo, hi = longest, budget
    if not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def preflight(
    shapes: Shapes,
    packs: list[tuple[int, int, int]],
    *,
    limit_gb: float,
    budget: int,
    packs_at: Callable[[int], list[tuple[int, int, int]]],
    measure: Callable[[int], int] | None = None,
) -> Preflight:
    """Check the worst of ``packs`` (every pack the run trains on) against the limit; raise
    :class:`MemoryPlanError` naming a budget that fits (searched over ``packs_at(budget)``: an epoch's packs).

    ``measure(pack_index) -> peak bytes`` runs the real step on the accelerator (None on CPU).
    """
    limit = int(limit_gb * GB)
    index, (tokens, longest, n_anchors), est = worst_pack(shapes, packs)
    peak = measure(index) if measure is not None else est
    result = Preflight(tokens, longest, n_anchors, peak, est, measure is not None, limit)
    if peak <= limit:
        return result
    fit = fitting_budget(shapes, packs_at, max(p[1] for p in packs), budget, limit, peak / est)
    what = "measured" if measure is not None else "estimated"
    head = (
        f"memory preflight: the worst pack ({tokens} tokens, longest row {longest}, {n_anchors} anchors) needs "
        f"{peak / GB:.2f} GB ({what}), over train.memory_limit_gb={limit_gb}. "
    )
    if fit is None:
        raise MemoryPlanError(
            head + "Even a pack of one longest row does not fit: lower train.max_length or "
            "train.anchors_per_seq, or raise train.memory_limit_gb on a larger device."
        )
    raise MemoryPlanError(head + f"Set train.max_tokens_per_batch <= {fit} (now {budget}) to fit.")
