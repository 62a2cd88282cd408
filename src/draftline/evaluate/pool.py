"""Every (setting, request) decoded on ``evaluate.workers`` processes, the results handed back in request order.

Invariants:

- **Workers change nothing but the speed.** A request's results depend on the request, its setting and the models
  alone: every turn's draws come from its own seed, the target's and the drafter's caches start empty at every
  turn, and every process runs ``evaluate.threads`` threads. So the results, and every byte the stage writes, are
  the same for any number of workers (tests/evaluate/test_evaluate.py).
- **A busy core holds up one request, not the run.** Requests are handed out one at a time from a queue and nothing
  waits at a barrier, so a worker whose core is taken delays only the request it holds.
- **A dead worker stops the stage.** A worker killed halfway (the OOM killer, a SIGKILL) raises :class:`WorkerDied`
  before anything is written; nothing half-decoded is reported.
- **Skips are the parent's.** A worker records the skips of its request; the parent replays them in request order,
  so the counts, the log lines and a strict stop are those of one process.

The workers are forked from the stage's process after it has loaded the models, and inherit them (copy on
write); the params allow it only with one torch thread per process (a process forked after a multi-threaded OpenMP
region hangs in its next one). Where processes cannot be forked (Windows), or on a GPU (a CUDA context does not survive a fork, and every
worker would hold another copy of the target), the stage decodes in its own process, and says so.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import torch

from draftline.core.errors import Refusal
from draftline.core.logs import get_logger
from draftline.core.requests import Request
from draftline.core.skips import Skips
from draftline.core.threads import forkable
from draftline.drafter.speculative import Sampling
from draftline.evaluate.decoder import Decoder
from draftline.evaluate.report import TurnResult

log = get_logger(__name__)

class WorkerDied(Refusal, RuntimeError):
    """A decoding worker process ended without a result: the message says what to do."""


# One unit of work: a setting's name, its sampling, a request, and the thinking mode to render it in.
Job = tuple[str, Sampling, Request, bool | None]


class SkipRecord:
    """Stands in for :class:`Skips` in a worker: the skips of one request, to be replayed by the parent."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def add(self, reason: str, where: str, detail: str = "") -> None:
        self.events.append((reason, where, detail))


# The decoder the forked workers inherit: set by the parent just before it forks them.
_DECODER: Decoder | None = None


def _start(threads: int) -> None:
    torch.set_num_threads(threads)  # the parent's count, stated: a forked process keeps it, a spawned one would not


def _decode(job: Job) -> tuple[list[TurnResult], list[tuple[str, str, str]]]:
    assert _DECODER is not None, "worker not forked from decode_all"
    skips = SkipRecord()
    return _DECODER.request(*job, skips), skips.events


def processes(workers: int, decoder: Decoder) -> int:
    """How many processes will decode: ``workers``, or 1 where they cannot be forked or the models are on a GPU."""
    n = forkable(workers, "evaluate.workers")
    if n > 1 and decoder.target.device.type != "cpu":
        log.info("decoding on %s in one process (evaluate.workers applies on the CPU)", decoder.target.device)
        n = 1
    log.info("decoding on %d process(es)", n)
    return n


def decode_all(jobs: Sequence[Job], decoder: Decoder, workers: int, skips: Skips) -> Iterator[list[TurnResult]]:
    """Each job's turn results, in ``jobs`` order, from :func:`processes` processes of this one's torch threads.

    A worker that dies (killed, out of memory) stops the stage with :class:`WorkerDied`, before anything is written;
    a ``multiprocessing.Pool`` would wait for its result forever."""
    if processes(workers, decoder) == 1:
        for job in jobs:
            yield decoder.request(*job, skips)
        return
    global _DECODER
    _DECODER = decoder
    pool = ProcessPoolExecutor(workers, mp.get_context("fork"), _start, (torch.get_num_threads(),))
    try:
        for results, events in pool.map(_decode, jobs):
            for event in events:
                skips.add(*event)
            yield results
    except BrokenProcessPool as e:
        raise WorkerDied("a decoding worker died (killed, or out of memory?) and nothing was written: run the stage "
                         "again, or with evaluate.workers: 1 to decode in one process") from e
    finally:
        pool.shutdown(cancel_futures=True)  # a stop (a strict skip, an error) does not decode the rest first
        _DECODER = None
