"""The local backend: the target in-process, rendered as SGLang renders it, split as SGLang splits it."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from generate_helpers import gen_params, make_prompts

from draftline.core.chat import render
from draftline.core.files import write_jsonl
from draftline.core.runner import execute
from draftline.generate.journal import Journal
from draftline.generate.local import split_reasoning
from draftline.generate.stage import GenerateArgs, run_generate


@pytest.mark.parametrize("text,forced,expected", [
    ("<think>\nadd 2 and 2\n</think>\n\nIt is 4.", False, ("add 2 and 2\n", "It is 4.")),
    ("It is 4.", False, (None, "It is 4.")),
    ("<think>\nadd 2 and 2, then", False, ("add 2 and 2, then", "")),  # cut before </think>: all reasoning
    ("add 2 and 2\n</think>\n\nIt is 4.", True, ("add 2 and 2\n", "It is 4.")),  # template opened <think>
])
def test_split_reasoning_as_sglang_qwen3_parser(text, forced, expected):
    assert split_reasoning(text, "<think>", "</think>", forced) == expected


def test_render_matches_the_real_qwen3_template(qwen3_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir, local_files_only=True)
    msgs = [{"role": "user", "content": "hi"}]
    assert render(tok, msgs, None, enable_thinking=False, generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render(tok, msgs, None, enable_thinking=True, generation_prompt=True) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
    assert render(tok, msgs, [tool], enable_thinking=True, generation_prompt=True).count('"name": "f"') == 1


def _prompts(n):
    prompts = make_prompts(n, multi_turn=1)
    prompts[2].messages = [{"role": "user", "content": "What is 3 plus 4?"}]
    return prompts


def _run(tmp_path, target, params):
    """The stage over ``tmp_path``'s train.jsonl and the target folder ``target``."""
    args = GenerateArgs(prompts=tmp_path / "train.jsonl", target=target / "target.json", out=tmp_path / "out",
                        metrics=tmp_path / "metrics.json", report=tmp_path / "report.json", drafters=tmp_path.parent)
    return execute("generate", run_generate, gen_params(params), args)


# The tiny target's replies often run to max_tokens: these tests count them, so none is refused.
LOCAL = {"backend": "local", "max_tokens": 12, "shard_size": 3, "keep_truncated": True, "temperature": 0.0,
         "max_truncated_share": 1.0, "local": {"device": "cpu", "dtype": "float32", "batch_size": 3, "workers": 1}}


def test_local_backend_end_to_end_and_resume(tmp_path, embedded_target):
    from draftline.core.target_loader import load_model, load_target, load_tokenizer

    prompts = _prompts(7)
    write_jsonl(tmp_path / "train.jsonl", prompts)
    m = _run(tmp_path, embedded_target, LOCAL)
    rows = [json.loads(line) for p in sorted((tmp_path / "out").glob("part-*")) for line in open(p)]
    assert [r["id"] for r in rows] == [p.id for p in prompts] and m.headline["rows"] == 7
    roles = [m["role"] for m in rows[0]["messages"]]  # the multi-turn row: a reply after each user turn
    assert roles[1:] == ["user", "assistant"] * (len(roles) // 2)
    assert len(roles) == 7 or rows[0]["finish_reason"] == "length"  # a cut turn ends the conversation

    # The reply is the target's greedy continuation of the prompt rendered by its own template.
    info = load_target(embedded_target / "target.json")
    tok, model = load_tokenizer(info), load_model(info, dtype="float32")
    row = rows[2]
    ids = tok(render(tok, prompts[2].messages, None, enable_thinking=False, generation_prompt=True), add_special_tokens=False,
              return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=12, do_sample=False,
                         eos_token_id=[info.end_of_turn_token_id, info.eos_token_id])[0, ids.shape[1]:].tolist()
    stops = (info.end_of_turn_token_id, info.eos_token_id)
    stop = next((i + 1 for i, t in enumerate(out) if t in stops), len(out))
    assert row["messages"][-1] == {"role": "assistant", "content": tok.decode(out[:stop], skip_special_tokens=True)}
    assert row["usage"] == {"prompt_tokens": ids.shape[1], "completion_tokens": stop}
    assert row["finish_reason"] == ("stop" if any(t in stops for t in out) else "length")
    assert row["generation"]["backend"] == "local" and row["generation"]["enable_thinking"] is False
    assert row["generation"]["engine"] == {"name": "transformers", "version": transformers.__version__,
                                           "torch": torch.__version__}

    # Lose the journal's second half, as a crash would: the rerun regenerates only the missing batches
    # and writes the same bytes.
    before = {p.name: p.read_bytes() for p in sorted((tmp_path / "out").iterdir())}
    journal = next((tmp_path / "cache").glob("generate/*/journal.jsonl"))
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:3]) + lines[3][:10])
    m2 = _run(tmp_path, embedded_target, LOCAL)
    assert m2.run["resumed"] == 3 and m2.run["finished"] == 4
    assert {p.name: p.read_bytes() for p in sorted((tmp_path / "out").iterdir())} == before


