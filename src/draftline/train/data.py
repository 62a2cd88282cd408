"""Training batches: rows filtered and truncated, bucketed by length, packed to a token budget, sharded by rank.

The plan is a pure function of the data, the merge stage's row order and the params: the batch a rank trains
on at step ``s`` can be recomputed from ``s`` alone, which is what makes resuming exact.

* rows without two consecutive supervised tokens cannot anchor a block: counted and skipped;
* rows longer than ``max_length`` are cut (their supervised tail past the cut is lost, counted);
* rows are sorted by length (stable, so ties keep the merge order) and packed greedily into batches whose
  padded size ``rows x longest`` stays within ``max_tokens_per_batch``: similar lengths share a batch, so
  padding stays small and the memory of a batch is bounded by the budget;
* each epoch shuffles the batches with ``seed + epoch``; rank ``r`` of ``w`` takes every w-th batch, and the
  epoch is cut to a multiple of ``w`` so that every rank makes the same number of steps (DDP needs that).
"""

from __future__ import annotations

from dataclasses import dataclass

import datasets
import numpy as np
import torch

from draftline.core.errors import Refusal
from draftline.core.skips import Skips

# Rows scanned per Arrow batch when measuring the dataset. The scan holds ~10 bytes per token of a batch (1,024 rows
# of 2,800 tokens: ~30 MB); 8,192 rows held ~750 MB and the allocator kept part of it, so peak memory grew with
# the number of batches scanned.
_SCAN_ROWS = 1024


class PlanError(Refusal, ValueError):
    """The data and the params leave nothing to train on (no trainable row, fewer batches than ranks): the message
    says what to change."""


@dataclass
class RowStats:
    """Per row of the dataset (in dataset index order): tokens kept after the cut and anchors it offers."""

    lengths: np.ndarray
    anchors: np.ndarray
    kept_loss_tokens: int  # supervised tokens inside the cut (of every row, trainable or not)
    cut_loss_tokens: int  # supervised tokens past ``max_length``: lost to training, counted


def scan_rows(dataset: datasets.Dataset, max_length: int) -> RowStats:
    """Length after the cut and number of anchor candidates of every row, vectorised over Arrow buffers."""
    lengths, anchors, kept, cut = [], [], 0, 0
    for table in dataset.select_columns(["loss_mask"]).with_format("arrow").iter(batch_size=_SCAN_ROWS):
        col = table.column("loss_mask").combine_chunks()
        offsets = col.offsets.to_numpy().astype(np.int64)
        offsets -= offsets[0]
        values = col.flatten().to_numpy(zero_copy_only=False)  # the rows' tokens only, even of a sliced array
        starts, full_ends = offsets[:-1], offsets[1:]
        ends = np.minimum(full_ends, starts + max_length)
        # pair_csum[j]: pairs (token i, token i+1 both supervised) with i < j; a row's pairs lie in [start, end-1).
        pair_csum = _prefix_sum(values[:-1] & values[1:])
        count = np.where(ends - starts >= 2, pair_csum[np.maximum(ends - 1, starts)] - pair_csum[starts], 0)
        loss_csum = _prefix_sum(values)
        kept += int((loss_csum[ends] - loss_csum[starts]).sum())
        cut += int((loss_csum[full_ends] - loss_csum[ends]).sum())
        lengths.append(ends - starts)
        anchors.append(count)
    return RowStats(
        lengths=np.concatenate(lengths) if lengths else np.zeros(0, np.int64),
        anchors=np.concatenate(anchors) if anchors else np.zeros(0, np.int64),
        kept_loss_tokens=kept,
        cut_loss_tokens=cut,
    )


def _prefix_sum(flags: np.ndarray) -> np.ndarray:
    """``out[j]`` = true flags before ``j`` (``len(flags) + 1`` entries), in int32: 4 bytes a token, not 8."""
    out = np.zeros(len(flags) + 1, dtype=np.int32)
    np.cumsum(flags, dtype=np.int32, out=out[1:])
    return out


