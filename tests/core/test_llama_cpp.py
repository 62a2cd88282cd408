"""The pinned llama.cpp: what is refused before any work (a missing build tool, a download of other bytes), and
the real build found again in its cache."""

from __future__ import annotations

import subprocess

import pytest

from draftline.core.errors import Refusal
from draftline.core.llama_cpp import SDIST, ToolMissing, build_record, fetch_sdist, server


def test_a_missing_build_tool_is_refused_before_anything_is_fetched(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no cmake, no compiler
    monkeypatch.setenv("DRAFTLINE_LLAMA_CPP_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ToolMissing, match="cmake") as e:
        server()
    assert "apt-get install cmake" in str(e.value)
    assert not (tmp_path / "cache").exists()


def test_a_download_of_other_bytes_is_deleted_not_used(tmp_path):
    (tmp_path / SDIST).write_bytes(b"not the pinned release")
    with pytest.raises(Refusal, match="not the pinned"):
        fetch_sdist(tmp_path)
    assert not (tmp_path / SDIST).exists()


def test_the_built_server_is_found_again_and_runs(llama_server):
    assert server() == llama_server  # the second call builds nothing: the cache entry is complete
    record = build_record(llama_server)
    assert record["version"] == SDIST.split("-")[1].removesuffix(".tar.gz") and record["bytes"] > 1_000_000
    out = subprocess.run([str(llama_server), "--help"], capture_output=True, text=True, timeout=60)
    assert "draft-dflash" in out.stdout + out.stderr
