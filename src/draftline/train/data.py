"""Training steps: rows filtered and cut, shuffled every epoch and packed end to end into one sequence per step.

The plan is a pure function of the data, the merge stage's row order and the params: the rows a rank trains on
at step ``s`` can be recomputed from ``s`` alone, which is what makes resuming exact.

* rows without two consecutive supervised tokens cannot anchor a block: counted and skipped;
* rows longer than ``max_length`` are cut (their supervised tail past the cut is lost, counted);
* every epoch shuffles the rows with ``(seed, epoch)`` and packs them, first fit in that order, into packs of at
  most ``max_tokens_per_batch`` tokens laid end to end (no padding): :func:`pack_rows`. A step trains on one pack per rank: rows of every length and source share a step, and which rows share
  one changes every epoch. (The plan before this one sorted rows by length into fixed batches: the same long tool
  row alone in its step every epoch, short rows 17 to a step; docs/train.md, "How rows become steps", measures it.)
  A pack's memory is bounded by the budget, whatever rows it holds;
* rank ``r`` of ``w`` takes every w-th pack of an epoch, and the epoch is cut to a multiple of ``w`` so that every
  rank makes the same number of steps (DDP needs that). Epochs may differ by a pack or two: the step -> epoch map
  adds up each epoch's own count.
"""

from __future__ import annotations