def test_local_thinking_and_truncation_accounting(tmp_path, embedded_target):
    prompts = _prompts(4)
    write_jsonl(tmp_path / "train.jsonl", prompts)
    params = {**LOCAL, "enable_thinking": True, "keep_truncated": False, "max_tokens": 4}
    m = _run(tmp_path, embedded_target, params)
    entries = Journal(next((tmp_path / "cache").glob("generate/*"))).load()
    truncated = sum(e.get("finish_reason") == "length" and e["status"] == "ok" for e in entries.values())
    assert m.headline["truncated"] == truncated and m.headline["rows"] + truncated + m.headline["failed"] == 4
    assert set(m.details["failures"]) <= {"empty"}
    for r in read_rows_from(tmp_path):
        assert r["finish_reason"] != "length" and r["messages"][-1]["reasoning_content"]


def read_rows_from(tmp_path):
    return [json.loads(line) for p in sorted((tmp_path / "out").glob("part-*")) for line in open(p)]


def test_same_bytes_under_thread_pressure(tmp_path, embedded_target, monkeypatch):
    """Two local runs with two threads, the second beside processes that keep both cores busy: the completions are
    byte-identical (issue 12: a float stage must not depend on how loaded the machine is)."""
    import subprocess
    import sys

    prompts = _prompts(9)
    params = {**LOCAL, "local": {**LOCAL["local"], "threads": 2}}
    outs = []
    for name, spin in (("quiet", 0), ("busy", 2)):
        folder = tmp_path / name
        write_jsonl(folder / "train.jsonl", prompts)
        monkeypatch.setenv("DRAFTLINE_CACHE", str(folder / "cache"))  # its own journal: nothing is resumed
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(spin)]
        try:
            _run(folder, embedded_target, params)
        finally:
            for p in spinners:
                p.kill()
                p.wait()
        outs.append({p.name: p.read_bytes() for p in sorted((folder / "out").iterdir())})
    assert outs[0] == outs[1]


def test_workers_give_the_same_bytes(tmp_path, embedded_target, monkeypatch):
    """Three processes dealt the fixed batches give the bytes of one process, every prompt generated once, and the
    journal key ignores the worker count (a run resumes with another count)."""
    prompts = _prompts(10)
    outs, metrics = [], []
    for workers in (1, 3):
        folder = tmp_path / f"w{workers}"
        write_jsonl(folder / "train.jsonl", prompts)
        monkeypatch.setenv("DRAFTLINE_CACHE", str(folder / "cache"))
        metrics.append(_run(folder, embedded_target, {**LOCAL, "local": {**LOCAL["local"], "workers": workers}}))
        outs.append({p.name: p.read_bytes() for p in sorted((folder / "out").iterdir())})
        lines = next((folder / "cache").glob("generate/*/journal.jsonl")).read_text().splitlines()
        assert sorted(json.loads(line)["id"] for line in lines) == sorted(p.id for p in prompts)
    assert outs[0] == outs[1]
    assert metrics[1].run["finished"] == 10 and metrics[1].run["requests"] == metrics[0].run["requests"]
    # workers: auto (one per idle core, the count a machine's load decides) finds everything journaled too.
    again = _run(tmp_path / "w3", embedded_target, {**LOCAL, "local": {**LOCAL["local"], "workers": "auto"}})
    assert again.run["resumed"] == 10 and again.run["requests"] == 0
    with pytest.raises(ValueError, match="workers >= 1 or auto"):
        gen_params({**LOCAL, "local": {**LOCAL["local"], "workers": 0}})


TOOL = {"type": "function", "function": {"name": "get_weather", "description": "d",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.mark.parametrize("text,content,calls", [
    ("It is sunny.", "It is sunny.", []),
    ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "Let me look.", [("get_weather", '{"city": "Paris"}')]),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
     "", [("get_weather", '{"city": "Zürich"}'), ("get_weather", "{}")]),
    # No call can be taken (not an offered tool, JSON that does not parse, cut by max_tokens): the reply stays text,
    # so that no token the target generated is lost.
    *[(t, t, []) for t in ('<tool_call>\n{"name": "launch_rocket", "arguments": {}}\n</tool_call>',
                           '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>',
                           'Sure.<tool_call>\n{"name": "get_weather", "argu')],
    # A good call beside a bad one: the good one is taken, as the server takes it.
    ('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
     '"arguments": {}}\n</tool_call>', "", [("get_weather", "{}")]),
])
def test_tool_calls_are_taken_from_the_text_as_sglang_qwen25_parser_takes_them(text, content, calls):
    from draftline.core.tool_calls import split_tool_calls

    got_content, got_calls = split_tool_calls(text, [TOOL])
    assert got_content == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in got_calls] == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got_calls)
    assert split_tool_calls(text, None) == (text, [])  # no tools offered: text stays text
    assert split_tool_calls(text, [TOOL]) == (got_content, got_calls)  # ids derived from the reply: same bytes


