"""The generation journal: damaged lines are never consumed, and two processes can share one without duplicating
or interleaving a record (issue 13, items 3 and 4)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from generate_helpers import make_project, make_prompts, read_rows, run_in, sglang_params, shard_bytes, stage_argv
from sglang_server import FakeSGLang

from draftline.core.files import DiskFullError
from draftline.generate.journal import Journal, decode, encode, start_at

REPO = Path(__file__).resolve().parents[2]


def journal_lines(cache: Path) -> list[bytes]:
    (path,) = cache.glob("generate/*/journal.jsonl")
    return path.read_bytes().splitlines(keepends=True)


def test_torn_last_line_is_dropped_and_cut_before_the_next_append(tmp_path):
    j = Journal(tmp_path)
    j.append_many([{"id": "a", "status": "ok"}])
    j.close()
    with open(j.path, "ab") as f:
        f.write(b'{"id": "b", "sta')  # killed mid-write
    j = Journal(tmp_path)
    assert list(j.load()) == ["a"] and j.torn == 1
    j.append_many([{"id": "c", "status": "ok"}])
    j.close()
    assert list(Journal(tmp_path).load()) == ["a", "c"]


def test_a_line_whose_checksum_fails_is_not_consumed():
    line = encode({"id": "a", "status": "ok", "replies": [{"content": "42"}]})
    assert decode(line) == {"id": "a", "status": "ok", "replies": [{"content": "42"}]}
    assert decode(line.replace(b"42", b"43")) is None  # still valid JSON: only the checksum tells
    assert decode(b'{"id": "a", "status": "ok"}') == {"id": "a", "status": "ok"}  # a journal from before checksums
    assert decode(b'{"id": 7, "status": "ok"}') is None and decode(b"[1]") is None


def test_an_ok_entry_is_final(tmp_path):
    j = Journal(tmp_path)
    j.append_many([{"id": "a", "status": "failed"}, {"id": "a", "status": "ok"}])
    assert j.append_many([{"id": "a", "status": "partial"}]) == []  # never recorded over a success
    j.close()
    assert Journal(tmp_path).load() == {"a": {"id": "a", "status": "ok"}}


def test_writers_start_apart():
    assert start_at(100, 0) == 0
    starts = {start_at(100, n) for n in range(4)}
    assert len(starts) == 4 and all(0 <= s < 100 for s in starts)


def test_a_corrupted_result_is_sent_again_and_the_output_is_unchanged(tmp_path, cache):
    prompts = make_prompts(12)
    with FakeSGLang() as srv:
        p = sglang_params(srv.url, concurrency=2, shard_size=8)
        run_in(make_project(tmp_path, prompts, p), p)
    reference = shard_bytes(tmp_path)
    lines = journal_lines(cache)
    victim = decode(lines[5])["id"]
    # A bit flipped by storage inside a reply: the line still parses, its checksum does not.
    lines[5] = lines[5].replace(b'"content":"', b'"content":"X', 1)
    (path,) = cache.glob("generate/*/journal.jsonl")
    path.write_bytes(b"".join(lines))
    with FakeSGLang() as srv:
        m = run_in(tmp_path, {**p, "endpoints": [srv.url]})
        assert [r["id"] for r in srv.requests] == [victim]
    assert m.run["resumed"] == 11 and shard_bytes(tmp_path) == reference


def test_two_processes_share_one_journal(tmp_path, cache):
    """Two generate processes (two nodes on shared storage) on one $DRAFTLINE_CACHE: every journal line intact,
    no id recorded ok twice, both outputs the uninterrupted run's bytes, and the work split between them."""
    prompts = make_prompts(60)
    with FakeSGLang() as srv:
        p = sglang_params(srv.url, concurrency=2, shard_size=8)
        run_in(make_project(tmp_path / "ref", prompts, p), p)
    reference = shard_bytes(tmp_path / "ref")

    shared = tmp_path / "shared-cache"
    # The server answers slowly until the second node holds its writer slot, however long its start takes on a
    # busy machine, so that the two overlap; then at a pace where both share the rest.
    with FakeSGLang(delay_s=1.0) as srv:
        p = sglang_params(srv.url, concurrency=2, shard_size=8)
        procs = []
        for name, joined in (("node-a", "journal.jsonl"), ("node-b", "writer-1.lock")):
            root = make_project(tmp_path / name, prompts, p)
            env = {**os.environ, "DRAFTLINE_CACHE": str(shared), "DRAFTLINE_PARAMS": str(root / "params.yaml"),
                   "PYTHONPATH": str(REPO / "src")}
            procs.append(subprocess.Popen([sys.executable, *stage_argv(root)], cwd=root, env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            deadline = time.monotonic() + 60
            while not list(shared.glob(f"generate/*/{joined}")) and time.monotonic() < deadline:
                time.sleep(0.02)
        srv.delay_s = 0.15
        logs = [proc.communicate(timeout=120)[1] for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0], logs
        requests = len(srv.requests)
    assert any("(writer 1)" in log for log in logs), "the two processes must have run at the same time"
    lines = journal_lines(shared)
    entries = [decode(line) for line in lines]
    assert None not in entries  # no torn or interleaved record
    ok = Counter(e["id"] for e in entries if e["status"] == "ok")
    assert set(ok) == {q.id for q in prompts} and max(ok.values()) == 1
    for name in ("node-a", "node-b"):
        assert shard_bytes(tmp_path / name) == reference
        assert [r["id"] for r in read_rows(tmp_path / name)] == [q.id for q in prompts]
    assert requests < 1.5 * len(prompts)  # each node did part of the work, not all of it


def test_a_full_disk_stops_the_stage_naming_the_path_then_the_rerun_gives_the_same_bytes(tmp_path, small_disk,
                                                                                       monkeypatch):
    """The journal and the completions on a disk that fills: first the journal runs out of room, then (with room
    for the journal only) the completions; each time the error names the file, nothing half-written is left under
    an output name, and once space is freed the rerun sends only what was lost and writes the same bytes."""
    prompts = make_prompts(40)
    with FakeSGLang() as srv:
        p = sglang_params(srv.url, concurrency=2, shard_size=4)
        run_in(make_project(tmp_path / "ref", prompts, p), p)
    reference = shard_bytes(tmp_path / "ref")
    journal_size = len(b"".join(journal_lines(tmp_path / "cache")))

    disk = small_disk(journal_size // 2)
    monkeypatch.setenv("DRAFTLINE_CACHE", str(disk.path / "cache"))
    root = make_project(tmp_path / "run", prompts, p)
    out = disk.path / "completions"

    def run(url):
        return run_in(root, {**p, "endpoints": [url]}, out)

    with FakeSGLang() as srv:
        with pytest.raises(DiskFullError, match=r"generation journal \(.*journal\.jsonl\)"):
            run(srv.url)
        first = {r["id"] for r in srv.requests}
    assert not out.exists() and disk.leftovers() == []
    disk.grow(journal_size + 4 * 4096)  # room for the whole journal, not for the completions beside it
    with FakeSGLang() as srv:
        with pytest.raises(DiskFullError, match=r"the completions \(.*completions\), at part-"):
            run(srv.url)
    assert not out.exists() and disk.leftovers() == []
    disk.grow(4 << 20)
    with FakeSGLang() as srv:
        m = run(srv.url)
        assert srv.requests == []  # everything was journaled by then
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir())} == reference
    assert m.headline["rows"] == 40 and len(first) < 40