import math
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
    """The data and the params leave nothing to train on (no trainable row, fewer packs than ranks): the message
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


def pack_rows(rows: np.ndarray, lengths: np.ndarray, max_tokens: int, open_packs: int = 16) -> list[np.ndarray]:
    """``rows`` laid end to end into packs of at most ``max_tokens`` tokens, first fit: each row, in its order, goes
    into the first of the (at most ``open_packs``) open packs it fits, else opens one (the fullest open pack is
    closed first when ``open_packs`` are open). Packs come out in the order they were opened; a pack's rows in the
    order they came. Filling the gaps a strictly sequential packing leaves gives every step ~20% more tokens of the
    same budget on the embedded default (docs/train.md)."""
    sizes = lengths[rows]
    if len(sizes) and int(sizes.max()) > max_tokens:
        raise PlanError(f"a row of {int(sizes.max())} tokens does not fit train.max_tokens_per_batch={max_tokens}; "
                        "raise the budget or lower train.max_length")
    done: list[tuple[int, list[int]]] = []
    open_: list[tuple[int, list[int]]] = []  # (opening order, row positions), in opening order
    used: list[int] = []
    for i, n in enumerate(sizes.tolist()):
        k = next((k for k, u in enumerate(used) if u + n <= max_tokens), None)
        if k is None:
            if len(open_) == open_packs:
                full = max(range(len(used)), key=used.__getitem__)
                done.append(open_.pop(full))
                used.pop(full)
            open_.append((len(done) + len(open_), []))
            used.append(0)
            k = len(used) - 1
        open_[k][1].append(i)
        used[k] += n
    packs = sorted(done + open_)
    return [rows[np.array(p, dtype=np.int64)] for _, p in packs]


class BatchPlan:
    """Which rows each rank trains on at each step: one pack of an epoch's shuffled rows."""

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
        self.max_tokens = max_tokens_per_batch
        self.seed = seed
        self.world_size = world_size
        self._epoch: tuple[int, list[np.ndarray]] | None = None
        self._steps: list[int] = []  # steps of each epoch computed so far
        self.stats = scan_rows(dataset, max_length)
        order = np.asarray(order, dtype=np.int64)
        no_anchor = self.stats.anchors[order] == 0
        if skips is not None:
            for r in order[no_anchor]:
                skips.add("no two consecutive supervised tokens", f"row {int(r)}")
        self.rows = order[~no_anchor]
        if len(self.rows) == 0:
            raise PlanError("no training row has two consecutive supervised tokens: check the tokenize stage's loss masks")
        if self.steps_in(0) == 0:
            raise PlanError(
                f"{len(self.packs(0))} pack(s) of train.max_tokens_per_batch={max_tokens_per_batch} tokens cannot "
                f"feed {world_size} ranks; lower train.max_tokens_per_batch or train.gpus"
            )

    @property
    def tokens(self) -> int:
        return int(self.stats.lengths[self.rows].sum())

    def packs(self, epoch: int) -> list[np.ndarray]:
        """The packs of one epoch: the rows shuffled with ``(seed, epoch)``, packed in that order, cut to a multiple
        of the world size. The last epoch's are kept: a step costs no work proportional to the number of rows."""
        if self._epoch is None or self._epoch[0] != epoch:
            shuffled = np.random.default_rng([self.seed, epoch]).permutation(self.rows)
            packs = pack_rows(shuffled, self.stats.lengths, self.max_tokens)
            self._epoch = (epoch, packs[: len(packs) // self.world_size * self.world_size])
        return self._epoch[1]

    def steps_in(self, epoch: int) -> int:
        """Optimizer steps of ``epoch`` (its packs over the world size), remembered once computed."""
        while len(self._steps) <= epoch:
            self._steps.append(len(self.packs(len(self._steps))) // self.world_size)
        return self._steps[epoch]

    @property
    def steps_per_epoch(self) -> int:
        """The first epoch's steps: what ``train.epochs`` and the loss curve's epoch column count in."""
        return self.steps_in(0)

    def total_steps(self, epochs: float) -> int:
        """Steps of ``epochs`` passes: every whole epoch's own count, then the fraction of the next."""
        whole = int(epochs)
        return sum(self.steps_in(e) for e in range(whole)) + math.ceil((epochs - whole) * self.steps_in(whole))

    def locate(self, step: int) -> tuple[int, int]:
        """``(epoch, step within it)`` of a global step (0-based)."""
        epoch = 0
        while step >= self.steps_in(epoch):
            step -= self.steps_in(epoch)
            epoch += 1
        return epoch, step

    def epochs_at(self, step: int) -> float:
        """Passes over the data after ``step`` steps: whole epochs, then the share of the current one."""
        epoch, i = self.locate(step)
        return epoch + i / self.steps_in(epoch)

    def batch_rows(self, step: int, rank: int) -> np.ndarray:
        """Row indices of ``rank``'s pack at optimizer step ``step`` (0-based), across epochs."""
        epoch, i = self.locate(step)
        return self.packs(epoch)[i * self.world_size + rank]

    def pack_shapes(self, steps: int, anchors_per_seq: int) -> list[tuple[int, int, int]]:
        """:func:`pack_shapes` of every pack the first ``steps`` steps train on, every rank's, in the order
        ``(step, rank)``: the memory planner's input."""
        packs: list[np.ndarray] = []
        epoch = 0
        while len(packs) < steps * self.world_size:
            packs += self.packs(epoch)[: steps * self.world_size - len(packs)]
            epoch += 1
        return pack_shapes(packs, self.stats, anchors_per_seq)


def pack_shapes(packs: list[np.ndarray], stats: RowStats, anchors_per_seq: int) -> list[tuple[int, int, int]]:
    """``(tokens, longest row, anchors)`` of each pack: what its memory grows with (anchors: each row's candidates,
    capped at ``anchors_per_seq``)."""
    return [(int(stats.lengths[p].sum()), int(stats.lengths[p].max()),
             int(np.minimum(stats.anchors[p], anchors_per_seq).sum())) for p in packs]


@dataclass
class Batch:
    """Rows laid end to end: ``[b, n]`` (b = 1 for a pack), each token with its row and its position in that row."""

    input_ids: torch.Tensor  # [b, n] long
    loss_mask: torch.Tensor  # [b, n] bool
    row_of: torch.Tensor  # [b, n] long: which row of the pack a token belongs to (0, 1, ...)
    positions: torch.Tensor  # [b, n] long: the token's position within its row (RoPE position, as served)

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(*(t.to(device) for t in (self.input_ids, self.loss_mask, self.row_of, self.positions)))

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())


def collate(dataset: datasets.Dataset, rows: np.ndarray, max_length: int) -> Batch:
    """Read ``rows``, cut them to ``max_length`` and lay them end to end into one pack ``[1, tokens]``."""
    data = dataset.select_columns(["input_ids", "loss_mask"])[[int(r) for r in rows]]
    seqs = [torch.tensor(ids[:max_length], dtype=torch.long) for ids in data["input_ids"]]
    masks = [torch.tensor(m[:max_length], dtype=torch.bool) for m in data["loss_mask"]]
    lengths = torch.tensor([len(s) for s in seqs])
    row_of = torch.repeat_interleave(torch.arange(len(seqs)), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.arange(int(lengths.sum())) - starts[row_of]
    return Batch(torch.cat(seqs)[None], torch.cat(masks)[None], row_of[None], positions[None])
