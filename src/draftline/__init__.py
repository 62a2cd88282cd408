"""draftline: instruction datasets -> target completions -> tokenized Arrow -> DFlash drafters, as one DVC pipeline.

Importing draftline sets OpenMP's wait policy to PASSIVE unless the user chose one (``OMP_WAIT_POLICY`` or
``GOMP_SPINCOUNT`` set): a thread waiting at a barrier sleeps instead of spinning. Spinning threads collapse beside
any other busy process (measured on 2 cores: the embedded target's build 17x slower beside one ``while True``
loop), and a laptop, a CI runner or a shared node is always running something else. The policy changes speed only,
never a byte of output (``tests/core/test_threads.py``); ``bench/threads.py`` measures it. It is set here, on the
first import of any stage, because OpenMP reads it once, when torch loads; child processes inherit it.
"""

import os

if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

__version__ = "0.1.0"
