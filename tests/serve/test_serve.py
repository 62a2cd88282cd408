"""The serve stage's arithmetic and params. The stage itself runs the real llama-server in tests/test_pipeline.py
(every turn against evaluate's, losslessness, the headline); here, what the figures are made of."""

from __future__ import annotations

import json

import pytest
from conftest import default_params

from draftline.core.params import ParamsError
from draftline.core.requests import tokens_digest
from draftline.serve.engines import counters, exact_steps
from draftline.serve.measure import Run, Turn, mean_run
from draftline.serve.params import Judged, ServeParams
from draftline.serve.report import against_evaluate, lossless, speed_up

JUDGED = Judged(sets=[], max_prompts_per_source=None, max_prompt_tokens=2048, max_new_tokens=8, seed=0,
                sampled=None, resamples=1000, confidence=0.95, interval_seed=0)


def turn(key: str, tokens: list[int], seconds: float, steps: int | None = None, decode_s: float | None = None) -> Turn:
    return Turn(key, "src", tokens, steps, seconds, decode_s)


def test_steps_count_every_target_step_as_evaluate_does():
    # 8 tokens: the prefill's, then 3 verification steps of 2 accepted drafts + 1 each: nothing left over.
    assert exact_steps({"predicted_n": 10, "draft_n_accepted": 6}, 3) == 3
    # n_predict reached with one token left to draft for: llama.cpp decodes it plainly and does not count it.
    assert exact_steps({"predicted_n": 11, "draft_n_accepted": 6}, 3) == 4
    # the reply ended on an accepted draft (its end-of-turn): no token after it, nothing left over.
    assert exact_steps({"predicted_n": 9, "draft_n_accepted": 6}, 3) == 3
    # nothing was ever drafted (an n-gram mode without a match): every token after the first is a step of its own.
    assert exact_steps({"predicted_n": 9}, 0) == 8


def test_prometheus_counters_of_llama_cpp_and_vllm():
    text = "\n".join(["# HELP llamacpp:spec_decode_num_drafts_total x", "llamacpp:spec_decode_num_drafts_total 12",
                      "llamacpp:spec_decode_num_accepted_tokens_total 30", "llamacpp:n_decode_total 99",
                      'vllm:spec_decode_num_drafts_total{engine="0"} 2', 'vllm:spec_decode_num_drafts_total{engine="1"} 3'])
    assert counters(text) == {"accepted": 30.0, "drafts": 17.0}


def test_the_speed_up_is_paired_by_turn_and_exact_for_a_constant_ratio():
    base = [turn(f"r{i}#0", [1] * (10 + i), 1.0 + i, decode_s=0.5 + i) for i in range(20)]
    twice = [turn(t.key, t.tokens, t.seconds / 2, decode_s=t.decode_s / 3) for t in base]
    s = speed_up(twice, base, JUDGED)
    assert s["speed_up"] == [2.0, 2.0, 2.0] and s["decode_speed_up"] == [3.0, 3.0, 3.0]
    mixed = [turn(t.key, t.tokens, t.seconds / (2 if i % 2 else 1)) for i, t in enumerate(base)]
    estimate, low, high = speed_up(mixed, base, JUDGED)["speed_up"]
    assert 1.0 < low < estimate < high < 2.0


def test_the_target_measured_first_and_last_counts_as_the_mean_of_both():
    # A machine that drifts: the target measured first takes 3 s a turn, last 1 s; a drafter arm measured between
    # them at 2 s is then as fast as the target, not 1.5x it.
    first = Run([turn(f"r{i}#0", [1] * 10, 3.0, decode_s=2.0) for i in range(20)], 60.0)
    last = Run([turn(t.key, [2] * 10, 1.0, decode_s=1.0) for t in first.turns], 20.0)
    both = mean_run(first, last)
    assert [(t.seconds, t.decode_s, t.tokens) for t in both.turns] == [(2.0, 1.5, [1] * 10)] * 20
    assert both.wall_s == 40.0
    between = [turn(t.key, t.tokens, 2.0, decode_s=1.5) for t in first.turns]
    assert speed_up(between, both.turns, JUDGED)["speed_up"] == [1.0, 1.0, 1.0]
    assert mean_run(first, None) is first and mean_run(None, None) is None
    with pytest.raises(ValueError):  # the two runs must be of the same turns
        mean_run(first, Run(last.turns[:-1], 20.0))


def test_lossless_and_the_turns_against_evaluates(tmp_path):
    base = [turn("a#0", [5, 6, 7], 1), turn("b#0", [8, 9], 1), turn("b#1", [4, 2], 1)]
    served = [turn("a#0", [5, 6, 7], 1, steps=1), turn("b#0", [8, 3], 1, steps=1), turn("b#1", [4, 2], 1, steps=2)]
    assert lossless(served, base) == round(2 / 3, 4)
    steps = tmp_path / "eval_steps.jsonl"
    records = [("a", 0, [5, 6, 7], [2]), ("b", 0, [8, 9], [1]), ("b", 1, [4, 2], [1])]
    steps.write_text("".join(json.dumps({"setting": "greedy", "id": i, "turn": k, "produced": produced,
                                         "tokens_xxh64": tokens_digest(tokens)}) + "\n"
                             for i, k, tokens, produced in records))
    got = against_evaluate(served, steps)
    # b#0's ids differ; of the two equal turns, b#1's steps differ (2 served, 1 in evaluate)
    assert got["turns"] == 3 and got["same_tokens"] == 2 and got["same_steps"] == 1
    assert got["differ"] == ["b#0", "b#1"]
    # over the turns of equal ids: a#0 2 tokens in 1 step both ways, b#1 1 token in 2 steps served, in 1 in evaluate
    assert got["acceptance_engine"] == 1.25 and got["acceptance_evaluate"] == 1.5


def test_params_refuse_what_the_engine_cannot_serve():
    ok = default_params("serve", engine="llama.cpp")
    assert ServeParams.parse(ok, "serve").arms[0] == "target"
    with pytest.raises(ParamsError, match="ngram"):
        ServeParams.parse({**ok, "engine": "sglang"}, "serve")
    with pytest.raises(ParamsError, match="must hold target"):
        ServeParams.parse({**ok, "arms": ["drafter"]}, "serve")
    assert ServeParams.parse({**ok, "engine": "vllm", "arms": ["target", "drafter"]}, "serve").engine == "vllm"
