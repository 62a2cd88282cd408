"""Data versions of the merge stage through real git + DVC, in a temporary repository holding only that stage.

Proves what docs/merge.md ("Backup and rollback") promises: a second ``dvc repro`` does nothing; the cache grows
by the new data alone when a round extends the previous merged set; ``git checkout HEAD~1 && dvc checkout``
restores the previous ``data/merged`` byte-identical; ``dvc push`` / ``dvc pull`` to a local remote restore a
deleted cache. And that carrying the base by hardlink (``merge.carry: auto``) is safe under DVC's default
cache.type (DVC's cache keeps intact copies, and DVC replaces workspace files rather than writing into them) and
under this project's (``.dvc/config``: a link cache, hardlinks on ext4), where the round workflow of the README
(the base hardlinked from the previous ``data/merged``, then ``dvc add``) grows workspace and cache together by
the new shards alone.
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
from conftest import default_params
from merge_support import file_hashes, make_rows, train_tokenizer, write_target, write_tokenized

from draftline.core import dataset as fmt
from draftline.core.dataset import load_training_set

REPO = Path(__file__).resolve().parents[2]
DVC = str(Path(sys.executable).with_name("dvc"))

# The paths as the project's dvc.yaml passes them (there through its `vars`).
MERGE_ARGS = ["--tokenized", "data/tokenized", "--target", "data/target/target.json", "--out", "data/merged",
              "--metrics", "metrics/merge.json", "--report", "reports/merge.json", "--plot", "plots/merge_mix.csv",
              "--bases", "data/bases", "--sets", "data/sets/conversations", "--heldout", "data/prompts/eval.jsonl"]
DVC_YAML = f"""\
stages:
  merge:
    cmd: python stages/merge.py {" ".join(MERGE_ARGS)}
    deps:
      - stages/merge.py
      - data/tokenized
      - data/target/target.json
      - data/bases
      - data/sets/conversations
      - data/prompts/eval.jsonl
    params:
      - merge
      - decontaminate
      - evaluate.sets
    outs:
      - data/merged
      - reports/merge.json:
          cache: false
    metrics:
      - metrics/merge.json:
          cache: false
    plots:
      - plots/merge_mix.csv:
          cache: false