def pack_batches(rows: np.ndarray, lengths: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Sort ``rows`` by length (longest first, stable) and pack them so that ``n x longest <= max_tokens``."""
    order = np.argsort(-lengths[rows], kind="stable")
    batches: list[np.ndarray] = []
    current: list[int] = []
    longest = 0
    for r in rows[order]:
        n = int(lengths[r])
        if n > max_tokens:
            raise PlanError(
                f"a row of {n} tokens does not fit train.max_tokens_per_batch={max_tokens}; "
                "raise the budget or lower train.max_length"
            )
        if current and (len(current) + 1) * max(longest, n) > max_tokens:
            batches.append(np.array(current, dtype=np.int64))
            current, longest = [], 0
        current.append(int(r))
        longest = max(longest, n)
    if current:
        batches.append(np.array(current, dtype=np.int64))
    return batches


class BatchPlan:
    """Which rows each rank trains on at each step."""

    def __init__(
        self,
        dataset: datasets.Dataset,
        order: np.ndarray,
        *,
        max_length: int,
        max_tokens_per_batch: int,
        seed: int,
        world_size: int = 1,
        skips: Skips | None = None,
    ):
        self.max_length = max_length
        self.seed = seed
        self.world_size = world_size
        self._epoch: tuple[int, np.ndarray] | None = None
        self.stats = scan_rows(dataset, max_length)
        order = np.asarray(order, dtype=np.int64)
        no_anchor = self.stats.anchors[order] == 0
        if skips is not None:
            for r in order[no_anchor]:
                skips.add("no two consecutive supervised tokens", f"row {int(r)}")
        self.rows = order[~no_anchor]
        if len(self.rows) == 0:
            raise PlanError("no training row has two consecutive supervised tokens: check the tokenize stage's loss masks")
        self.batches = pack_batches(self.rows, self.stats.lengths, max_tokens_per_batch)
        self.steps_per_epoch = len(self.batches) // world_size
        if self.steps_per_epoch == 0:
            raise PlanError(
                f"{len(self.batches)} batch(es) cannot feed {world_size} ranks; "
                "lower train.max_tokens_per_batch or train.gpus"
            )

    @property
    def tokens(self) -> int:
        return int(self.stats.lengths[self.rows].sum())

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The batch indices of one epoch, shuffled with ``seed + epoch``, cut to a multiple of the world size.

        The last epoch's is kept: a step costs no work proportional to the number of batches (the permutation
        of 339K batches took 3.7 ms, paid at every step)."""
        if self._epoch is None or self._epoch[0] != epoch:
            perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.batches))
            self._epoch = (epoch, perm[: self.steps_per_epoch * self.world_size])
        return self._epoch[1]

    def batch_rows(self, step: int, rank: int) -> np.ndarray:
        """Row indices for ``rank`` at optimizer step ``step`` (0-based), across epochs."""
        epoch, i = divmod(step, self.steps_per_epoch)
        return self.batches[self.epoch_order(epoch)[i * self.world_size + rank]]

    def padded_shapes(self) -> list[tuple[int, int, int]]:
        """``(rows, padded length, most anchor candidates of a row)`` of every batch: the memory planner's input."""
        out = []
        for b in self.batches:
            out.append((len(b), int(self.stats.lengths[b].max()), int(self.stats.anchors[b].max())))
        return out


@dataclass
class Batch:
    input_ids: torch.Tensor  # [b, s] long, right-padded
    loss_mask: torch.Tensor  # [b, s] bool, False on padding
    attention_mask: torch.Tensor  # [b, s] long, 0 on padding

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(self.input_ids.to(device), self.loss_mask.to(device), self.attention_mask.to(device))

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())


def collate(dataset: datasets.Dataset, rows: np.ndarray, max_length: int, pad_token_id: int) -> Batch:
    """Read ``rows``, cut them to ``max_length`` and right-pad them into one batch."""
    data = dataset.select_columns(["input_ids", "loss_mask"])[[int(r) for r in rows]]
    seqs = [ids[:max_length] for ids in data["input_ids"]]
    masks = [m[:max_length] for m in data["loss_mask"]]
    s = max(len(x) for x in seqs)
    input_ids = torch.full((len(seqs), s), pad_token_id, dtype=torch.long)
    loss_mask = torch.zeros((len(seqs), s), dtype=torch.bool)
    attention_mask = torch.zeros((len(seqs), s), dtype=torch.long)
    for i, (ids, m) in enumerate(zip(seqs, masks)):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.bool)
        attention_mask[i, : len(ids)] = 1
    return Batch(input_ids, loss_mask, attention_mask)
