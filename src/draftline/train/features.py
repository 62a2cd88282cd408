"""The target's features of every training row, computed once and kept in memory: SpecForge's offline mode, in RAM.

Online training runs the frozen target over every pack at every step; on the 6 x 256 embedded target of the time
that forward was 65% of a step, repeated for each of ~18 passes over the same rows. When the features of all rows fit
``train.feature_cache_gb`` they are computed in one pass and every step reads them instead.

* A row's features are its own: the target runs on each row alone, in the cache's pass as in an online step
  (:func:`draftline.train.objective.pack_features`), so a cached and an online run end with the same weights
  (tested), and what a row is packed with never changes them.
* A row's features are kept unpadded, ``[its tokens after the cut, features]``, in the dtype the target computes
  in; with ``final``, also the target's last hidden state (its next-token distribution at every position, for
  labels from the target). A pack is rebuilt by laying its rows' slices end to end.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from tqdm import tqdm

from draftline.train.data import BatchPlan

RowFeatures = Callable[[int], tuple[torch.Tensor, torch.Tensor | None]]
RowChains = Callable[[int], torch.Tensor]


def cache_bytes(plan: BatchPlan, width: int, element_size: int, final_width: int = 0, chain_depth: int = 0) -> int:
    """Bytes the cache of every trainable row would hold (``final_width``: the target's last hidden state too;
    ``chain_depth``: its greedy continuation after every token, int64)."""
    return plan.tokens * ((width + final_width) * element_size + chain_depth * 8)


class FeatureCache:
    """Features of every trainable row, one flat ``[tokens, width]`` tensor indexed by row, and optionally the
    target's last hidden state at each of them (``[tokens, hidden]``) and its greedy continuation after each
    (``[tokens, depth]``, :func:`draftline.train.greedy.greedy_chains`)."""

    def __init__(self, flat: torch.Tensor, starts: np.ndarray, lengths: np.ndarray, final: torch.Tensor | None = None,
                 chains: torch.Tensor | None = None):
        self.flat, self.starts, self.lengths, self.final, self.chains = flat, starts, lengths, final, chains

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.flat, self.final, self.chains) if t is not None)

    @classmethod
    def fill(cls, plan: BatchPlan, features_of: RowFeatures, width: int, final_width: int, dtype: torch.dtype,
             device: torch.device, show: bool = True, chains_of: RowChains | None = None,
             chain_depth: int = 0) -> "FeatureCache":
        """Run ``features_of(row) -> ([1, length, width], [1, length, final_width] | None)`` over every trainable
        row once, in the plan's row order (and ``chains_of(row) -> [1, length, chain_depth]`` when given)."""
        lengths = plan.stats.lengths
        starts = np.full(len(lengths), -1, dtype=np.int64)
        starts[plan.rows] = np.concatenate([[0], np.cumsum(lengths[plan.rows])[:-1]])
        flat = torch.empty((plan.tokens, width), dtype=dtype, device=device)
        final = torch.empty((plan.tokens, final_width), dtype=dtype, device=device) if final_width else None
        chains = torch.empty((plan.tokens, chain_depth), dtype=torch.long, device=device) if chains_of else None
        for r in tqdm(plan.rows, desc="target features", disable=not show, dynamic_ncols=True):
            features, last = features_of(int(r))
            flat[starts[r]: starts[r] + lengths[r]] = features[0]
            if final is not None:
                final[starts[r]: starts[r] + lengths[r]] = last[0]
            if chains is not None:
                chains[starts[r]: starts[r] + lengths[r]] = chains_of(int(r))[0]
        return cls(flat, starts, lengths, final, chains)

    def _slices(self, rows: np.ndarray) -> list[slice]:
        for r in rows:
            if self.starts[r] < 0:
                raise KeyError(f"row {int(r)} is not in the feature cache: it is not a trainable row of the plan")
        return [slice(self.starts[r], self.starts[r] + self.lengths[r]) for r in rows]

    def pack(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[1, tokens, width]``: the rows' features laid end to end, as their pack is; and the target's last
        hidden states ``[1, tokens, hidden]`` (or None)."""
        slices = self._slices(rows)
        features = torch.cat([self.flat[s] for s in slices])[None]
        return features, (None if self.final is None else torch.cat([self.final[s] for s in slices])[None])

    def pack_chains(self, rows: np.ndarray) -> torch.Tensor:
        """``[1, tokens, depth]``: the rows' greedy continuations laid end to end, as their pack is."""
        return torch.cat([self.chains[s] for s in self._slices(rows)])[None]
