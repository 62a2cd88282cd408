"""The evaluate stage: prompt rendering, selection, metrics, and a whole run on a tiny target with an untrained drafter."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import WEATHER_TOOL, default_params, tiny_conversations
from drafter_support import lineage
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from draftline.core.errors import MissingInput, Refusal
from draftline.core.logs import get_logger
from draftline.core.records import PromptRecord
from draftline.core.runner import execute, run_file
from draftline.core.skips import Skips
from draftline.core.target import load_target
from draftline.drafter.decoding import Generation
from draftline.drafter.model import DFlashDrafter, DrafterMismatch, build_target_layer_ids, make_config
from draftline.evaluate.params import EvalParams
from draftline.evaluate.report import headline
from draftline.evaluate.stage import (
    EvalArgs,
    PromptResult,
    acceptance_by_position,
    load_eval_prompts,
    render_prompt,
    run_evaluate,
    summarize,
)
from draftline.target.describe import describe_target

REPO = Path(__file__).resolve().parents[2]
HEADLINE = {"tau", "tau_min", "lossless", "skipped"}


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


def eval_args(target_dir: Path, checkpoint: Path, prompts: Path, out: Path) -> EvalArgs:
    """The stage's paths as dvc.yaml passes them: the target.json file, the drafter's folder, eval.jsonl; the
    metrics, report and plot under ``out``."""
    return EvalArgs(target=target_dir / "target.json", checkpoint=checkpoint, prompts=prompts,
                    metrics=out / "metrics" / "eval.json", report=out / "reports" / "eval.json",
                    plot=out / "plots" / "acceptance.csv")


def evaluate(params: EvalParams, args: EvalArgs):
    return execute("evaluate", run_evaluate, params, args)


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
    m = summarize(results, 4, 128, False)
    assert m["tau"] == round(12 / 5, 4)
    assert m["tau_per_source"] == {"a": round(7 / 3, 4), "b": 2.5}
    assert headline(m) == {"tau": 2.4, "tau_min": round(7 / 3, 4), "lossless": 0.5}
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
    args = eval_args(tiny_target_dir, tiny_target_dir / "checkpoints", prompts, tmp_path)
    stage = evaluate(params, args)
    m = stage.details
    assert m["lossless"] == 1.0
    assert m["n_prompts"] == 3 and m["n_prompts_per_source"] == {"chat": 2, "tools": 1}
    assert stage.skips.as_dict() == {"prompt longer than max_prompt_tokens": 1}
    fw = m["target_forwards"]
    assert fw["with_drafter"] == 3 + m["verification_steps"]
    assert fw["without_drafter"] == m["generated_tokens"] == 3 * 12  # a random target never says <|im_end|> this soon
    assert m["tau"] == round((m["generated_tokens"] - 3) / m["verification_steps"], 4) >= 1.0
    # The headline: tau, the lowest source's tau, lossless and the skips; the report holds every figure.
    metrics = json.loads(args.metrics.read_text())
    assert set(metrics) == HEADLINE and metrics["skipped"] == 1 and metrics["lossless"] == 1.0
    assert metrics["tau"] == m["tau"] and metrics["tau_min"] == min(m["tau_per_source"].values())
    report = json.loads(args.report.read_text())
    assert report == {**m, "skips": {"prompt longer than max_prompt_tokens": 1}}
    # The wall clock of both decodings is in the run file, the one file that differs from run to run.
    run = json.loads(run_file(args.report).read_text())
    assert set(run) == {"baseline_seconds", "speculative_seconds", "speedup", "stage_seconds"}
    with open(args.plot) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["position"]) for r in rows] == list(range(1, 8))
    assert all(int(r["steps"]) == m["verification_steps"] for r in rows)
    first = [p.read_bytes() for p in (args.metrics, args.report, args.plot)]
    again = evaluate(params, args)
    assert again.run["stage_seconds"] > 0 and [p.read_bytes() for p in (args.metrics, args.report, args.plot)] == first


def test_unknown_params_and_missing_drafter_are_named(tiny_target_dir, tmp_path):
    with pytest.raises(ValueError, match="max_new_token"):
        eval_params(max_new_token=5)
    with pytest.raises(ValueError, match="enable_thinking"):  # not a param: the drafter's lineage says it
        eval_params(enable_thinking=False)
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text(prompt(0, "chat", "hi").to_json() + "\n")
    with pytest.raises(MissingInput, match="run the train stage"):
        evaluate(eval_params(), eval_args(tiny_target_dir, tmp_path / "none", prompts, tmp_path))
    with pytest.raises(MissingInput, match="run the prompts stage"):
        evaluate(eval_params(), eval_args(tiny_target_dir, tiny_target_dir / "checkpoints", tmp_path / "no.jsonl",
                                          tmp_path))
    assert not (tmp_path / "metrics").exists() and not (tmp_path / "reports").exists()


def test_the_stage_script_refuses_in_one_line_without_a_traceback(tiny_target_dir, tmp_path):
    """``python stages/evaluate.py`` with dvc.yaml's flags and no drafter: one message, exit code 1."""
    import yaml

    prompts = tmp_path / "eval.jsonl"
    prompts.write_text(prompt(0, "chat", "hi").to_json() + "\n")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"evaluate": default_params("evaluate")}))
    a = eval_args(tiny_target_dir, tmp_path / "none", prompts, tmp_path)
    flags = [x for f in ("checkpoint", "target", "prompts", "metrics", "report", "plot")
             for x in (f"--{f}", str(getattr(a, f)))]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("DRAFTLINE_PARAMS", None)
    done = subprocess.run([sys.executable, str(REPO / "stages" / "evaluate.py"), *flags], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = [x for x in done.stderr.splitlines() if "no drafter" in x]
    assert len(lines) == 1 and lines[0].startswith("evaluate: ") and "run the train stage first" in lines[0]


def test_lossless_on_the_embedded_target(embedded_target, tmp_path):
    """The issue's check: speculative decoding on the embedded target reproduces target-only greedy decoding."""
    from draftline.core.target import load_model, load_target

    info = load_target(embedded_target / "target.json")
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
    stage = evaluate(eval_params(max_new_tokens=24, max_prompts_per_source=8),
                     eval_args(embedded_target, tmp_path / "checkpoints", prompts, tmp_path))
    m = stage.details
    assert m["n_prompts"] == 8 and m["lossless"] == 1.0 and stage.headline["lossless"] == 1.0
    assert m["target_forwards"]["without_drafter"] == m["generated_tokens"]


def test_a_drafter_of_another_tokenizer_is_refused(tiny_target_dir, tmp_path):
    """Lineage: the checkpoint records its data's tokenizer fingerprint, and evaluate compares it with the target's."""
    shutil.copytree(tiny_target_dir / "checkpoints", tmp_path / "checkpoints")
    config = json.loads((tmp_path / "checkpoints" / "config.json").read_text())
    info = load_target(tiny_target_dir / "target.json")
    assert config["draftline"]["tokenizer_fingerprint"] == info.tokenizer_fingerprint
    config["draftline"]["tokenizer_fingerprint"] = "0" * 64
    (tmp_path / "checkpoints" / "config.json").write_text(json.dumps(config))
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text(prompt(0, "chat", "hi").to_json() + "\n")
    args = eval_args(tiny_target_dir, tmp_path / "checkpoints", prompts, tmp_path)
    with pytest.raises(DrafterMismatch, match="another tokenizer") as e:
        evaluate(eval_params(), args)
    assert isinstance(e.value, Refusal)
    del config["draftline"]
    (tmp_path / "checkpoints" / "config.json").write_text(json.dumps(config))
    with pytest.raises(DrafterMismatch, match="no `draftline` lineage"):
        evaluate(eval_params(), args)
