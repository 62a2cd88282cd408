"""The whole pipeline under DVC, in a temporary git repository: repro, no-op repro, experiments, rollback, remote.

This is the slow test of the suite: one `dvc repro` of every stage on the embedded default, shrunk (a smaller
target, fewer prompts and training steps) so that the module stays within a few minutes on 2 cores.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

pytestmark = pytest.mark.slow

# What makes the embedded default quick enough for a test; every other value is the shipped default.
SHRINK = {
    "target": {"embedded": {"num_layers": 4, "hidden_size": 128, "intermediate_size": 384, "steps": 120}},
    "blend": {"total": 160, "eval_per_source": 2},
    "generate": {"max_tokens": 48},
    # The shrunk target has 4 layers: tap [1, 2] (never the last).
    "train": {"max_steps": 40, "save_every": 20, "target_layers": [1, 2]},
    "evaluate": {"max_prompts_per_source": 1, "max_new_tokens": 24},
}
ALL_STAGES = {"target", "prompts", "generate", "tokenize", "merge", "export", "train", "evaluate"}


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    p = subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, timeout=1500)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}")
    return p.stdout + p.stderr


def _project_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, text=True, capture_output=True, check=True,
    ).stdout.split("\n")
    skip = ("data/raw/", "data/conversations/", "data/target/", "data/prompts/", "data/completions/",
            "data/tokenized/", "data/merged/", "data/export/", "data/checkpoints/", "metrics/", "plots/", "dvc.lock")
    return [f for f in out if f and not f.startswith(skip) and (REPO / f).is_file()]


def _override(params: dict, changes: dict, where: str = "") -> None:
    for key, value in changes.items():
        assert key in params, f"params.yaml has no {where}{key}: update SHRINK in this test"
        if isinstance(value, dict):
            _override(params[key], value, f"{where}{key}.")
        else:
            params[key] = value


def _shrink(params_file: Path) -> None:
    params = yaml.safe_load(params_file.read_text())
    _override(params, SHRINK)
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))


def _ran(log: str) -> set[str]:
    """Stages that `dvc repro` / `dvc exp run` ran, from its log."""
    return {line.split("'")[1] for line in log.splitlines() if line.startswith("Running stage '")}


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("project")
    for f in _project_files():
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, root / f)
    _shrink(root / "params.yaml")
    env = dict(os.environ)
    # Stage commands say `python`: make it this interpreter, and make it import this copy of draftline.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(root / "src")
    env["DRAFTLINE_CACHE"] = str(root / ".draftline" / "cache")
    # Bytecode is written as on a user's machine: it must never count as a code change (.dvcignore).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "t@t"], ["git", "config", "user.name", "t"],
                ["git", "add", "-A"], ["git", "commit", "-qm", "project"]):
        _run(cmd, root, env)
    log = _run(["dvc", "repro"], root, env)
    assert ALL_STAGES <= _ran(log)
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "first data version"], root, env)
    return root, env


def test_repro_builds_every_output(project):
    root, _ = project
    for out in ("data/target/target.json", "data/prompts/train.jsonl", "data/prompts/eval.jsonl",
                "data/completions/part-00000.jsonl", "data/tokenized/draftline.json", "data/merged/draftline.json",
                "data/checkpoints/config.json", "data/checkpoints/model.safetensors", "metrics/eval.json"):
        assert (root / out).is_file(), out
    train_rows = (root / "data/prompts/train.jsonl").read_text().count("\n")
    assert train_rows == SHRINK["blend"]["total"]
    ev = json.loads((root / "metrics/eval.json").read_text())
    assert ev["lossless"] == 1.0
    assert ev["tau"] >= 1.0


def test_second_repro_runs_nothing(project):
    root, env = project
    assert list((root / "src" / "draftline").rglob("*.pyc")), "the stages ran without writing bytecode"
    log = _run(["dvc", "repro"], root, env)
    assert _ran(log) == set()
    assert "Data and pipelines are up to date." in _run(["dvc", "status"], root, env)
    lock = (root / "dvc.lock").read_text()
    assert ".pyc" not in lock and "__pycache__" not in lock


def _changed_after_editing(root: Path, env: dict[str, str], relative: str) -> set[str]:
    """The stages `dvc status` reports after appending a comment to one source file (restored afterwards)."""
    path = root / relative
    before = path.read_bytes()
    try:
        path.write_bytes(before + b"# an edit\n")
        return set(json.loads(_run(["dvc", "status", "--json"], root, env)))
    finally:
        path.write_bytes(before)


def test_code_deps_cover_what_each_stage_runs(project):
    root, env = project
    stages = {s for s in yaml.safe_load((root / "dvc.lock").read_text())["stages"]}
    # core/ is shared by every stage: a change there marks all of them, every source's stages included.
    assert _changed_after_editing(root, env, "src/draftline/core/records.py") == stages
    # evaluate's own package marks evaluate alone: the drafter is never retrained for it.
    assert _changed_after_editing(root, env, "src/draftline/evaluate/report.py") == {"evaluate"}
    # The model train and evaluate share marks both.
    assert _changed_after_editing(root, env, "src/draftline/drafter/model.py") == {"train", "evaluate"}
    assert "Data and pipelines are up to date." in _run(["dvc", "status"], root, env)


def test_one_source_param_reruns_that_source_alone(project):
    root, env = project
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["sources"]["codefeedback"]["max_rows"] = 100
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        status = json.loads(_run(["dvc", "status", "--json"], root, env))
        # That source's two stages; the prompt stage reads every source's name (their order) and sees it too.
        assert {s for s in status if "@" in s} == {"sources@codefeedback", "conversations@codefeedback"}
        assert set(status) <= {"sources@codefeedback", "conversations@codefeedback", "prompts"}
    finally:
        _run(["git", "checkout", "params.yaml"], root, env)


def test_exp_run_changes_the_blend_and_reruns_from_prompts(project):
    root, env = project
    n = SHRINK["blend"]["total"] - 40
    log = _run(["dvc", "exp", "run", "-S", f"blend.total={n}"], root, env)
    assert _ran(log) == ALL_STAGES - {"target"}
    assert (root / "data/prompts/train.jsonl").read_text().count("\n") == n
    # Back to the committed version for the tests that follow.
    _run(["git", "checkout", "params.yaml", "dvc.lock"], root, env)
    _run(["dvc", "checkout", "--force"], root, env)


def test_rollback_restores_the_previous_dataset_and_remote_restores_a_lost_cache(project, tmp_path):
    root, env = project
    first = _digest(root / "data/merged")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["merge"]["seed"] = 1
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    log = _run(["dvc", "repro"], root, env)
    assert _ran(log) == {"merge", "export", "train", "evaluate"}
    assert _digest(root / "data/merged") != first
    _run(["git", "commit", "-qam", "second data version"], root, env)
    second = _digest(root / "data/merged")

    _run(["git", "checkout", "-q", "HEAD~1"], root, env)
    _run(["dvc", "checkout"], root, env)
    assert _digest(root / "data/merged") == first

    # A lost cache comes back from the remote, every version of it.
    _run(["dvc", "remote", "add", "--local", "-d", "backup", str(tmp_path / "remote")], root, env)
    _run(["dvc", "push", "--all-commits"], root, env)
    shutil.rmtree(root / ".dvc" / "cache")
    shutil.rmtree(root / "data" / "merged")
    _run(["dvc", "pull"], root, env)
    assert _digest(root / "data/merged") == first
    _run(["git", "checkout", "-q", "-"], root, env)
    _run(["dvc", "pull"], root, env)
    assert _digest(root / "data/merged") == second