"""


def sh(cwd: Path, *args: str) -> str:
    # The stage command says `python`: make it this interpreter, also when the environment is not activated.
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


def disk_bytes(repo: Path) -> int:
    """Bytes of every distinct file (inode) of the repository outside .git: workspace and DVC cache together."""
    inodes = {(st.st_ino, st.st_size) for p in repo.rglob("*") if ".git" not in p.parts and p.is_file()
              for st in [p.stat()]}
    return sum(size for _, size in inodes)


def cache_is_intact(repo: Path) -> bool:
    """Every DVC cache object still holds the bytes its name (their md5) says."""
    objects = [p for p in (repo / ".dvc/cache/files/md5").rglob("*") if p.is_file()]
    return bool(objects) and all(
        hashlib.md5(p.read_bytes()).hexdigest() == p.parent.name + p.name.removesuffix(".dir") for p in objects
    )


def set_params(repo: Path, **merge) -> None:
    params = {"merge": default_params("merge", **{"base": None, "assume_same_tokenizer": False, "seed": 0, **merge}),
              "decontaminate": default_params("decontaminate"), "evaluate": {"sets": {}}}
    (repo / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["dvc-default", "project"])
def test_versions_rollback_and_remote(tmp_path: Path, cache: str):
    tok_dir = train_tokenizer(tmp_path / "tok")
    repo = tmp_path / "repo"
    (repo / "stages").mkdir(parents=True)
    shutil.copy(REPO / "stages/merge.py", repo / "stages/merge.py")
    (repo / "dvc.yaml").write_text(DVC_YAML, encoding="utf-8")
    (repo / ".gitignore").write_text("*.run.json\n", encoding="utf-8")  # times of the last run: not versioned
    (repo / "data/bases").mkdir(parents=True)
    (repo / "data/bases/README.md").write_text("bases\n", encoding="utf-8")
    # What the base is checked against (no set, no held-out prompt: nothing hits).
    (repo / "data/sets/conversations").mkdir(parents=True)
    (repo / "data/sets/conversations/README.md").write_text("sets\n", encoding="utf-8")
    (repo / "data/prompts").mkdir(parents=True)
    (repo / "data/prompts/eval.jsonl").write_text("", encoding="utf-8")
    info = write_target(repo / "data/target/target.json", tok_dir)
    sh(repo, "git", "init", "-q")
    sh(repo, DVC, "init", "-q")
    if cache == "project":
        shutil.copy(REPO / ".dvc/config", repo / ".dvc/config")
    link_cache = cache == "project"

    # Version 1: no base, the first tokenized set.
    set_params(repo)
    write_tokenized(repo / "data/tokenized", make_rows(tok_dir, [f"a{i}" for i in range(600)], seed=1, words=80), info, 200_000)
    sh(repo, DVC, "add", "-q", "data/tokenized")
    sh(repo, DVC, "repro")
    assert "up to date" in sh(repo, DVC, "repro").lower()  # the second repro runs nothing
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "v1")
    v1 = file_hashes(repo / "data/merged")

    # Version 2: the merged set becomes the base of the next round; new rows, 50 of them repeating prompts.
    before = disk_bytes(repo)
    if link_cache:  # the README's round workflow: the base is the previous version's files, linked, not copied
        sh(repo, "cp", "-rl", "data/merged", "data/bases/r1")
    else:
        shutil.copytree(repo / "data/merged", repo / "data/bases/r1")
    sh(repo, DVC, "add", "-q", "data/bases/r1")
    if link_cache:
        assert disk_bytes(repo) - before < 10_000  # .dvc file and DVC's state only
    new_ids = [f"a{i}" for i in range(50)] + [f"b{i}" for i in range(400)]
    write_tokenized(repo / "data/tokenized", make_rows(tok_dir, new_ids, seed=2, words=80), info, 200_000)
    sh(repo, DVC, "add", "-q", "data/tokenized")
    set_params(repo, base="data/bases/r1")
    before = disk_bytes(repo) - disk_bytes(repo / "data/tokenized")
    sh(repo, DVC, "repro")
    growth = disk_bytes(repo) - disk_bytes(repo / "data/tokenized") - before
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "v2: extend round 1")
    v2 = file_hashes(repo / "data/merged")
    ds, order, _ = load_training_set(repo / "data/merged")
    assert ds["id"] == [f"a{i}" for i in range(600)] + [f"b{i}" for i in range(400)] and len(order) == 1000
    n_base = len(fmt.shard_files(repo / "data/bases/r1"))
    new_bytes = sum((repo / "data/merged" / f).stat().st_size for f in fmt.shard_files(repo / "data/merged")[n_base:])
    # The base's shards are already in the cache: workspace + cache grow by the new shards (in the cache and,
    # under a copy cache, copied out again into data/merged: the workspace then holds the base twice), the order
    # and small metadata.
    carried_by = json.loads((repo / "reports/merge.json").read_text())["carried_by"]
    assert carried_by in ("reflink", "hardlink")  # auto
    merged_files = [repo / "data/merged" / f for f in fmt.shard_files(repo / "data/merged")]
    if link_cache:
        assert new_bytes <= growth <= 1.1 * new_bytes, (growth, new_bytes)
        # DVC linked data/merged to its cache objects, the very files data/bases/r1 links to.
        base_files = [repo / "data/bases/r1" / f for f in fmt.shard_files(repo / "data/bases/r1")]
        assert all(os.path.samefile(b, m) for b, m in zip(base_files, merged_files))
        assert all(f.stat().st_nlink >= 2 for f in merged_files)
    else:
        # DVC's commit replaced hardlinked outputs by copies of its own: nothing links the base.
        assert all(f.stat().st_nlink == 1 for f in merged_files)
    assert cache_is_intact(repo)

    # Rollback: the previous commit's data/merged comes back byte-identical, then the new one again.
    sh(repo, "git", "checkout", "-q", "HEAD~1")
    sh(repo, DVC, "checkout", "-f")
    assert file_hashes(repo / "data/merged") == v1
    sh(repo, "git", "checkout", "-q", "-")
    sh(repo, DVC, "checkout", "-f")
    assert file_hashes(repo / "data/merged") == v2

    # The stage run outside DVC leaves the base's shards hardlinked into data/merged. Checking out another
    # data/merged replaces those files (DVC never writes into one): the base and the cache stay intact.
    base_v2 = file_hashes(repo / "data/bases/r1")
    sh(repo, sys.executable, "stages/merge.py", *MERGE_ARGS)
    assert file_hashes(repo / "data/merged") == v2
    # Metrics and report are the same bytes as the committed ones: only the run file (not in git) changed.
    assert sh(repo, "git", "status", "--porcelain", "metrics", "reports") == ""
    assert (repo / "reports/merge.run.json").is_file()
    if carried_by == "hardlink":
        assert sum(f.stat().st_nlink >= 2 for f in merged_files) >= n_base
    sh(repo, "git", "checkout", "-q", "HEAD~1", "--", "dvc.lock")
    sh(repo, DVC, "checkout", "-f", "data/merged")
    assert file_hashes(repo / "data/merged") == v1
    assert file_hashes(repo / "data/bases/r1") == base_v2 and cache_is_intact(repo)
    sh(repo, "git", "checkout", "-q", "HEAD", "--", "dvc.lock")
    sh(repo, DVC, "checkout", "-f")
    assert file_hashes(repo / "data/merged") == v2
    assert "up to date" in sh(repo, DVC, "status").lower()

    # Backup: push to a local remote, lose the cache and the workspace copy, pull them back.
    sh(repo, DVC, "remote", "add", "-d", "backup", str(tmp_path / "remote"))
    sh(repo, DVC, "push", "-q")
    shutil.rmtree(repo / ".dvc/cache")
    shutil.rmtree(repo / "data/merged")
    sh(repo, DVC, "pull", "-q")
    assert file_hashes(repo / "data/merged") == v2
    assert "up to date" in sh(repo, DVC, "status").lower()