def test_a_reply_that_calls_a_tool_carries_tool_calls_and_finishes_as_the_server_says(embedded_target):
    from draftline.core.target_loader import load_target
    from draftline.generate.local import LocalBackend

    s = gen_params(LOCAL)
    backend = LocalBackend(load_target(embedded_target / "target.json"), s.sampling, False, s.local, None)
    reply = 'On it.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    r = backend._result(reply, "<prompt>", [TOOL], "stop", 10, 20)
    assert r.finish_reason == "tool_calls" and r.message["content"] == "On it."
    assert r.message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert backend._result(reply, "<prompt>", None, "stop", 10, 20).message == {"role": "assistant", "content": reply}


def test_a_drafter_changes_speed_not_bytes_and_not_the_journal_key(tmp_path, embedded_target, monkeypatch):
    """generate.draft_model, greedy: the local backend decodes each prompt through the speculative loop and writes
    the same completions as the batched decoding without it; switched on over a finished journal, it sends nothing."""
    prompts = _prompts(5)
    from drafter_support import untrained_drafter

    draft = str(untrained_drafter(embedded_target / "target.json", tmp_path / "drafter", block_size=4, tapped=2))
    plain_dir, drafted_dir = tmp_path / "plain", tmp_path / "drafted"
    for d in (plain_dir, drafted_dir):
        d.mkdir()
        write_jsonl(d / "train.jsonl", prompts)
    plain = _run(plain_dir, embedded_target, LOCAL)
    monkeypatch.setenv("DRAFTLINE_CACHE", str(tmp_path / "other-cache"))  # a journal of its own: decoded anew
    drafted = _run(drafted_dir, embedded_target, {**LOCAL, "draft_model": draft})
    assert drafted.run["finished"] == 5
    shards = sorted((plain_dir / "out").iterdir())
    assert [p.read_bytes() for p in shards] == [(drafted_dir / "out" / p.name).read_bytes() for p in shards]
    spec = drafted.details["speculative"]
    # The accounting, tied to the rows written: each prompt's tokens after the prefill's first one came in steps of
    # 1..4 (block 4), and the forwards saved follow from tau: (turns + steps) against (turns + tokens).
    tokens = sum(r["usage"]["completion_tokens"] for r in read_rows_from(drafted_dir)) - 5
    steps = tokens / spec["tau"]
    assert spec["prompts"] == 5 and 1.0 <= spec["acceptance"] <= 4.0 and 1.0 <= spec["tau"] <= 4.0
    assert spec["forwards_saved"] == pytest.approx(1 - (5 + steps) / (5 + tokens), abs=2e-4)
    assert drafted.headline["acceptance"] == spec["acceptance"] and "acceptance" not in plain.headline
    assert set(drafted.details["per_source"]) == set(plain.details["per_source"])
    # The drafter is not part of the journal key: over the plain run's finished journal it sends nothing.
    monkeypatch.setenv("DRAFTLINE_CACHE", str(tmp_path / "cache"))
    again = _run(plain_dir, embedded_target, {**LOCAL, "draft_model": draft})
    assert again.run["resumed"] == 5 and again.run["finished"] == 0


def test_a_drafter_of_another_target_is_refused_in_one_line_by_the_stage_and_the_backend(tmp_path, embedded_target):
    """generate.draft_model with the local backend: a drafter whose data used another tokenizer is refused as the
    evaluate stage refuses it (drafter/fit.py), by the stage before any prompt and by the backend that loads it."""
    from drafter_support import untrained_drafter

    from draftline.core.target_loader import load_target
    from draftline.drafter.config import DrafterMismatch
    from draftline.generate.local import LocalBackend

    draft = untrained_drafter(embedded_target / "target.json", tmp_path / "drafter", block_size=4, tapped=2)
    config = json.loads((draft / "config.json").read_text())
    config["draftline"]["tokenizer_fingerprint"] = "another-tokenizer"
    (draft / "config.json").write_text(json.dumps(config))
    write_jsonl(tmp_path / "train.jsonl", _prompts(3))
    with pytest.raises(DrafterMismatch, match="another tokenizer.*retrain it for this target") as e:
        _run(tmp_path, embedded_target, {**LOCAL, "draft_model": str(draft)})
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
    s = gen_params({**LOCAL, "draft_model": str(draft)})
    with pytest.raises(DrafterMismatch, match="another tokenizer.*retrain it for this target"):
        LocalBackend(load_target(embedded_target / "target.json"), s.sampling, False, s.local, s.draft_model)
