"""Memory planning before step 1: find the worst batch the data can produce and refuse to start if it won't fit.

A run that dies of out-of-memory at step 690 wastes the 689 steps before it; the batch that kills it is known
before step 1, because the batch plan is fixed by the data and the params. The planner

1. ranks every planned batch by an analytic estimate of its peak (:func:`estimate_bytes`; what grows with
   rows x length, with the number of block queries, and with queries x keys of the attention mask),
2. takes the worst one and, on CUDA, really runs its forward and backward and reads the allocator's peak
   (plus the optimizer state not yet allocated); on CPU the estimate is the answer,
3. compares with ``train.memory_limit_gb`` and, when over, searches the largest ``max_tokens_per_batch``
   whose worst batch fits (the estimate scaled by measured/estimated) and names it in the error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from draftline.core.errors import Refusal
from draftline.train.data import pack_batches

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


def estimate_bytes(m: Shapes, rows: int, length: int, anchors: int) -> int:
    """A deliberately generous estimate of one training step's peak, in bytes.

    Terms: weights + fp32 master/grad/Adam state of the drafter + the feature cache; the target's hidden states kept by
    ``output_hidden_states`` and its largest transient (MLP or attention scores); the tapped features and
    their projection; per drafter layer the saved activations of the block queries, the context keys and
    values, the attention scores and the mask over [context | blocks]; the logits of the supervised labels.
    """
    a = m.act_bytes
    tokens = rows * length
    q = rows * anchors * m.block_size
    kv = length + anchors * m.block_size
    static = m.target_param_bytes + 16 * m.drafter_params + m.resident_bytes
    target = (m.target_layers + 1) * tokens * m.hidden * a + max(
        3 * tokens * m.intermediate * a, 2 * rows * m.heads * length * length * a
    )
    features = tokens * m.hidden * (m.features + 2) * 4
    per_layer = (
        q * (10 * m.hidden + 4 * m.intermediate) * a
        + 6 * tokens * m.kv_heads * m.head_dim * a
        + 3 * rows * m.heads * anchors * m.block_size * kv * a
    )
    mask = rows * anchors * m.block_size * kv * (1 + a)
    logits = 3 * rows * anchors * (m.block_size - 1) * m.vocab * 4
    return int(static + target + features + m.drafter_layers * per_layer + mask + logits)


@dataclass
class Preflight:
    """The outcome: the worst batch and its peak (measured on CUDA, estimated elsewhere)."""

    rows: int
    length: int
    anchors: int
    peak_bytes: int
    estimated_bytes: int
    measured: bool
    limit_bytes: int

    def as_dict(self) -> dict:
        return {
            "worst_batch_rows": self.rows,
            "worst_batch_length": self.length,
            "worst_batch_anchors": self.anchors,
            "peak_gb": round(self.peak_bytes / GB, 4),
            "estimated_gb": round(self.estimated_bytes / GB, 4),
            "measured": self.measured,
            "limit_gb": round(self.limit_bytes / GB, 4),
        }


def worst_batch(
    shapes: Shapes, batches: list[tuple[int, int, int]], anchors_per_seq: int
) -> tuple[int, tuple[int, int, int], int]:
    """``(index, (rows, length, anchors), estimate)`` of the batch with the largest estimated peak."""
    best = (-1, (0, 0, 0), -1)
    for i, (rows, length, candidates) in enumerate(batches):
        shape = (rows, length, min(anchors_per_seq, candidates))
        est = estimate_bytes(shapes, *shape)
        if est > best[2]:
            best = (i, shape, est)
    return best


def fitting_budget(
    shapes: Shapes,
    rows: np.ndarray,
    lengths: np.ndarray,
    anchors: np.ndarray,
    anchors_per_seq: int,
    budget: int,
    limit_bytes: int,
    scale: float,
) -> int | None:
    """The largest token budget <= ``budget`` whose worst batch fits ``limit_bytes``; None if none does."""

    def fits(b: int) -> bool:
        packed = pack_batches(rows, lengths, b)
        shapes_list = [(len(x), int(lengths[x].max()), int(anchors[x].max())) for x in packed]
        return worst_batch(shapes, shapes_list, anchors_per_seq)[2] * scale <= limit_bytes

    lo, hi = int(lengths[rows].max()), budget  # the budget can never go below the longest row
    if not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def preflight(
    shapes: Shapes,
    batches: list[tuple[int, int, int]],
    *,
    anchors_per_seq: int,
    limit_gb: float,
    budget: int,
    rows: np.ndarray,
    lengths: np.ndarray,
    anchors: np.ndarray,
    measure: Callable[[int], int] | None = None,
) -> Preflight:
    """Check the worst batch against the limit; raise :class:`MemoryPlanError` naming a budget that fits.

    ``measure(batch_index) -> peak bytes`` runs the real step on the accelerator (None on CPU).
    """
    limit = int(limit_gb * GB)
    index, (n_rows, length, n_anchors), est = worst_batch(shapes, batches, anchors_per_seq)
    peak = measure(index) if measure is not None else est
    result = Preflight(n_rows, length, n_anchors, peak, est, measure is not None, limit)
    if peak <= limit:
        return result
    fit = fitting_budget(shapes, rows, lengths, anchors, anchors_per_seq, budget, limit, peak / est)
    what = "measured" if measure is not None else "estimated"
    head = (
        f"memory preflight: the worst batch ({n_rows} rows x {length} tokens, {n_anchors} anchors per row) needs "
        f"{peak / GB:.2f} GB ({what}), over train.memory_limit_gb={limit_gb}. "
    )
    if fit is None:
        raise MemoryPlanError(
            head + "Even one row of the longest length does not fit: lower train.max_length or "
            "train.anchors_per_seq, or raise train.memory_limit_gb on a larger device."
        )
    raise MemoryPlanError(head + f"Set train.max_tokens_per_batch <= {fit} (now {budget}) to fit.")
