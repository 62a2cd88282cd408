"""draftline: instruction datasets -> target completions -> tokenized Arrow -> DFlash drafters, as one DVC pipeline.

Importing draftline applies the one-core rule (:mod:`draftline.core.threads`): every thread pool no param reaches
gets one thread and OpenMP's waits sleep, unless the user set the variable. It is done here, on the first import of
any stage, because each pool reads its variable once, when it starts; child processes inherit it.
"""

from draftline.core.threads import one_core_environment

one_core_environment()

__version__ = "0.1.0"
