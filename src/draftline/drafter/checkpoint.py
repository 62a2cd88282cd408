"""Resumable training state, kept in an ignored scratch folder keyed by what determines the result.

DVC deletes a stage's outputs before running it, so progress lives outside them, in
``.draftline/cache/train/<key>/``. The key hashes the training params (those that change the weights), the
merged data's bytes and the target's description: a run with other inputs never resumes from these states,
and the same run always finds them. Only the newest state is kept.

The data order and the anchor RNG at step ``s`` are functions of ``(seed, s, rank)`` (see ``data.BatchPlan``
and ``trainer.step_generator``), so a state only needs the step, the weights, the optimizer and scheduler.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
import xxhash

from draftline.files import atomic_path

CACHE_ROOT = Path(".draftline/cache/train")
# Params that change how a run is watched or checked, not the weights it produces.
NOT_IN_KEY = {"save_every", "log_every", "memory_limit_gb"}
_STATE = re.compile(r"^state-(\d{8})\.pt$")


def folder_digest(path: str | os.PathLike) -> str:
    """xxh3-128 over every file's relative name and bytes, in sorted order (HF cache files excluded)."""
    h = xxhash.xxh3_128()
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("cache-"))
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0")
        with open(p, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()


def run_key(params: dict[str, Any], data_digest: str, target: dict[str, Any]) -> str:
    """The scratch folder name for one set of training inputs."""
    payload = {
        "params": {k: v for k, v in sorted(params.items()) if k not in NOT_IN_KEY},
        "data": data_digest,
        "target": target,
    }
    return xxhash.xxh3_128_hexdigest(json.dumps(payload, sort_keys=True, default=str).encode())[:16]


def state_path(folder: Path, step: int) -> Path:
    return folder / f"state-{step:08d}.pt"


def save_state(folder: Path, step: int, state: dict[str, Any]) -> Path:
    """Write the state of step ``step`` atomically, then drop older ones."""
    folder.mkdir(parents=True, exist_ok=True)
    path = state_path(folder, step)
    with atomic_path(path) as tmp:
        torch.save({"step": step, **state}, tmp)
    for p in folder.iterdir():
        m = _STATE.match(p.name)
        if m and int(m.group(1)) < step:
            p.unlink()
    return path


def load_latest(folder: Path) -> dict[str, Any] | None:
    """The newest complete state in ``folder`` (a half-written one never has the final name), or None."""
    if not folder.is_dir():
        return None
    steps = sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STATE.match(p.name)))
    if not steps:
        return None
    return torch.load(state_path(folder, steps[-1]), map_location="cpu", weights_only=False)
