"""The generate stage with the sglang backend against the loopback SGLang stand-in (tests/sglang_server.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from generate_helpers import gen_params, make_project, make_prompts, read_rows, run_in, sglang_params, shard_bytes
from sglang_server import FakeSGLang, reply_for

from draftline.core.params import ParamsError
from draftline.generate.journal import Journal
from draftline.generate.openai_client import AuthError, ServersDown
from draftline.generate.stage import request_body

REPO = Path(__file__).resolve().parents[2]


def test_exact_outputs_in_prompt_order(tmp_path):
    prompts = make_prompts(10)
    with FakeSGLang() as srv:
        p = sglang_params(srv.url)
        m = run_in(make_project(tmp_path, prompts, p), p)
        served = [r["id"] for r in srv.requests]
    assert sorted(shard_bytes(tmp_path)) == ["failures.jsonl", "part-00000.jsonl", "part-00001.jsonl",
                                             "part-00002.jsonl"]
    rows = read_rows(tmp_path)
    assert [r["id"] for r in rows] == [q.id for q in prompts]  # prompt order, whatever the dispatch order
    # Prompts sharing a system prompt were sent together, for the server's prefix cache.
    assert served == [q.id for k in range(3) for q in prompts[k::3]]
    base = request_body(gen_params(p), "/models/fake-qwen3")
    for q, r in zip(prompts, rows):
        _, answer = reply_for({**base, "messages": q.messages})
        assert r["messages"] == q.messages + [{"role": "assistant", "content": answer}]
        assert (r["source"], r["row"], r["reference"], r["finish_reason"]) == (q.source, q.row, q.reference, "stop")
        assert r["usage"]["completion_tokens"] == len(answer.split()) + 1
        assert r["generation"] == {"backend": "sglang", "tokenizer_fingerprint": "tok-fp",
                                   "model_fingerprint": "model-fp",
                                   "sampling": {"max_tokens": 32, "temperature": 0.0, "top_p": 1.0, "top_k": -1,
                                                "seed": 0},
                                   "enable_thinking": False}
    assert m["completions"] == 10 and m["failed"] == 0 and m["run"]["requests"] == 10
    assert m["per_source"]["alpha"]["completions"] == 4
    assert m["output_tokens"]["total"] == sum(r["usage"]["completion_tokens"] for r in rows)
    assert (tmp_path / "data/completions/failures.jsonl").read_text() == ""
    # A second run sends nothing and rewrites the same bytes.
    before = shard_bytes(tmp_path)
    with FakeSGLang() as srv:
        m2 = run_in(tmp_path, {**p, "endpoints": [srv.url]})
        assert srv.requests == []
    assert shard_bytes(tmp_path) == before and m2["run"]["resumed"] == 10


def test_failures_recorded_then_retried_on_the_next_run(tmp_path):
    prompts = make_prompts(6)
    bad, flaky = prompts[1].id, prompts[4].id
    faults = {bad: ["400"], flaky: ["503"] * 4}
    with FakeSGLang(faults=faults) as srv:
        p = sglang_params(srv.url)
        m = run_in(make_project(tmp_path, prompts, p), p)
        assert sum(r["id"] == bad for r in srv.requests) == 1  # a 400 is never retried
        assert sum(r["id"] == flaky for r in srv.requests) == 4  # 1 + 3 retries
    assert m["completions"] == 4 and m["failures"] == {"http_400": 1, "http_503": 1}
    fails = [json.loads(x) for x in (tmp_path / "data/completions/failures.jsonl").read_text().splitlines()]
    assert [(f["id"], f["reason"]) for f in fails] == [(bad, "http_400"), (flaky, "http_503")]
    assert "context length" in fails[0]["detail"]
    with FakeSGLang() as srv:  # healthy now: only the two failed prompts are sent again
        m = run_in(tmp_path, {**p, "endpoints": [srv.url]})
        assert sorted(r["id"] for r in srv.requests) == sorted([bad, flaky])
    assert m["completions"] == 6 and m["failed"] == 0
    assert [r["id"] for r in read_rows(tmp_path)] == [q.id for q in prompts]


def test_truncated_answers_excluded_and_counted(tmp_path):
    prompts = make_prompts(6)
    cut = {prompts[0].id, prompts[3].id}
    with FakeSGLang(truncate=cut) as srv:
        p = sglang_params(srv.url)
        m = run_in(make_project(tmp_path, prompts, p), p)
    assert m["truncated"] == 2 and m["completions"] == 4 and m["per_source"]["alpha"]["truncated"] == 2
    assert cut.isdisjoint(r["id"] for r in read_rows(tmp_path))
    with FakeSGLang(truncate=cut) as srv:  # kept on request; they are results, so nothing is sent again
        m = run_in(tmp_path, {**p, "endpoints": [srv.url], "keep_truncated": True})
        assert srv.requests == []
    rows = {r["id"]: r for r in read_rows(tmp_path)}
    assert m["completions"] == 6 and rows[prompts[0].id]["finish_reason"] == "length"


def test_thinking_keeps_reasoning_apart_and_empty_reasoning_fails(tmp_path):
    prompts = make_prompts(3)
    with FakeSGLang() as srv:
        p = sglang_params(srv.url, enable_thinking=True)
        run_in(make_project(tmp_path, prompts, p), p)
    reply = read_rows(tmp_path)[0]["messages"][-1]
    assert reply["reasoning_content"].startswith("Let me think") and "<think>" not in reply["content"]
    assert read_rows(tmp_path)[0]["generation"]["enable_thinking"] is True
    # A server started without --reasoning-parser leaves the reasoning in `content`: caught as `empty`.
    other = tmp_path / "noparser"
    with FakeSGLang(reasoning_parser=False) as srv:
        p = sglang_params(srv.url, enable_thinking=True, seed=1)
        m = run_in(make_project(other, prompts, p), p)
    assert m["failures"] == {"empty": 3} and m["completions"] == 0


def test_multi_turn_regenerated_on_the_targets_own_answers(tmp_path):
    prompts = make_prompts(4, multi_turn=2)
    with FakeSGLang() as srv:
        p = sglang_params(srv.url)
        run_in(make_project(tmp_path, prompts, p), p)
        assert len(srv.requests) == 2 * 3 + 2
    rows = read_rows(tmp_path)
    msgs = rows[0]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert "dataset answer" not in {m["content"] for m in msgs}
    base = request_body(gen_params(p), "/models/fake-qwen3")
    for k in (2, 4, 6):  # each reply answers the conversation so far, made of the target's own replies
        assert msgs[k]["content"] == reply_for({**base, "messages": msgs[:k]})[1]
    assert rows[2]["messages"] == prompts[2].messages + [rows[2]["messages"][-1]]


def test_multi_turn_resumes_after_its_last_finished_turn(tmp_path):
    prompts = make_prompts(1, multi_turn=1)
    pid = prompts[0].id
    with FakeSGLang(faults={pid: ["ok", "400"]}) as srv:
        p = sglang_params(srv.url)
        m = run_in(make_project(tmp_path, prompts, p), p)
    assert m["failures"] == {"http_400": 1}
    with FakeSGLang() as srv:
        m = run_in(tmp_path, {**p, "endpoints": [srv.url]})
        assert [r["rid"].split("-")[0] for r in srv.requests] == [f"{pid}.1", f"{pid}.2"]  # turn 0 not resent
    assert m["completions"] == 1 and len(read_rows(tmp_path)[0]["messages"]) == 7


def test_kill_9_then_rerun_loses_nothing_resends_nothing(tmp_path, cache):
    prompts = make_prompts(40)
    with FakeSGLang() as srv:
        p = sglang_params(srv.url)
        run_in(make_project(tmp_path / "ref", prompts, p), p)
    reference = shard_bytes(tmp_path / "ref")

    root = tmp_path / "run"
    env = {**os.environ, "DRAFTLINE_CACHE": str(tmp_path / "cache2"), "DRAFTLINE_PARAMS": str(root / "params.yaml"),
           "PYTHONPATH": str(REPO / "src")}
    with FakeSGLang(delay_s=0.05) as srv:
        p = sglang_params(srv.url, concurrency=2)
        make_project(root, prompts, p)
        proc = subprocess.Popen([sys.executable, str(REPO / "stages/generate.py")], cwd=root, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        folder_glob = lambda: list((tmp_path / "cache2" / "generate").glob("*/journal.jsonl"))  # noqa: E731
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            js = folder_glob()
            if js and js[0].read_bytes().count(b"\n") >= 12:
                break
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        journal = Journal(folder_glob()[0].parent)
        journaled = {i for i, e in journal.load().items() if e["status"] == "ok"}
        assert 12 <= len(journaled) < 40, "the kill must land mid-run"
        assert not (root / "data/completions").exists()
        n_first = len(srv.requests)
        run = subprocess.run([sys.executable, str(REPO / "stages/generate.py")], cwd=root, env=env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        resent = [r["id"] for r in srv.requests[n_first:]]
    assert journaled.isdisjoint(resent)  # no prompt asked again after its success was journaled
    assert sorted(set(resent)) == sorted(q.id for q in prompts if q.id not in journaled)
    rows = read_rows(root)
    assert [r["id"] for r in rows] == [q.id for q in prompts]  # none lost, none twice
    assert shard_bytes(root) == reference  # byte-identical to the uninterrupted run
    metrics = json.loads((root / "metrics/generate.json").read_text())
    assert metrics["run"]["resumed"] == len(journaled) and metrics["completions"] == 40


def test_journal_key_follows_what_decides_a_result(tmp_path):
    prompts = make_prompts(2)
    with FakeSGLang() as srv:
        p = sglang_params(srv.url)
        make_project(tmp_path, prompts, p)
        run_in(tmp_path, p)
        run_in(tmp_path, {**p, "concurrency": 8, "retries": 1})  # transport settings: same journal
        assert len(srv.requests) == 2
        run_in(tmp_path, {**p, "temperature": 0.7})  # sampling changed: generated afresh
        assert len(srv.requests) == 4


def test_unknown_param_is_an_error():
    with pytest.raises(ParamsError, match="max_token"):
        gen_params({"max_token": 5})


def test_servers_behind_an_api_key(tmp_path, monkeypatch, caplog):
    """generate.api_key_env names the variable holding the key; the key goes out as a bearer token only, never into
    logs, metrics, the journal or its key; a refused key stops the stage at once; an unset variable before any work."""
    prompts = make_prompts(4)
    with FakeSGLang(api_key="s3cret-token") as srv:
        p = sglang_params(srv.url, api_key_env="DRAFTLINE_TEST_API_KEY")
        make_project(tmp_path, prompts, p)
        with pytest.raises(ParamsError, match=r"\$DRAFTLINE_TEST_API_KEY, which is unset"):
            run_in(tmp_path, p)
        assert not srv.requests
        monkeypatch.setenv("DRAFTLINE_TEST_API_KEY", "wrong-token")
        with pytest.raises(AuthError, match=r"answered 401 \(Unauthorized\).*generate.api_key_env") as e:
            run_in(tmp_path, p)
        assert "wrong-token" not in str(e.value) and len(srv.requests) == 0  # refused before its handler, not retried
        monkeypatch.setenv("DRAFTLINE_TEST_API_KEY", "s3cret-token")
        with caplog.at_level("DEBUG"):
            m = run_in(tmp_path, p)
    assert m["completions"] == 4
    written = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert not [f for f in written if b"s3cret-token" in f.read_bytes()]
    assert "s3cret-token" not in caplog.text


def test_servers_down_mid_run_stop_the_stage_and_keep_its_progress(tmp_path):
    """The stage stops (it does not write a run of failures); what was journaled is not requested again."""
    prompts = make_prompts(6)
    with FakeSGLang() as srv:
        p = sglang_params(srv.url, retries=1)
        make_project(tmp_path, prompts[:4], p)
        run_in(tmp_path, p)
        url = srv.url
    make_project(tmp_path, prompts, p)  # two new prompts, and the server is gone
    with pytest.raises(ServersDown, match=url):
        run_in(tmp_path, p)
    with FakeSGLang() as srv:
        m = run_in(tmp_path, {**p, "endpoints": [srv.url]})
    assert m["completions"] == 6 and len(srv.requests) == 2
