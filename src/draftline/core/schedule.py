"""The one learning-rate schedule (linear warmup to the peak, then a cosine decay to ``min_ratio`` of it) and the one
optimizer (AdamW), used by the embedded target's build and by drafter training. The rate is computed from the step
alone (no scheduler state), so a resumed run sets exactly the rate an uninterrupted one does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch


def lr_at(step: int, peak: float, total: int, warmup: int, min_ratio: float) -> float:
    """The learning rate of 0-based ``step`` of ``total``: ``peak * (step + 1) / warmup`` during the ``warmup``
    steps, then ``peak * (min_ratio + (1 - min_ratio) * (1 + cos(pi * progress)) / 2)``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def adamw(params: Iterable[torch.nn.Parameter], lr: float, betas: Sequence[float], weight_decay: float) -> torch.optim.AdamW:
    """The one optimizer of the target's build and of drafter training: AdamW, fused (one kernel for every tensor
    instead of a loop of small ones; deterministic, on the CPU as on a GPU)."""
    return torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay, fused=True)
