"""The evaluate stage: prompt rendering, selection, metrics, and a whole run on a tiny target with an untrained drafter."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch
from conftest import WEATHER_TOOL, default_params, tiny_conversations
from drafter_support import lineage
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from draftline.core.logs import get_logger
from draftline.core.records import PromptRecord
from draftline.core.skips import Skips
from draftline.core.target import load_target
from draftline.drafter.model import DFlashDrafter, build_target_layer_ids, make_config
from draftline.evaluate.speculative import Generation
from draftline.evaluate.stage import (
    EvalParams,
    PromptResult,
    acceptance_by_position,
    load_eval_prompts,
    render_prompt,
    run_evaluate,
    summarize,
)
from draftline.target.describe import describe_target


def prompt(i: int, source: str, text: str, tools=None) -> PromptRecord:
    return PromptRecord(id=f"{source}-{i}", source=source, row=i, messages=[{"role": "user", "content": text}], tools=tools)


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_dir):
    return AutoTokenizer.from_pretrained(qwen3_tokenizer_dir, local_files_only=True)


@pytest.fixture(scope="module")
def tiny_target_dir(tokenizer, tmp_path_factory):
    """A random 4-layer Qwen3 with the real Qwen3 tokenizer and chat template, and its target.json."""
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=1024, tie_word_embeddings=True,
    )
    d = tmp_path_factory.mktemp("target")
    Qwen3ForCausalLM(cfg).save_pretrained(d / "model")
    tokenizer.save_pretrained(d / "model")
    info = describe_target(d / "model", hash_weights=False)
    info.path = "model"  # relative, as the target stage writes it: load_target resolves it against the folder
    (d / "target.json").write_text(json.dumps(info.to_dict()))
    drafter = DFlashDrafter(
        make_config(cfg, num_layers=1, block_size=8, mask_token_id=info.mask_token_id,
                    target_layer_ids=build_target_layer_ids(4, 2), lineage=lineage(info))
    )
    drafter.save_pretrained(d / "checkpoints")
    return d


def eval_params(**overrides) -> EvalParams:
    return EvalParams.parse(default_params("evaluate", **overrides), "evaluate")


def test_render_matches_the_servers_render(tokenizer):
    rec = prompt(0, "hermes_fc", "What is the weather in Paris?", tools=[WEATHER_TOOL])
    for thinking in (False, True):
        ids = render_prompt(tokenizer, rec, thinking)
        server = tokenizer.apply_chat_template(
            rec.messages, tools=rec.tools, add_generation_prompt=True, enable_thinking=thinking, tokenize=False
        )
        assert ids == tokenizer(server, add_special_tokens=False)["input_ids"]
        text = tokenizer.decode(ids)
        assert "get_weather" in text and text.endswith("<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n"))


def test_prompt_selection_caps_each_source_and_counts_bad_lines(tmp_path):
    path = tmp_path / "eval.jsonl"
    lines = [prompt(i, "a", f"q{i}").to_json() for i in range(4)] + [prompt(0, "b", "b0").to_json()]
    lines[1:1] = ["{not json", json.dumps({"id": "x", "source": "a", "row": 9, "messages": []})]
    path.write_text("\n".join(lines) + "\n")
    skips = Skips(get_logger("test"))
    recs = load_eval_prompts(path, max_per_source=2, skips=skips)
    assert [r.id for r in recs] == ["a-0", "a-1", "b-0"]
    assert skips.as_dict() == {"invalid JSON": 1, "no messages": 1}


def fake(source: str, tokens: list[int], accepted: list[int], produced: list[int], drafted: int = 3) -> Generation:
    return Generation(tokens, "length", 1 + len(produced), [drafted] * len(produced), accepted, produced)


def test_metrics_and_acceptance_plot_from_known_steps():
    # Block 4: prompt 1 had steps accepting 3, 1, 0 drafts; prompt 2 accepted 2, then 3 cut at max_new_tokens.
    one = fake("a", list(range(8)), accepted=[3, 1, 0], produced=[4, 2, 1])
    two = fake("b", list(range(6)), accepted=[2, 3], produced=[3, 2])  # step 2 cut from 4 tokens to 2
    base1 = Generation(list(range(8)), "length", 8)
    base2 = Generation([9] * 6, "length", 6)  # differs: a lossless failure
    results = [PromptResult("p1", "a", 5, base1, one), PromptResult("p2", "b", 5, base2, two)]
    m = summarize(results, 4, Skips(get_logger("test")), 128, False)
    assert m["tau"] == round(12 / 5, 4)
    assert m["tau_per_source"] == {"a": round(7 / 3, 4), "b": 2.5}
    assert m["lossless"] == 0.5 and m["mismatched_prompts"] == ["p2"]
    assert m["target_forwards"] == {"with_drafter": 4 + 3, "without_drafter": 14, "saved_fraction": 0.5}
    rows = acceptance_by_position(results, 4)
    # accepted per step: 3, 1, 0, 2, 3 -> position 1: 4/5, 2: 3/5 (3 of the 4 that reached it), 3: 2/5 (2 of 3)
    assert [(r["position"], r["accepted"], r["accept_rate"], r["conditional_rate"]) for r in rows] == [
        (1, 4, 0.8, 0.8), (2, 3, 0.6, 0.75), (3, 2, 0.4, round(2 / 3, 4))
    ]


def test_evaluate_stage_is_lossless_with_an_untrained_drafter(tiny_target_dir, tmp_path):
    prompts = tmp_path / "eval.jsonl"
    recs = [prompt(0, "chat", "Say hello."), prompt(1, "chat", "Name three colours."), prompt(2, "chat", "extra"),
            prompt(0, "tools", "Weather in Oslo?", tools=[WEATHER_TOOL]), prompt(1, "long", "word " * 300)]
    prompts.write_text("".join(r.to_json() + "\n" for r in recs))
    params = eval_params(max_new_tokens=12, max_prompts_per_source=2, max_prompt_tokens=200)
    out = dict(metrics_path=tmp_path / "metrics" / "eval.json", plot_path=tmp_path / "plots" / "acceptance.csv")
    m = run_evaluate(params, tiny_target_dir, tiny_target_dir / "checkpoints", prompts, **out)
    assert m["lossless"] == 1.0
    assert m["n_prompts"] == 3 and m["n_prompts_per_source"] == {"chat": 2, "tools": 1}
    assert m["skipped"] == {"prompt longer than max_prompt_tokens": 1}
    fw = m["target_forwards"]
    assert fw["with_drafter"] == 3 + m["verification_steps"]
    assert fw["without_drafter"] == m["generated_tokens"] == 3 * 12  # a random target never says <|im_end|> this soon
    assert m["tau"] == round((m["generated_tokens"] - 3) / m["verification_steps"], 4) >= 1.0
    assert json.loads(out["metrics_path"].read_text()) == m
    with open(out["plot_path"]) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["position"]) for r in rows] == list(range(1, 8))
    assert all(int(r["steps"]) == m["verification_steps"] for r in rows)
    m.pop("stage_seconds")  # the one field that is a measurement of this run
    first = m, out["plot_path"].read_bytes()
    again = run_evaluate(params, tiny_target_dir, tiny_target_dir / "checkpoints", prompts, **out)
    assert again.pop("stage_seconds") > 0 and (again, out["plot_path"].read_bytes()) == first


def test_unknown_params_and_missing_drafter_are_named(tiny_target_dir, tmp_path):
    with pytest.raises(ValueError, match="max_new_token"):
        eval_params(max_new_token=5)
    with pytest.raises(ValueError, match="enable_thinking"):  # not a param: the drafter's lineage says it
        eval_params(enable_thinking=False)
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text(prompt(0, "chat", "hi").to_json() + "\n")
    with pytest.raises(FileNotFoundError, match="run the train stage"):
        run_evaluate(eval_params(), tiny_target_dir, tmp_path / "none", prompts,
                     tmp_path / "m.json", tmp_path / "p.csv")


def test_lossless_on_the_embedded_target(embedded_target, tmp_path):
    """The issue's check: speculative decoding on the embedded target reproduces target-only greedy decoding."""
    from draftline.core.target import load_model, load_target

    info = load_target(embedded_target)
    target = load_model(info)
    cfg = make_config(target.config, num_layers=1, block_size=8, mask_token_id=info.mask_token_id,
                      target_layer_ids=build_target_layer_ids(target.config.num_hidden_layers, 3), lineage=lineage(info))
    torch.manual_seed(0)
    DFlashDrafter(cfg).save_pretrained(tmp_path / "checkpoints")
    prompts = tmp_path / "eval.jsonl"
    recs = [PromptRecord(id=f"c{c.row}", source=c.source, row=c.row, tools=c.tools,
                         messages=[m for m in c.messages if m["role"] != "assistant"][:2])
            for c in tiny_conversations(8)]
    prompts.write_text("".join(r.to_json() + "\n" for r in recs))
    m = run_evaluate(eval_params(max_new_tokens=24, max_prompts_per_source=8), embedded_target,
                     tmp_path / "checkpoints", prompts, tmp_path / "eval.json", tmp_path / "acceptance.csv")
    assert m["n_prompts"] == 8 and m["lossless"] == 1.0
    assert m["target_forwards"]["without_drafter"] == m["generated_tokens"]


def test_a_drafter_of_another_tokenizer_is_refused(tiny_target_dir, tmp_path):
    """Lineage: the checkpoint records its data's tokenizer fingerprint, and evaluate compares it with the target's."""
    shutil.copytree(tiny_target_dir / "checkpoints", tmp_path / "checkpoints")
    config = json.loads((tmp_path / "checkpoints" / "config.json").read_text())
    assert config["draftline"]["tokenizer_fingerprint"] == load_target(tiny_target_dir).tokenizer_fingerprint
    config["draftline"]["tokenizer_fingerprint"] = "0" * 64
    (tmp_path / "checkpoints" / "config.json").write_text(json.dumps(config))
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text(prompt(0, "chat", "hi").to_json() + "\n")
    with pytest.raises(ValueError, match="another tokenizer"):
        run_evaluate(eval_params(), tiny_target_dir, tmp_path / "checkpoints", prompts,
                     tmp_path / "m.json", tmp_path / "p.csv")
    del config["draftline"]
    (tmp_path / "checkpoints" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no `draftline` lineage"):
        run_evaluate(eval_params(), tiny_target_dir, tmp_path / "checkpoints", prompts,
                     tmp_path / "m.json", tmp_path / "p.csv")
