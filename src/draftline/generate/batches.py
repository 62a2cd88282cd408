"""The ``local`` backend's driver: fixed batches over all prompts, dealt to this process and spawned workers.

Invariants:

- **Batches are fixed over ALL prompts** (``Plan.ordered``, cut every ``local.batch_size``), never over the pending
  ones, so a resumed run computes every batch exactly as an uninterrupted one (padding and batch shape change
  floating-point results). A batch with nothing pending is skipped; of a batch that runs, only the pending prompts'
  results are journaled.
- **The thread count is fixed** (``generate.local.threads``, see :mod:`draftline.core.threads`).
- **Workers change nothing but the speed.** With ``workers`` > 1 the batches are dealt round-robin to that many
  processes (this one and spawned ones), each with its own model, journaling to the one journal: the same batches,
  the same threads, hence the same bytes as one process. Only this process counts progress; it takes the other
  workers' results from the journal (:func:`_count_others`).
- Writer ``n`` of a shared journal starts at batch :func:`~draftline.generate.journal.start_at`.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from draftline.core.logs import get_logger
from draftline.core.records import PromptRecord, TargetInfo
from draftline.core.threads import torch_threads
from draftline.generate.journal import OK, Journal, start_at
from draftline.generate.params import GenerateParams
from draftline.generate.regeneration import Regeneration
from draftline.generate.work import Plan, Work

log = get_logger(__name__)


def generate_local(work: Work, s: GenerateParams, info: TargetInfo) -> dict[str, int]:
    """Generate ``work``'s pending prompts with the target in-process; returns the requests made (and no retries)."""
    size, n = s.local.batch_size, s.local.num_workers()
    starts = list(range(0, len(work.plan.ordered), size))
    first = start_at(len(starts), work.journal.join())
    starts = starts[first:] + starts[:first]
    log.info("generating %d batches of %d on %d process(es) (generate.local.workers: %s)", len(starts), size, n,
             s.local.workers)
    if n == 1:
        return {"requests": _run_batches(work, starts, s, info), "retries": 0}
    ctx = multiprocessing.get_context("spawn")  # a fork would copy this process's torch threads and locks
    with ProcessPoolExecutor(n - 1, mp_context=ctx) as pool:
        others = [pool.submit(_local_worker, work.plan, starts[k::n], s, info, work.journal.folder)
                  for k in range(1, n)]
        sent = _run_batches(work, starts[::n], s, info, others)
        while not all(f.done() for f in others):  # count what the other workers journal while they finish
            wait(others, timeout=1.0)
            _count_others(work)
        sent += sum(f.result() for f in others)  # a worker's error is raised here
    _count_others(work)
    return {"requests": sent, "retries": 0}


def _local_worker(plan: Plan, starts: list[int], s: GenerateParams, info: TargetInfo, folder: Path) -> int:
    """A spawned worker: its share of the batches, journaled to the shared journal (no progress bar of its own)."""
    journal = Journal(folder)
    journal.load()
    try:
        return _run_batches(Work(plan, journal, {}, None), starts, s, info)
    finally:
        journal.close()


def _run_batches(work: Work, starts: list[int], s: GenerateParams, info: TargetInfo,
                 others: Sequence[Future] = ()) -> int:
    """The batches starting at ``starts``, in that order, with one model; returns the requests made."""
    from draftline.generate.local import LocalBackend

    backend = LocalBackend(info, s.sampling, s.enable_thinking, s.local, s.draft_model)
    sent = 0
    with torch_threads(s.local.threads):
        for start in starts:
            sent += _generate_batch(work, work.plan.ordered[start : start + s.local.batch_size], backend)
            if others:
                _count_others(work)
    return sent


def _count_others(work: Work) -> None:
    """Take the results other workers have journaled into ``work``'s entries and progress bar."""
    for pid, entry in work.journal.refresh().items():
        if pid not in work.entries and entry["status"] == OK:
            work.record(entry)


def _generate_batch(work: Work, batch: list[PromptRecord], backend: Any) -> int:
    """One fixed batch, turn by turn; its pending results journaled. Returns the requests it made."""
    pending = work.plan.pending_ids
    if not any(p.id in pending and not work.journal.done(p.id) for p in batch):
        return 0
    sent = 0
    convs = [Regeneration(p, backend.enable_thinking) for p in batch]
    ended: dict[str, dict[str, Any]] = {}
    while active := [c for c in convs if c.prompt.id not in ended]:
        results = backend.generate([(c.next_request(), c.prompt.tools) for c in active])
        sent += len(active)
        for c, r in zip(active, results):
            if (entry := c.take(r)) is not None:
                ended[c.prompt.id] = entry
    new = [ended[p.id] for p in batch if p.id in pending]
    work.journal.append_many(new)
    for e in new:
        work.record(e)
    return sent
