"""Scratch folders: one rule for the generation journal and the training states, in experiments too."""

from __future__ import annotations

import json

from draftline.core.scratch import cache_root, scratch_dir, scratch_key


def test_cache_root_survives_dvc_temp_experiments(tmp_path, monkeypatch):
    monkeypatch.delenv("DRAFTLINE_CACHE", raising=False)
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    exp = repo / ".dvc" / "tmp" / "exps" / "tmpab12" / "sub"
    (exp.parent / ".git").mkdir(parents=True)
    exp.mkdir()
    assert cache_root(repo / "stages") == repo / ".draftline" / "cache"
    assert cache_root(exp) == repo / ".draftline" / "cache"  # not the throwaway copy's
    monkeypatch.setenv("DRAFTLINE_CACHE", str(tmp_path / "elsewhere"))
    assert cache_root(exp) == tmp_path / "elsewhere"


def test_scratch_dir_is_keyed_by_what_decides_and_records_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTLINE_CACHE", str(tmp_path / "shared"))
    decides = {"params": {"lr": 0.003, "steps": 10}, "data": "abc"}
    folder = scratch_dir("train", decides)
    assert folder == tmp_path / "shared" / "train" / scratch_key(decides)
    assert json.loads((folder / "key.json").read_text()) == decides
    # Key order never matters; any value that decides does.
    assert scratch_key({"data": "abc", "params": {"steps": 10, "lr": 0.003}}) == scratch_key(decides)
    assert scratch_key({**decides, "data": "abd"}) != scratch_key(decides)


def test_training_states_follow_draftline_cache(tmp_path, monkeypatch):
    """The train stage keeps its states where the journal is: a queued `dvc exp run` can resume them."""
    import drafter_support as S

    monkeypatch.setenv("DRAFTLINE_CACHE", str(tmp_path / "cache"))
    S.make_target(tmp_path)
    S.make_merged(tmp_path, S.make_rows(24))
    S.train(S.train_params(max_steps=3, save_every=3), S.args(tmp_path))
    states = list((tmp_path / "cache" / "train").glob("*/state-00000003.pt"))
    assert len(states) == 1 and (states[0].parent / "key.json").is_file()


def test_code_digest_follows_the_source_alone(tmp_path, monkeypatch):
    """Part of the train and local-generation scratch keys: an edit to the code is never resumed past."""
    import sys

    from draftline.core.fingerprint import code_digest

    pkg = tmp_path / "pkg_for_digest"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = code_digest("pkg_for_digest")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"bytecode")  # never counts
    assert code_digest("pkg_for_digest") == first
    (pkg / "mod.py").write_text("X = 2\n")
    assert code_digest("pkg_for_digest") != first
    sys.modules.pop("pkg_for_digest", None)
