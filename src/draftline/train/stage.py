"""The ``train`` stage: ``data/merged`` + ``data/target`` -> ``data/checkpoints`` (a DFlash drafter).

``train.gpus`` picks the launcher: 0 or 1 trains in this process; N > 1 re-executes the same command under
``torchrun --nproc_per_node N`` (torch's own launcher), and every rank trains on its shard of the batches
(NCCL on GPUs, gloo on CPU). See :mod:`draftline.train.trainer` for the run itself.
"""

from __future__ import annotations

import os
import subprocess
import sys

from draftline.core.logs import get_logger
from draftline.train.params import TrainParams
from draftline.train.trainer import Paths, train

log = get_logger(__name__)


def run_train(cfg: TrainParams, paths: Paths = Paths()) -> None:
    """Train here, or re-execute this command under torchrun when ``gpus > 1``."""
    if cfg.gpus > 1 and "LOCAL_RANK" not in os.environ:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg.gpus}", *sys.argv]
        log.info("train.gpus=%d: relaunching under torchrun: %s", cfg.gpus, " ".join(cmd))
        subprocess.run(cmd, check=True)
        return
    train(cfg, paths)
