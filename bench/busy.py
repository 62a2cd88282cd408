"""Another user's busy process beside a measurement, for the benches that time the pipeline under load
(``bench/threads.py``, ``bench/embedded.py``).

The busy process is ``while True: pass`` started with ``setsid``: a session of its own, as a user's other terminal or
job is, so that with the kernel's autogroup the CPU is shared between the two sessions (a ``nice -n 19`` inside the
other session then does not yield to us). It is killed and reaped when the measurement ends, however it ends.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

LOADS = ("busy", "niced")  # what runs beside: one busy process, or the same under ``nice -n 19``


@contextmanager
def beside(load: str) -> Iterator[None]:
    """One busy process (``busy``), the same under ``nice -n 19`` (``niced``), or none (any other ``load``: each
    bench names its quiet case)."""
    if load not in LOADS:
        yield
        return
    cmd = ["setsid", *(["nice", "-n", "19"] if load == "niced" else []), sys.executable, "-c", "while True: pass"]
    spinner = subprocess.Popen(cmd)
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()
