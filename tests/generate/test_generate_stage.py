"""The generate stage with the sglang backend against the loopback SGLang stand-in (tests/sglang_server.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from generate_helpers import (
    gen_params,
    make_project,
    make_prompts,
    read_rows,
    run_in,
    sglang_params,
    shard_bytes,
    stage_argv,
)
from sglang_server import FakeSGLang, reply_for

from draftline.core.params import ParamsError
from draftline.core.runner import run_file
from draftline.generate.journal import Journal, decode, encode
from draftline.generate.openai_client import AuthError, ServersDown
from draftline.generate.remote import request_body
from draftline.generate.stage import run_generate

REPO = Path(__file__).resolve().parents[2]


def test_exact_outputs_in_prompt_order(tmp_path):
    prompts = make_prompts(10)
    with FakeSGLang() as srv:
        p = sglang_params(srv.url)
        m = run_in(make_project(tmp_path, prompts, p), p)
        served = [r["id"] for r in srv.requests]
    results = {f: (tmp_path / f).read_bytes() for f in ("metrics/generate.json", "reports/generate.json")}
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
                                   "enable_thinking": False, "engine": {"name": "sglang", "version": "0.5.4"}}
    tokens = sum(r["usage"]["completion_tokens"] for r in rows)
    # The metrics file is the headline alone; details go to the report, what varies between runs to the run file.
    assert json.loads(results["metrics/generate.json"]) == {"rows": 10, "failed": 0, "truncated": 0, "tokens": tokens,
                                                             "skipped": 0}
    assert m.details["per_source"]["alpha"]["completions"] == 4 and m.details["output_tokens"]["total"] == tokens
    assert m.run["requests"] == 10 and m.run["resumed"] == 0 and m.run["finished"] == 10
    assert json.loads(run_file(tmp_path / "reports/generate.json").read_text()) == m.run
    assert str(tmp_path / "cache") in m.run["journal"] and b"cache" not in b"".join(results.values())
    assert (tmp_path / "data/completions/failures.jsonl").read_text() == ""
    # A second run sends nothing and rewrites the same bytes, the same metrics and report: only the run file differs.
    before = shard_bytes(tmp_path)
    with FakeSGLang() as srv:
        m2 = run_in(tmp_path, {**p, "endpoints": [srv.url]})
        assert srv.requests == []
    assert shard_bytes(tmp_path) == before and m2.run["resumed"] == 10 and m2.run["finished"] == 0
    assert {f: (tmp_path / f).read_bytes() for f in results} == results


def test_a_speculating_servers_acceptance_is_read_from_sglangs_meta_info(tmp_path, monkeypatch):
    """With generate.draft_model the requests ask SGLang for meta_info; its spec_verify_ct per request gives the
    acceptance per source. The completions are the same bytes as without it."""
    prompts = make_prompts(6)
    with FakeSGLang() as srv:
        plain = sglang_params(srv.url)
        run_in(make_project(tmp_path / "plain", prompts, plain), plain)
        assert srv.requests and not any("return_meta_info" in r["body"] for r in srv.requests)
    # A journal of its own: over the plain run's journal the drafter would send nothing (not in the journal key).
    monkeypatch.setenv("DRAFTLINE_CACHE", str(tmp_path / "other-cache"))
    # The drafter the servers speculate with: its config alone is read here, to check that it fits the target.
    drafter = tmp_path / "drafted/data/drafters/round1"
    drafter.mkdir(parents=True)
    (drafter / "config.json").write_text(json.dumps({"block_size": 4, "draftline": {"tokenizer_fingerprint": "tok-fp"}}))
    with FakeSGLang(spec_accept_length=3) as srv:
        p = {**sglang_params(srv.url), "draft_model": str(drafter)}
        m = run_in(make_project(tmp_path / "drafted", prompts, p), p)
        assert len(srv.requests) == 6 and all(r["body"]["return_meta_info"] is True for r in srv.requests)
    assert shard_bytes(tmp_path / "drafted") == shard_bytes(tmp_path / "plain")
    rows = read_rows(tmp_path / "drafted")
    steps = [-(-r["usage"]["completion_tokens"] // 3) for r in rows]
    tokens = [r["usage"]["completion_tokens"] - 1 for r in rows]
    spec = m.details["speculative"]
    assert spec["prompts"] == 6 and spec["tau"] == round(sum(tokens) / sum(steps), 4)
    assert spec["acceptance"] == round(sum(t / s for t, s in zip(tokens, steps)) / 6, 4) == m.headline["acceptance"]
    assert set(m.details["per_source"]["alpha"]["speculative"]) == {"prompts", "acceptance", "tau", "forwards_saved"}


def test_failures_recorded_then_retried_on_the_next_run(tmp_path):
    prompts = make_prompts(6)
    bad, flaky = prompts[1].id, prompts[4].id
    faults = {bad: ["400"], flaky: ["503"] * 4}
    with FakeSGLang(faults=faults) as srv:
        p = sglang_params(srv.url)
        m = run_in(make_project(tmp_path, prompts, p), p)
        assert sum(r["id"] == bad for r in srv.requests) == 1  # a 400 is never retried
        assert sum(r["id"] == flaky for r in srv.requests) == 4  # 1 + 3 retries
    assert m.headline["rows"] == 4 and m.details["failures"] == {"http_400": 1, "http_503": 1}
    fails = [json.loads(x) for x in (tmp_path / "data/completions/failures.jsonl").read_text().splitlines()]
    assert [(f["id"], f["reason"]) for f in fails] == [(bad, "http_400"), (flaky, "http_503")]
    assert "context length" in fails[0]["detail"]
    with FakeSGLang() as srv:  # healthy now: only the two failed prompts are sent again
        m = run_in(tmp_path, {**p, "endpoints": [srv.url]})
        assert sorted(r["id"] for r in srv.requests) == sorted([bad, flaky])
    assert m.headline["rows"] == 6 and m.headline["failed"] == 0
    assert [r["id"] for r in read_rows(tmp_path)] == [q.id for q in prompts]


def test_each_row_names_the_engine_that_answered_it_across_resumed_runs(tmp_path):
    """The engine is read per journal entry, not per run: rows answered by an earlier server version keep it, and
    an entry journaled before engines were recorded says null (unknown)."""
    prompts = make_prompts(4)
    old, new, legacy = prompts[0].id, prompts[1].id, prompts[2].id
    with FakeSGLang(faults={new: ["400"]}, version="0.5.3") as srv:
        p = sglang_params(srv.url)
        run_in(make_project(tmp_path, prompts, p), p)
    journal = Journal(next((tmp_path / "cache/generate").iterdir()))
    entries = journal.load()
    journal.close()
    assert entries[old]["engine"] == {"name": "sglang", "version": "0.5.3"}
    lines = journal.path.read_text().splitlines()
    # The entry of `legacy` as a journal written before engines were recorded holds it (checksummed anew).
    kept = [x for x in lines if decode(x.encode())["id"] != legacy]
    stripped = {k: v for k, v in entries[legacy].items() if k not in ("engine", "xxh3")}
    journal.path.write_text("\n".join(kept) + "\n" + encode(stripped).decode())
    with FakeSGLang(version="0.5.4") as srv:  # the server upgraded: only the failed prompt is sent
        run_in(tmp_path, {**p, "endpoints": [srv.url]})
        assert [r["id"] for r in srv.requests] == [new]
    engines = {r["id"]: r["generation"]["engine"] for r in read_rows(tmp_path)}
    assert engines[old] == {"name": "sglang", "version": "0.5.3"}
    assert engines[new] == {"name": "sglang", "version": "0.5.4"}
    assert engines[legacy] is None


def test_a_drafter_outside_the_tracked_folder_is_refused_before_anything_is_sent(tmp_path):
    from draftline.core.tracked import Untracked

    with FakeSGLang() as srv:
        p = {**sglang_params(srv.url), "draft_model": str(tmp_path / "elsewhere" / "round1")}
        with pytest.raises(Untracked, match=r"generate\.draft_model .* is outside .*data/drafters"):
            run_in(make_project(tmp_path / "p", make_prompts(2), p), p)
        assert not srv.requests


def test_truncated_answers_excluded_and_counted(tmp_path):
    prompts = make_prompts(6)
    cut = {prompts[0].id, prompts[3].id}
    with FakeSGLang(truncate=cut) as srv:
        p = sglang_params(srv.url, max_truncated_share=0.5)
        m = run_in(make_project(tmp_path, prompts, p), p)
    assert m.headline["truncated"] == 2 and m.headline["rows"] == 4 and m.details["per_source"]["alpha"]["truncated"] == 2
    assert cut.isdisjoint(r["id"] for r in read_rows(tmp_path))
    with FakeSGLang(truncate=cut) as srv:  # kept on request; they are results, so nothing is sent again
        m = run_in(tmp_path, {**p, "endpoints": [srv.url], "keep_truncated": True})
        assert srv.requests == []
    rows = {r["id"]: r for r in read_rows(tmp_path)}
    assert m.headline["rows"] == 6 and rows[prompts[0].id]["finish_reason"] == "length"


def test_too_many_truncated_replies_stop_the_stage_naming_max_tokens_and_write_nothing(tmp_path, capsys):
    """2 of 6 replies cut at max_tokens is over the default share (0.2): one line naming generate.max_tokens and
    generate.max_truncated_share, no completions, no metrics; the journal keeps the replies, so the rerun with the
    share raised sends nothing and writes them."""
    from draftline.core.runner import main
    from draftline.generate.stage import GenerateArgs

    prompts = make_prompts(6)
    cut = {prompts[0].id, prompts[3].id}
    with FakeSGLang(truncate=cut) as srv:
        p = sglang_params(srv.url)
        root = make_project(tmp_path, prompts, p)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:  # as dvc runs it: a refusal is one line and exit status 1
            main("generate", GenerateArgs, lambda _: gen_params(p), run_generate, stage_argv(root)[1:])
        assert exit_.value.code == 1 and len(srv.requests) == 6
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("generate: 2 of 6 replies (33.3%) were cut at generate.max_tokens (32), more than "
                   "generate.max_truncated_share (0.2) allows: raise generate.max_tokens, or raise "
                   "generate.max_truncated_share to accept them (the journal keeps the replies: they are not "
                   "generated again)")
    assert not (root / "data/completions").exists() and not (root / "metrics/generate.json").exists()
    with FakeSGLang(truncate=cut) as srv:  # 1 in 3 is within a share of 0.4: written from the journal alone
        m = run_in(root, {**p, "endpoints": [srv.url], "max_truncated_share": 0.4})
        assert srv.requests == []
    assert m.headline["rows"] == 4 and m.headline["truncated"] == 2 and len(read_rows(root)) == 4


def test_check_truncated_passes_at_the_share_and_counts_only_replies():
    from draftline.generate.report import TooManyTruncated, check_truncated

    prompts = make_prompts(5)
    ok = {"status": "ok", "finish_reason": "stop"}
    entries = {prompts[0].id: {"status": "ok", "finish_reason": "length"}, prompts[1].id: ok, prompts[2].id: ok,
               prompts[3].id: ok, prompts[4].id: {"status": "failed", "reason": "http_400"}}
    check_truncated(prompts, entries, 0.25, 8)  # 1 of 4 replies (the failure is no reply): at the share, not over
    with pytest.raises(TooManyTruncated, match=r"1 of 4 replies \(25\.0%\) were cut at generate.max_tokens \(8\)"):
        check_truncated(prompts, entries, 0.2, 8)
    check_truncated(prompts, {}, 0.0, 8)  # nothing generated: nothing to judge


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def call(name: str, arguments: str) -> dict:
    return {"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_a_tool_row_is_valid_only_when_its_final_reply_calls_an_offered_tool_with_an_object():
    from draftline.core.records import CompletionRecord
    from draftline.generate.report import tool_call_counts

    def row(calls: list[dict] | None, offered: bool = True) -> CompletionRecord:
        reply = {"role": "assistant", "content": "", **({"tool_calls": calls} if calls is not None else {})}
        return CompletionRecord(id="x", source="s", row=0, messages=[{"role": "user", "content": "?"}, reply],
                                tools=[WEATHER] if offered else None)

    def valid(r: CompletionRecord) -> bool:
        return tool_call_counts([r]) == {"tool_rows": 1, "valid_tool_calls": 1}

    assert valid(row([call("get_weather", '{"city": "Oslo"}')]))
    assert valid(row([call("launch_rocket", "{}"), call("get_weather", "{}")]))  # one valid call is enough
    assert not valid(row([call("launch_rocket", '{"city": "Oslo"}')]))  # a name the prompt did not offer
    assert not valid(row([call("get_weather", '{"city": ')]))  # arguments that are not JSON
    assert not valid(row([call("get_weather", '["Oslo"]')]))  # JSON, but a list
    assert not valid(row(None)) and not valid(row([]))  # no call at all
    # A prompt that offered no tools is no tool row, whatever its reply holds.
    assert tool_call_counts([row([call("get_weather", "{}")], offered=False)]) == {"tool_rows": 0, "valid_tool_calls": 0}


def test_the_share_of_tool_rows_with_a_valid_call_is_a_metric_per_source(tmp_path, caplog):
    """alpha and beta offer tools, gamma none: alpha ends half its tool rows in a valid call, beta none (a warning
    names it), gamma is no tool source (not in the metric, though a reply of its calls)."""
    prompts = [dataclasses.replace(q, tools=None if q.source == "gamma" else [WEATHER]) for q in make_prompts(6)]
    by_row = {q.row: q.id for q in prompts}  # alpha: rows 0, 3; beta: 1, 4; gamma: 2, 5
    calls = {by_row[0]: [call("get_weather", '{"city": "Oslo"}')], by_row[3]: [call("launch_rocket", "{}")],
             by_row[1]: [call("get_weather", "Oslo")], by_row[2]: [call("get_weather", "{}")]}
    with FakeSGLang(tool_calls=calls) as srv, caplog.at_level("WARNING"):
        p = sglang_params(srv.url)
        m = run_in(make_project(tmp_path, prompts, p), p)
    assert json.loads((tmp_path / "metrics/generate.json").read_text())["tool_calls_valid"] == {"alpha": 0.5,
                                                                                               "beta": 0.0}
    assert [(m.details["per_source"][s]["tool_rows"], m.details["per_source"][s]["valid_tool_calls"])
            for s in ("alpha", "beta", "gamma")] == [(2, 1), (2, 0), (0, 0)]
    assert (m.details["tool_rows"], m.details["valid_tool_calls"]) == (4, 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "beta's tool rows" in warnings[0]


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
    assert m.details["failures"] == {"empty": 3} and m.headline["rows"] == 0


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
    assert m.details["failures"] == {"http_400": 1}
    with FakeSGLang() as srv:
        m = run_in(tmp_path, {**p, "endpoints": [srv.url]})
        assert [r["rid"].split("-")[0] for r in srv.requests] == [f"{pid}.1", f"{pid}.2"]  # turn 0 not resent
    assert m.headline["rows"] == 1 and len(read_rows(tmp_path)[0]["messages"]) == 7


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
        proc = subprocess.Popen([sys.executable, *stage_argv(root)], cwd=root, env=env,
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
        run = subprocess.run([sys.executable, *stage_argv(root)], cwd=root, env=env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        resent = [r["id"] for r in srv.requests[n_first:]]
    assert journaled.isdisjoint(resent)  # no prompt asked again after its success was journaled
    assert sorted(set(resent)) == sorted(q.id for q in prompts if q.id not in journaled)
    rows = read_rows(root)
    assert [r["id"] for r in rows] == [q.id for q in prompts]  # none lost, none twice
    assert shard_bytes(root) == reference  # byte-identical to the uninterrupted run
    metrics = json.loads((root / "metrics/generate.json").read_text())
    assert json.loads(run_file(root / "reports/generate.json").read_text())["resumed"] == len(journaled)
    assert metrics["rows"] == 40


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


def test_journal_key_is_unchanged():
    """The key's content and hash as users' journals were written under (a changed key would orphan them): the
    sglang backend's key holds no draftline code, so these values must never change."""
    from generate_helpers import target_info

    from draftline.core.scratch import scratch_key
    from draftline.generate.key import journal_decides

    decides = journal_decides(gen_params(sglang_params("http://x")), target_info(), make_prompts(2))
    assert decides == {"target": {"tokenizer_fingerprint": "tok-fp", "model_fingerprint": "model-fp"},
                       "sampling": {"max_tokens": 32, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "seed": 0},
                       "enable_thinking": False, "backend": "sglang"}
    assert scratch_key(decides) == "b8272e7804ca80f4"
    sampled = gen_params(sglang_params("http://x", temperature=0.7, enable_thinking=True, concurrency=9, retries=0))
    assert scratch_key(journal_decides(sampled, target_info(), [])) == "3d36a27c049d621a"


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
    assert m.headline["rows"] == 4
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
    assert m.headline["rows"] == 6 and len(srv.requests) == 2


