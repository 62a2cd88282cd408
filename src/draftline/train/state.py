"""Resumable training state, kept in the train stage's scratch folder (:mod:`draftline.core.scratch`).

DVC deletes a stage's outputs before running it, so progress lives outside them, in
``<cache>/train/<key>/``. The key (:func:`state_key`) covers the training params that change the weights, the
merged data's bytes, the target's description and the training code (core, drafter, train): a run with other inputs never resumes from these states, and
the same run always finds them, in a queued ``dvc exp run`` too. Only the newest state is kept; a state is
written under a temporary name and renamed, so a half-written one is never taken for finished.

The data order and the anchor RNG at step ``s`` are functions of ``(seed, s, rank)`` (see ``data.BatchPlan``
and ``trainer.step_generator``), and so is the learning rate (``core.schedule.lr_at``): a state only needs the
step, the weights and the optimizer.

A state holds tensors, numbers, strings and lists or dicts of them only, and is read with
``torch.load(weights_only=True)``: a file in a shared cache can never run code when it is read. The two newest
states are kept, so a state that will not load (truncated by a full disk, corrupted by a bad copy) is skipped with
a warning and the one before it is used.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from draftline.core.files import atomic_path
from draftline.core.logs import get_logger

log = get_logger(__name__)
_STATE = re.compile(r"^state-(\d{8})\.pt$")
KEEP = 2


def state_key(params: dict[str, Any], not_in_key: tuple[str, ...], data_digest: str, target: dict[str, Any],
              code: str) -> dict:
    """What decides the weights of a run (params, data, target, the training code): the scratch folder is named by
    its hash."""
    return {
        "params": {k: v for k, v in sorted(params.items()) if k not in not_in_key},
        "data": data_digest,
        "target": target,
        "code": code,
    }


def state_path(folder: Path, step: int) -> Path:
    return folder / f"state-{step:08d}.pt"


def _steps(folder: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STATE.match(p.name)))


def save_state(folder: Path, step: int, state: dict[str, Any]) -> Path:
    """Write the state of step ``step`` atomically, then drop all but the :data:`KEEP` newest."""
    folder.mkdir(parents=True, exist_ok=True)
    path = state_path(folder, step)
    # Through a Python file, so that a full disk surfaces as the OSError it is (torch's own writer loses it).
    with atomic_path(path, "a training state") as tmp, open(tmp, "wb") as f:
        torch.save({"step": step, **state}, f)
    for old in [s for s in _steps(folder) if s <= step][:-KEEP]:
        state_path(folder, old).unlink()
    return path


def load_latest(folder: Path) -> dict[str, Any] | None:
    """The newest state in ``folder`` that loads (a half-written one never has the final name), or None."""
    if not folder.is_dir():
        return None
    for step in reversed(_steps(folder)):
        path = state_path(folder, step)
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # a truncated or corrupted file: the previous state still resumes the run
            log.warning("training state %s does not load (%s: %s); trying the one before it", path,
                        type(e).__name__, str(e)[:200])
    return None
