"""The embedded build's optimizer steps, computed by one process or several (torch.distributed over gloo), with the
same bytes either way.

Invariants:

- **Workers change nothing but the speed.** Each step's batch is split into a fixed number of parts
  (``target.embedded.parts``); each part's gradient is computed alone, and the step's gradient is the sum of the
  parts' in part order, whether one process computed them all or each of several computed its own (gathered with
  ``all_gather``, never an ``all_reduce`` whose order of sums depends on the ring). Every rank then clips and steps
  the same sum, so every replica holds the same weights, and the weights are the same bytes for any number of workers
  (``tests/target/test_embedded_ranks.py``).
- **No barrier outlives a dead rank.** Ranks other than 0 are forked from the stage's process after the model is
  built (they inherit it and the batch order); a rank that dies closes its gloo connections, and rank 0's next
  gather raises, so the stage stops instead of waiting. A rank that fails exits non-zero and rank 0 says so.
- Forking needs one torch thread per process (a process forked after a multi-threaded OpenMP region hangs in its
  next one): with more threads, or where processes cannot be forked, the build runs in one process, and says so.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist

from draftline.core.errors import Refusal
from draftline.core.logs import get_logger
from draftline.core.threads import forkable

log = get_logger(__name__)

T = TypeVar("T")
# How long a rank waits for the others at a gather: a step takes under a second, so minutes mean a rank is gone.
GATHER_TIMEOUT = datetime.timedelta(minutes=10)


class RankFailed(Refusal, RuntimeError):
    """A forked rank of the embedded build ended badly: its own traceback is above, in the stage's output."""


def processes(workers: int, parts: int) -> int:
    """How many processes will compute the parts: ``workers``, at most ``parts``, and 1 where forking is unsafe."""
    n = forkable(max(1, min(workers, parts)), "target.embedded.workers")
    log.info("embedded build: %d part(s) per step on %d process(es)", parts, n)
    return n


def run_ranks(world: int, fn: Callable[[int, int], T]) -> T:
    """``fn(rank, world)`` in this process as rank 0 and in ``world - 1`` forked processes; rank 0's result.

    Inside ``fn`` the default process group (gloo) is up when ``world > 1``; :func:`summed_gradients` uses it."""
    if world == 1:
        return fn(0, 1)
    with tempfile.TemporaryDirectory(prefix="draftline-ranks-") as tmp:
        store = f"file://{Path(tmp) / 'store'}"
        ctx = mp.get_context("fork")
        children = [ctx.Process(target=_child, args=(fn, rank, world, store), daemon=True) for rank in range(1, world)]
        for child in children:
            child.start()
        error: BaseException | None = None
        try:
            _init(store, 0, world)
            result = fn(0, world)
        except BaseException as e:  # a gather that lost its peer: the peer's failure is the news, said below
            error = e
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            for child in children:
                child.join(timeout=60)
                if child.is_alive():
                    child.kill()
        failed = [i + 1 for i, c in enumerate(children) if c.exitcode != 0]
        if failed and not isinstance(error, KeyboardInterrupt):
            own = f"; rank 0: {type(error).__name__}: {error}" if error is not None else ""
            raise RankFailed(f"embedded build: rank(s) {failed} exited badly (see above){own}; run again, or set "
                             "target.embedded.workers: 1 to build in one process (the same bytes)") from error
        if error is not None:
            raise error
        return result


def _init(store: str, rank: int, world: int) -> None:
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world, timeout=GATHER_TIMEOUT)


def _child(fn: Callable[[int, int], object], rank: int, world: int, store: str) -> None:
    code = 0
    try:
        torch.set_num_threads(1)
        _init(store, rank, world)
        fn(rank, world)
        dist.destroy_process_group()
    except BaseException:  # the parent sees the exit code; the traceback goes to the stage's output
        traceback.print_exc()
        code = 1
    os._exit(code)  # no atexit handlers: they belong to the parent (pytest's, DVC's)


def my_parts(parts: int, rank: int, world: int) -> list[int]:
    """The parts ``rank`` computes: every ``world``-th from ``rank``."""
    return list(range(rank, parts, world))


def summed_gradients(params: Sequence[torch.nn.Parameter], mine: list[torch.Tensor], parts: int,
                     rank: int, world: int) -> torch.Tensor:
    """The sum, in part order, of every part's flat gradient: ``mine`` holds this rank's parts'
    (:func:`my_parts` order); the others' are gathered. Written into ``params``' ``.grad``; returned flat, with
    whatever the parts carried after the parameters' values (the build's loss shares) summed too."""
    if world == 1:
        ordered = mine
    else:
        slots = -(-parts // world)  # every rank sends as many rows; the missing ones are zeros, never read
        local = torch.zeros(slots, mine[0].numel())
        for i, g in enumerate(mine):
            local[i] = g
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        ordered = [gathered[part % world][part // world] for part in range(parts)]
    total = ordered[0].clone()
    for g in ordered[1:]:
        total += g
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = total[offset: offset + n].view_as(p).clone()
        offset += n
    return total
