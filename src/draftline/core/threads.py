"""Fixed CPU thread counts for the float stages (target build, local generation, training, evaluation).

Why a param and not torch's default (one thread per core): float sums are ordered by how work is split between
threads, so the thread count decides the last bits of every result, and torch's default changes with the machine.
And on a shared machine OpenMP threads wait for each other at every barrier: when another process takes a core, a
second thread mostly spins (measured on 2 cores: training 0.18 s/step alone, 1.9 s/step beside one busy process).
A fixed, small count holds up under load and gives the same bytes on one machine however busy it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def torch_threads(threads: int, deterministic: bool = False) -> Iterator[None]:
    """Run the block with ``threads`` intra-op threads (0: torch's default) and, with ``deterministic``, torch's
    deterministic algorithms; both restored afterwards (tests share a process)."""
    import torch

    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    if threads > 0:
        torch.set_num_threads(threads)
    if deterministic:
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)
