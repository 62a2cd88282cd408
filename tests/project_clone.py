"""A copy of this repository as a fresh git + DVC project in a temporary folder, with params shrunk for speed.

Shared by the pipeline test (tests/test_pipeline.py) and the benchmarks that run the whole pipeline
(bench/faults.py): they must run it exactly as a user's clone would, under DVC, importing the copy's code.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
# What makes the embedded default quick enough for a test; every other value is the shipped default.
SHRINK = {
    "target": {"embedded": {"steps": 150, "warmup_steps": 15, "held_out": 2, "greedy_tokens": 24}},
    "blend": {"total": 400, "eval": {"dev": 1, "test": 2}},  # above http_traces (whole: true, 357 prompts)
    # The 150-step target runs 40-61% of its replies into 48 tokens, by machine (its float bytes differ between CPU
    # types): above the default share (0.2), which would stop generate; accepted here, as the skips below are.
    "generate": {"max_tokens": 48, "max_truncated_share": 0.8},
    # The 150-step target ends ~2.5% of its replies at once (one supervised token): counted skips, accepted here.
    "tokenize": {"max_skip_share": 0.05},
    "train": {"max_steps": 40, "save_every": 20},
    # The drafter and the target as llama.cpp serves them, served computing as evaluate does: every turn's ids and
    # steps compared with evaluate's (tests/test_pipeline.py).
    "export": {"formats": ["gguf"]},
    "serve": {"engine": "llama.cpp", "exact": True, "arms": ["target", "drafter"], "sampled": False, "slots": 2},
    "evaluate": {"max_prompts_per_source": 1, "max_new_tokens": 24,
                 # gsm8k's first 4 rows hash to dev (core/splits.py): 5 give test one, as mt_bench's 2 do
                 "sets": {"gsm8k": {"max_rows": 5}, "mt_bench": {"max_rows": 2}}},
}
# Generated outputs: a clone starts without them, as a fresh checkout does before `dvc pull`.
OUTPUTS = ("data/raw/", "data/conversations/", "data/target/", "data/prompts/", "data/completions/",
           "data/tokenized/", "data/merged/", "data/export/", "data/checkpoints/", "metrics/", "reports/", "plots/",
           "dvc.lock")


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 1500) -> str:
    """Run a command; its stdout + stderr, or an AssertionError carrying their tails."""
    p = subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}")
    return p.stdout + p.stderr


def project_files() -> list[str]:
    """The repository's files as git would clone them (tracked and not ignored), without generated outputs."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, text=True, capture_output=True, check=True,
    ).stdout.split("\n")
    return [f for f in out if f and not f.startswith(OUTPUTS) and (REPO / f).is_file()]


def override(params: dict, changes: dict, where: str = "") -> None:
    """Replace values of ``params`` in place; a key params.yaml does not have is an error (the shrink is stale)."""
    for key, value in changes.items():
        assert key in params, f"params.yaml has no {where}{key}: update the shrink"
        if isinstance(value, dict):
            override(params[key], value, f"{where}{key}.")
        else:
            params[key] = value


def make_project(root: Path, *changes: dict[str, Any]) -> dict[str, str]:
    """Copy the repository to ``root``, apply ``changes`` to its params.yaml, commit it; returns the environment
    that runs its stages (this interpreter, the copy's code, a scratch cache inside the copy)."""
    for f in project_files():
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, root / f)
    params = yaml.safe_load((root / "params.yaml").read_text())
    for c in changes:
        override(params, c)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = dict(os.environ)
    # Stage commands say `python`: make it this interpreter, and make it import this copy of draftline.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(root / "src")
    env["DRAFTLINE_CACHE"] = str(root / ".draftline" / "cache")
    # Bytecode is written as on a user's machine: it must never count as a code change (.dvcignore).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "t@t"], ["git", "config", "user.name", "t"],
                ["git", "add", "-A"], ["git", "commit", "-qm", "project"]):
        run(cmd, root, env)
    return env


def ran(log: str) -> set[str]:
    """Stages that `dvc repro` / `dvc exp run` ran, from its log."""
    return {line.split("'")[1] for line in log.splitlines() if line.startswith("Running stage '")}


def digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder``, by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*")) if p.is_file()
    }
