"""The target's features of every training row, computed once and kept in memory: SpecForge's offline mode, in RAM.

Online training runs the frozen target over every batch at every step; on the 6 x 256 embedded target of the time
that forward was 65% of a step, repeated for each of ~18 passes over the same rows. When the features of all rows fit
``train.feature_cache_gb`` they are computed in one pass and every step reads them instead.

* The cache is filled by one pass over the plan's batches in index order: its contents depend on the data, the
  target and the plan, never on the epoch order, the world size or the step a run resumed from.
* A row's features are kept unpadded, ``[its tokens after the cut, features]``, in the dtype the target computes
  in. A batch is rebuilt right-padded with zeros: no block attends to padding (a block's context ends before its
  anchor, which lies inside its row).
* The pass runs the plan's own batches, the very forward a step would run: the features are the online ones bit for
  bit, so a cached and an online run end with the same weights (tested) and the budget is not in the resume key.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from tqdm import tqdm

from draftline.train.data import BatchPlan


def cache_bytes(plan: BatchPlan, width: int, element_size: int, next_ids: bool = False) -> int:
    """Bytes the cache of every trainable row would hold (+ 4 a token for the target's next ids)."""
    return plan.tokens * (width * element_size + (4 if next_ids else 0))


class FeatureCache:
    """Features of every trainable row, one flat ``[tokens, width]`` tensor indexed by row, and optionally the
    target's greedy next token at each of them (``[tokens]`` int32: ``selector_labels: target``)."""

    def __init__(self, flat: torch.Tensor, starts: np.ndarray, lengths: np.ndarray,
                 next_ids: torch.Tensor | None = None):
        self.flat, self.starts, self.lengths, self.next_ids = flat, starts, lengths, next_ids

    @classmethod
    def fill(
        cls,
        plan: BatchPlan,
        features_of: Callable[[np.ndarray], tuple[torch.Tensor, torch.Tensor | None]],
        width: int,
        dtype: torch.dtype,
        device: torch.device,
        next_ids: bool = False,
        show: bool = True,
    ) -> "FeatureCache":
        """Run ``features_of(rows) -> ([rows, padded length, width], [rows, padded length] | None)`` over every
        planned batch once."""
        lengths = plan.stats.lengths
        starts = np.full(len(lengths), -1, dtype=np.int64)
        starts[plan.rows] = np.concatenate([[0], np.cumsum(lengths[plan.rows])[:-1]])
        flat = torch.empty((plan.tokens, width), dtype=dtype, device=device)
        flat_ids = torch.empty(plan.tokens, dtype=torch.int32, device=device) if next_ids else None
        for rows in tqdm(plan.batches, desc="target features", disable=not show, dynamic_ncols=True):
            batch, ids = features_of(rows)
            for i, r in enumerate(rows):
                flat[starts[r]: starts[r] + lengths[r]] = batch[i, : lengths[r]]
                if flat_ids is not None:
                    flat_ids[starts[r]: starts[r] + lengths[r]] = ids[i, : lengths[r]]
        return cls(flat, starts, lengths, flat_ids)

    def batch(self, rows: np.ndarray, length: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[rows, length, width]``: each row's features, zero past its end; and its next ids ``[rows, length]``
        (or None)."""
        out = torch.zeros((len(rows), length, self.flat.shape[1]), dtype=self.flat.dtype, device=self.flat.device)
        ids = None if self.next_ids is None else torch.zeros((len(rows), length), dtype=torch.int32,
                                                             device=self.flat.device)
        for i, r in enumerate(rows):
            start = self.starts[r]
            if start < 0:
                raise KeyError(f"row {int(r)} is not in the feature cache: it is not a trainable row of the plan")
            out[i, : self.lengths[r]] = self.flat[start: start + self.lengths[r]]
            if ids is not None:
                ids[i, : self.lengths[r]] = self.next_ids[start: start + self.lengths[r]]
        return out, ids
