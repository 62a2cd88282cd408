"""The ``train`` stage: the merged training set + the target -> a DFlash drafter (its checkpoint folder).

``train.gpus`` picks the launcher: 0 or 1 trains in this process; N > 1 re-executes the same command (its flags
included) under ``torchrun --nproc_per_node N`` (torch's own launcher), and every rank trains on its shard of the
batches (NCCL on GPUs, gloo on CPU). Rank 0 writes the checkpoint, the loss curve and, through the stage runner,
the metrics and the report; the other ranks report nothing; the launching process reads rank 0's figures back,
so the files it writes last are rank 0's. See :mod:`draftline.train.trainer` for the run itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from draftline.core.errors import Refusal
from draftline.core.logs import get_logger
from draftline.core.runner import StageRun, run_file
from draftline.core.tracked import require_tracked
from draftline.train.args import TrainArgs
from draftline.train.params import TrainParams
from draftline.train.trainer import train

log = get_logger(__name__)


class RanksFailed(Refusal):
    """A torchrun rank failed; its own message (or traceback) is above, in the ranks' output."""


def run_train(p: TrainParams, args: TrainArgs, stage: StageRun) -> None:
    """Train here, or re-execute this command under torchrun when ``gpus > 1``."""
    require_tracked(p.init_from, args.drafters, "train.init_from")
    if p.gpus > 1 and "LOCAL_RANK" not in os.environ:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={p.gpus}", *sys.argv]
        log.info("train.gpus=%d: relaunching under torchrun: %s", p.gpus, " ".join(cmd))
        done = subprocess.run(cmd)
        if done.returncode != 0:
            raise RanksFailed(f"training under torchrun ({p.gpus} ranks) exited with code {done.returncode}: the "
                              "failing rank's message is above")
        _take_rank0_report(args, stage)
        return
    train(p, args, stage)
    if int(os.environ.get("RANK", "0")) != 0:
        raise SystemExit(0)  # rank 0 reports: the runner never writes this rank's copy of the same figures


def _take_rank0_report(args: TrainArgs, stage: StageRun) -> None:
    """What rank 0's runner wrote, back into this process's ``stage``: the runner then writes the same metrics and
    report bytes, and a run file whose ``stage_seconds`` is the whole launch's."""
    headline = json.loads(args.metrics.read_text(encoding="utf-8"))
    details = json.loads(args.report.read_text(encoding="utf-8"))
    headline.pop("skipped")
    stage.skips.counts.update(details.pop("skips"))
    stage.headline.update(headline)
    stage.details.update(details)
    stage.run.update({k: v for k, v in json.loads(run_file(args.report).read_text(encoding="utf-8")).items()
                      if k != "stage_seconds"})
