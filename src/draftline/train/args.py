"""``stages/train.py``'s paths: their own module, so the stage (which launches the trainer) and the trainer (which
reads them) both import them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftline.core.runner import StageArgs


@dataclass(frozen=True, kw_only=True)
class TrainArgs(StageArgs):
    """``stages/train.py``'s paths (dvc.yaml passes them)."""

    merged: Path  # the training set (the merge stage's output)
    target: Path  # the target's target.json
    out: Path  # the drafter's checkpoint folder
    metrics: Path
    plot: Path  # the loss curve
    drafters: Path  # where earlier rounds' drafters and evaluations live (a dependency of the stage)