def test_a_refusal_prints_one_line_and_exits_1(tmp_path):
    """Run as dvc runs it, an expected refusal (here an API key variable that is unset) prints its one message and
    exits 1, without a traceback, before any work."""
    p = sglang_params("http://127.0.0.1:9", api_key_env="DRAFTLINE_TEST_UNSET_KEY")
    root = make_project(tmp_path, make_prompts(2), p)
    env = {k: v for k, v in os.environ.items() if k != "DRAFTLINE_TEST_UNSET_KEY"}
    env.update(DRAFTLINE_PARAMS=str(root / "params.yaml"), PYTHONPATH=str(REPO / "src"))
    run = subprocess.run([sys.executable, *stage_argv(root)], cwd=root, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert lines == ["generate: generate.api_key_env names $DRAFTLINE_TEST_UNSET_KEY, which is unset or empty: export "
                     "the servers' API key in it (or set generate.api_key_env: null)"]
    assert not (root / "data/completions").exists() and not (root / "metrics").exists()


def test_strict_stops_at_the_first_bad_prompt_line(tmp_path):
    """generate.strict: false counts a bad line of the prompts file (headline ``skipped``, report ``skips``) and
    goes on; true stops at it, naming the line."""
    from draftline.core.skips import SkipError

    prompts = make_prompts(3)
    with FakeSGLang() as srv:
        p = sglang_params(srv.url)
        root = make_project(tmp_path, prompts, p)
        with open(root / "data/prompts/train.jsonl", "a", encoding="utf-8") as f:
            f.write("{not json\n")
        m = run_in(root, p)
        assert m.headline["rows"] == 3
        assert json.loads((root / "metrics/generate.json").read_text())["skipped"] == 1
        assert json.loads((root / "reports/generate.json").read_text())["skips"] == {"invalid JSON": 1}
        with pytest.raises(SkipError, match=r"train\.jsonl:4: invalid JSON"):
            run_in(root, {**p, "strict": True})
