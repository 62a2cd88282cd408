"""One core by default, everywhere: the one place that says how many threads and processes a stage uses.

The rule: every thread pool a stage can start runs one thread, and every stage one process, unless a param asks
for more: ``target.embedded.threads``, ``generate.local.threads``, ``train.threads``, ``evaluate.threads`` (torch's
intra-op pool, set by :func:`torch_threads`), ``tokenize.workers``, ``target.embedded.workers``,
``generate.local.workers`` and ``evaluate.workers`` (processes; the latter three ``auto`` by default: one per core
idle when the stage starts, :func:`idle_cores`; forked ones checked by :func:`check_workers` and :func:`forkable`).
The pools no param reaches (OpenMP's and the BLAS libraries' defaults, the Rust tokenizers' Rayon pool that batch
encoding and the mix labels run on) get one thread from :data:`ONE_CORE`, set on the first import of draftline,
before any of them starts (each reads its variable once), unless the user set the variable: a user's choice wins.

Why: on a shared machine a pool of one thread per core collapses beside any other busy process, its threads
waiting at every barrier for the one the kernel gave away (measured on 2 cores: training 0.18 s/step alone, 1.9
s/step with two threads beside one busy process; bench/threads.py). One thread holds up under load. And float sums
are ordered by how work is split between threads, so a fixed count gives the same bytes on one machine however busy
it is, where torch's default (one thread per core) changes with the machine.

Processes that share nothing but a queue of independent requests or batches (evaluate's, generate's) have no
barrier to wait at, so they do not collapse; but beside another session's busy process the kernel's autogroup
still gives the stage one core, and two processes time-sliced on it gained nothing (evaluate: 6-10% slower than
one, medians of five; bench/threads.py). ``auto`` starts as many as there are idle cores: one there, two on a quiet
2-core machine (1.8x faster for evaluate, 2.0x for generate).

OpenMP's wait policy is PASSIVE for the same reason (unless ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is set): a
thread waiting at a barrier sleeps instead of spinning (the embedded target's build was 17x slower beside one busy
process with spinning waits). It changes speed only, never a byte of output (tests/core/test_threads.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from draftline.core.logs import get_logger
from draftline.core.params import ParamsError

log = get_logger(__name__)

ONE_CORE = {
    "OMP_NUM_THREADS": "1",  # OpenMP: torch's default intra-op pool, numpy's BLAS where it is OpenMP
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "RAYON_NUM_THREADS": "1",  # the Rust tokenizers' pool: batch encoding (prompt costs, mix labels)
}


# The variables one_core_environment set itself rather than found set (comma-separated), inherited by children with
# the variables, so that any process can tell a user's choice from draftline's.
SET_HERE = "DRAFTLINE_ONE_CORE_SET"


def one_core_environment(environ: dict[str, str] | os._Environ = os.environ) -> None:
    """Set :data:`ONE_CORE` and the PASSIVE wait policy where the user set nothing (called by ``import draftline``).
    Child processes (tokenize's workers, torchrun's ranks) inherit it."""
    chosen = {name: value for name, value in ONE_CORE.items() if name not in environ}
    if "OMP_WAIT_POLICY" not in environ and "GOMP_SPINCOUNT" not in environ:
        chosen["OMP_WAIT_POLICY"] = "PASSIVE"
    if chosen:
        environ.update(chosen)
        environ[SET_HERE] = ",".join(sorted({*environ.get(SET_HERE, "").split(","), *chosen} - {""}))


def own_pool_environment(environ: dict[str, str] | os._Environ = os.environ) -> dict[str, str]:
    """The environment for a program that sizes its own thread pool (llama-server's ``--threads``): the user's, less
    what :func:`one_core_environment` chose for draftline's pools. llama.cpp's OpenMP threads meet at a barrier per
    operation: a PASSIVE wait there made 2 threads 3.9x slower than spinning (bench/engines.py)."""
    ours = set(environ.get(SET_HERE, "").split(",")) | {SET_HERE}
    return {k: v for k, v in environ.items() if k not in ours}


@contextmanager
def torch_threads(threads: int, deterministic: bool = False) -> Iterator[None]:
    """Run the block with ``threads`` intra-op threads (0: one per core) and, with ``deterministic``, torch's
    deterministic algorithms; both restored afterwards (tests share a process)."""
    import torch

    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads if threads > 0 else os.cpu_count() or 1)
    if deterministic:
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)


def idle_cores(window_s: float = 0.5) -> int:
    """How many cores nothing else is using: the machine's idle share over ``window_s`` seconds (Linux's
    ``/proc/stat``) times its cores, rounded, between 1 and the cores this process may run on. Where ``/proc/stat``
    cannot be read, those cores."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        idle0, total0 = _cpu_times()
        time.sleep(window_s)
        idle1, total1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return usable
    share = (idle1 - idle0) / max(total1 - total0, 1)
    return max(1, min(usable, round(share * (os.cpu_count() or 1))))


def check_workers(threads: int, workers: int | str, where: str) -> None:
    """Refuse a ``workers`` count below 1 (other than ``auto``), and more than one of both threads and processes: the
    processes are forked, and a process forked after a multi-threaded OpenMP region hangs in its next one."""
    if workers != "auto" and workers < 1:
        raise ParamsError(f"params.yaml: {where}.workers must be >= 1 or auto, not {workers}")
    if threads != 1 and workers != 1:
        raise ParamsError(f"params.yaml: {where}: threads {threads} and workers {workers}: more than one of both is "
                          "not supported; use processes (threads: 1) or threads (workers: 1)")


def workers_now(workers: int | str) -> int:
    """``workers``, or with ``auto`` one per core idle now (:func:`idle_cores`)."""
    return idle_cores() if workers == "auto" else int(workers)


def forkable(workers: int, param: str) -> int:
    """``workers``, or 1 (warned, naming ``param``) where processes cannot be forked safely: on a system without fork,
    or from a process running more than one torch thread (its OpenMP pool would hang the child)."""
    import multiprocessing as mp

    import torch

    if workers > 1 and ("fork" not in mp.get_all_start_methods() or torch.get_num_threads() != 1):
        log.warning("%s is %d, but processes can only be forked from a one-thread process on a "
                    "system with fork: running one", param, workers)
        return 1
    return workers


def _cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies of every CPU since boot: the first line of /proc/stat (user nice system idle iowait irq
    softirq steal; guest time is already inside user)."""
    times = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return times[3] + times[4], sum(times)
