"""The dataset backend: each prompt's own dataset answer as its reply, through the journal, shards and report."""

from __future__ import annotations

import json

import pytest
from generate_helpers import gen_params, make_project, make_prompts, read_rows, run_in, shard_bytes

from draftline.core.chat import render
from draftline.core.params import ParamsError
from draftline.core.skips import SkipError
from draftline.core.target_loader import load_target, load_tokenizer

DATASET = {"backend": "dataset", "max_tokens": 4, "shard_size": 2}


def _prompts():
    """Six prompts: one multi-turn, two without a reference (none, blank), one whose answer outruns max_tokens."""
    prompts = make_prompts(6, multi_turn=1)
    prompts[1].reference = None
    prompts[4].reference = " \n"
    prompts[2].reference = "A long answer, " * 20 + "longer than max_tokens."
    return prompts


def _project(tmp_path, embedded_target, prompts, params):
    return make_project(tmp_path, prompts, params, load_target(embedded_target / "target.json"))


def _outputs(root):
    return {**shard_bytes(root), **{f: (root / f).read_bytes() for f in ("metrics/generate.json",
                                                                        "reports/generate.json")}}


def test_each_reply_is_the_prompts_reference_and_prompts_without_one_are_counted(tmp_path, embedded_target,
                                                                                 monkeypatch):
    def no_model(*_a, **_k):
        raise AssertionError("the dataset backend loaded the target model")

    monkeypatch.setattr("draftline.core.target_loader.load_model", no_model)
    prompts = _prompts()
    m = run_in(_project(tmp_path, embedded_target, prompts, DATASET), DATASET)
    answered = [prompts[i] for i in (2, 3, 5)]
    rows = read_rows(tmp_path)
    assert [r["id"] for r in rows] == [q.id for q in answered]
    info = load_target(embedded_target / "target.json")
    tok = load_tokenizer(info)
    for q, r in zip(answered, rows):
        assert r["messages"] == q.messages + [{"role": "assistant", "content": q.reference}]
        assert (r["source"], r["row"], r["reference"], r["finish_reason"]) == (q.source, q.row, q.reference, "dataset")
        prompt = render(tok, q.messages, None, enable_thinking=False, generation_prompt=True)
        assert r["usage"] == {"prompt_tokens": len(tok(prompt, add_special_tokens=False)["input_ids"]),
                              "completion_tokens": len(tok(q.reference, add_special_tokens=False)["input_ids"]) + 1}
        assert r["generation"] == {"backend": "dataset", "tokenizer_fingerprint": info.tokenizer_fingerprint,
                                   "model_fingerprint": info.model_fingerprint, "sampling": None,
                                   "enable_thinking": False, "engine": {"name": "dataset", "version": None}}
    assert rows[0]["usage"]["completion_tokens"] > DATASET["max_tokens"]  # never cut, never counted as truncated
    tokens = sum(r["usage"]["completion_tokens"] for r in rows)
    assert json.loads((tmp_path / "metrics/generate.json").read_text()) == {
        "rows": 3, "failed": 0, "truncated": 0, "tokens": tokens, "skipped": 3}
    report = json.loads((tmp_path / "reports/generate.json").read_text())
    assert report["skips"] == {"multi_turn": 1, "no_reference": 2} and report["prompts"] == 6
    assert {s: b["completions"] for s, b in report["per_source"].items()} == {"alpha": 1, "beta": 0, "gamma": 2}
    assert report["output_tokens"]["total"] == tokens and report["failures"] == {}
    assert m.run["requests"] == 0 and m.run["finished"] == 3
    assert (tmp_path / "data/completions/failures.jsonl").read_text() == ""


def test_strict_stops_at_the_first_prompt_it_cannot_answer(tmp_path, embedded_target):
    params = {**DATASET, "strict": True}
    with pytest.raises(SkipError, match=r"skip prompt \w+ \(alpha row 0\): multi_turn"):
        run_in(_project(tmp_path, embedded_target, _prompts(), params), params)
    assert not (tmp_path / "data/completions").exists()


def test_a_rerun_reads_the_journal_and_writes_the_same_bytes(tmp_path, embedded_target, monkeypatch):
    root = _project(tmp_path, embedded_target, _prompts(), DATASET)
    run_in(root, DATASET)
    before = _outputs(root)
    journal = next((tmp_path / "cache").glob("generate/*/journal.jsonl"))

    def no_tokenizer(*_a, **_k):
        raise AssertionError("a rerun over a whole journal counted tokens again")

    with monkeypatch.context() as patched:
        patched.setattr("draftline.generate.dataset.load_tokenizer", no_tokenizer)
        m = run_in(root, DATASET)
    assert m.run["resumed"] == 3 and m.run["finished"] == 0 and _outputs(root) == before
    # A kill after the first line: the rerun answers the two prompts missing and writes the same bytes.
    journal.write_bytes(journal.read_bytes().splitlines(keepends=True)[0])
    m = run_in(root, DATASET)
    assert m.run["resumed"] == 1 and m.run["finished"] == 2 and _outputs(root) == before


def test_a_changed_reference_is_never_read_from_the_journal(tmp_path, embedded_target):
    """The reply is the reference, which the prompt's id does not cover: another reference, another journal."""
    prompts = _prompts()
    root = _project(tmp_path, embedded_target, prompts, DATASET)
    run_in(root, DATASET)
    prompts[3].reference = "another source's answer"
    make_project(root, prompts, DATASET, load_target(embedded_target / "target.json"))
    m = run_in(root, DATASET)
    assert m.run["resumed"] == 0
    assert read_rows(root)[1]["messages"][-1]["content"] == "another source's answer"


def test_a_local_run_and_a_dataset_run_never_read_each_others_journal(tmp_path, embedded_target):
    prompts = make_prompts(3)
    local = {"backend": "local", "max_tokens": 4, "temperature": 0.0,
             "local": {"device": "cpu", "dtype": "float32", "batch_size": 3, "workers": 1}}
    root = _project(tmp_path, embedded_target, prompts, local)
    run_in(root, local)
    targets = [r["messages"][-1] for r in read_rows(root)]
    m = run_in(root, DATASET)
    assert m.run["resumed"] == 0 and m.run["finished"] == 3
    assert [r["messages"][-1] for r in read_rows(root)] == [{"role": "assistant", "content": q.reference}
                                                           for q in prompts]
    m = run_in(root, local)  # back to the target: its own journal, nothing generated again
    assert m.run["resumed"] == 3 and m.run["finished"] == 0
    assert [r["messages"][-1] for r in read_rows(root)] == targets
    assert run_in(root, DATASET).run["resumed"] == 3
    keys = [json.loads(k.read_text()) for k in sorted((tmp_path / "cache").glob("generate/*/key.json"))]
    assert sorted(k["backend"] for k in keys) == ["dataset", "local"]


def test_an_unknown_backend_is_refused_naming_the_choices():
    with pytest.raises(ParamsError) as e:
        gen_params({"backend": "datasets"})
    assert str(e.value) == "params.yaml: generate.backend must be one of ['local', 'sglang', 'dataset'], not 'datasets'"
