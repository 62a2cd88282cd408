"""The evaluate stage: prompt rendering, selection, metrics, and a whole run on a tiny target with an untrained drafter."""

from __future__ import annotations

import csv
import dataclasses
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
from draftline.core.records import Conversation, PromptRecord, read_prompts
from draftline.core.requests import heldout_requests, render_prompt
from draftline.core.runner import execute, run_file
from draftline.core.skips import Skips
from draftline.core.target_loader import load_target
from draftline.drafter.config import DrafterMismatch, build_target_layer_ids, make_config
from draftline.drafter.fit import resolve_device
from draftline.drafter.model import DFlashDrafter
from draftline.drafter.speculative import Generation
from draftline.evaluate.params import EvalParams, IntervalParams
from draftline.evaluate.report import TurnResult, acceptance_by_position, headline, summarize_setting
from draftline.evaluate.stage import EvalArgs, decoded_settings, run_evaluate
from draftline.target.describe import describe_target

REPO = Path(__file__).resolve().parents[2]
HEADLINE = {"greedy", "sampled", "lossless", "skipped"}
CI = IntervalParams(resamples=1000, confidence=0.95, seed=0)


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


def eval_params(sets: dict | None = None, **overrides) -> EvalParams:
    """The repository's evaluate params with ``overrides``; ``sets`` replaces the benchmark sets (none by default:
    most tests decode held-out prompts only)."""
    values = default_params("evaluate", **overrides)
    values["sets"] = sets or {}
    return EvalParams.parse(values, "evaluate")


def eval_args(target_dir: Path, checkpoint: Path, prompts: Path, out: Path) -> EvalArgs:
    """The stage's paths as dvc.yaml passes them: the target.json file, the drafter's folder, eval.jsonl, the sets'
    conversations; the metrics, report and plots under ``out``."""
    return EvalArgs(target=target_dir / "target.json", checkpoint=checkpoint, prompts=prompts,
                    sets=out / "sets", metrics=out / "metrics" / "eval.json", report=out / "reports" / "eval.json",
                    positions=out / "plots" / "acceptance", lengths=out / "plots" / "acceptance_lengths",
                    intervals=out / "plots" / "acceptance_intervals", steps=out / "plots" / "eval_steps.jsonl")


def evaluate(params: EvalParams, args: EvalArgs):
    return execute("evaluate", run_evaluate, params, args)


def test_render_matches_the_servers_render(tokenizer):
    rec = prompt(0, "hermes_fc", "What is the weather in Paris?", tools=[WEATHER_TOOL])
    for thinking in (False, True):
        ids = render_prompt(tokenizer, rec.messages, rec.tools, thinking)
        server = tokenizer.apply_chat_template(
            rec.messages, tools=rec.tools, add_generation_prompt=True, enable_thinking=thinking, tokenize=False
        )
        assert ids == tokenizer(server, add_special_tokens=False)["input_ids"]
        text = tokenizer.decode(ids)
        assert "get_weather" in text and text.endswith("<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n"))


def test_prompt_selection_caps_each_source_and_split_and_counts_bad_lines(tmp_path):
    path = tmp_path / "eval.jsonl"
    lines = [prompt(i, "a", f"q{i}").to_json() for i in range(4)] + [prompt(0, "b", "b0").to_json()]
    lines[1:1] = ["{not json", json.dumps({"id": "x", "source": "a", "row": 9, "messages": []})]
    path.write_text("\n".join(lines) + "\n")
    skips = Skips(get_logger("test"))
    reqs = heldout_requests(read_prompts(path, skips), max_per_source=2)
    # a-0, a-1 and a-3 hash to test, a-2 and b-0 to dev (core/splits.py): two of a's test prompts, its dev one.
    assert [(r.id, r.split) for r in reqs] == [("a-0", "test"), ("a-1", "test"), ("a-2", "dev"), ("b-0", "dev")]
    assert all(r.set == "heldout" and len(r.turns) == 1 for r in reqs)
    assert skips.as_dict() == {"invalid JSON": 1, "no messages": 1}


def fake(tokens: list[int], accepted: list[int], produced: list[int], drafted: int = 3) -> Generation:
    return Generation(tokens, "length", 1 + len(produced), [drafted] * len(produced), accepted, produced)


def turn(id_: str, source: str, spec: Generation, base: Generation | None, set_: str = "heldout") -> TurnResult:
    return TurnResult("greedy", set_, source, id_, 0, 5, spec, base)


def test_both_figures_histogram_and_plot_from_known_steps():
    # Block 4: turn 1 had steps accepting 3, 1, 0 drafts; turn 2 accepted 2, then 3 cut at max_new_tokens.
    one = fake(list(range(8)), accepted=[3, 1, 0], produced=[4, 2, 1])
    two = fake(list(range(6)), accepted=[2, 3], produced=[3, 2])  # step 2 cut from 4 tokens to 2
    base1 = Generation(list(range(8)), "length", 8)
    base2 = Generation([9] * 6, "length", 6)  # differs: a lossless failure
    s = summarize_setting([turn("p1", "a", one, base1), turn("p2", "b", two, base2)], 4, CI)
    # Pooled: 12 tokens over 5 steps; z-lab's: the mean of the turns' means, (7/3 + 5/2) / 2.
    assert s["tau"] == 2.4 and s["acceptance"] == round((7 / 3 + 2.5) / 2, 4)
    # Resampling two turns: each figure lies between the one-turn figures, which bound the interval.
    assert s["acceptance_ci"] == [round(7 / 3, 4), 2.5] and s["tau_ci"] == [round(7 / 3, 4), 2.5]
    one_turn = round(7 / 3, 4)
    assert s["per_source"]["a"] == {"tau": one_turn, "acceptance": one_turn, "turns": 1, "steps": 3,
                                    "acceptance_ci": [one_turn, one_turn], "tau_ci": [one_turn, one_turn]}
    assert s["per_request"] == {"heldout/p1#0": ["a", 7, 3], "heldout/p2#0": ["b", 5, 2]}
    assert s["histogram"] == [0.0, 0.2, 0.4, 0.2, 0.2]
    assert s["lossless"] == 0.5 and s["mismatched"] == ["p2#0"]
    assert s["target_forwards"] == {"with_drafter": 4 + 3, "without_drafter": 14, "saved_fraction": 0.5}
    # The headline is test's; dev's held-out figure beside it (what decisions read); lossless over both.
    dev = {**s, "lossless": 1.0, "per_set": {"heldout": {"acceptance": 3.0, "acceptance_ci": [2.0, 4.0]}}}
    report = {"splits": {"test": {"greedy": s}, "dev": {"greedy": dev}}}
    assert headline(report) == {"greedy": {"acceptance": {"heldout": s["acceptance"]}, "acceptance_low": one_turn,
                                           "acceptance_high": 2.5, "tau": 2.4, "acceptance_min_source": one_turn},
                                "dev": {"greedy": 3.0},
                                "lossless": 0.5}
    rows = acceptance_by_position([turn("p1", "a", one, None), turn("p2", "b", two, None)], 4)
    # accepted per step: 3, 1, 0, 2, 3 -> position 1: 4/5, 2: 3/5 (3 of the 4 that reached it), 3: 2/5 (2 of 3)
    assert [(r["position"], r["accepted"], r["accept_rate"], r["conditional_rate"]) for r in rows] == [
        (1, 4, 0.8, 0.8), (2, 3, 0.6, 0.75), (3, 2, 0.4, round(2 / 3, 4))
    ]


def write_set(root: Path, name: str, convs: list[Conversation]) -> None:
    path = root / "sets" / name / "conversations.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(c.to_json() + "\n" for c in convs))


def test_evaluate_stage_greedy_sampled_and_a_multi_turn_set(tiny_target_dir, tmp_path):
    prompts = tmp_path / "eval.jsonl"
    recs = [prompt(0, "chat", "Say hello."), prompt(1, "chat", "Name three colours."), prompt(2, "chat", "extra"),
            prompt(0, "tools", "Weather in Oslo?", tools=[WEATHER_TOOL]), prompt(1, "long", "word " * 300)]
    prompts.write_text("".join(r.to_json() + "\n" for r in recs))
    two_turns = [{"role": "user", "content": "Tips for sleep?"}, {"role": "user", "content": "Shorter, please."}]
    write_set(tmp_path, "bench", [Conversation("bench", 0, two_turns), Conversation("bench", 1, [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "4"}])])
    params = eval_params(sets={"bench": {"path": "unused", "adapter": "mt_bench"}}, max_new_tokens=12,
                         max_prompts_per_source=2, max_prompt_tokens=200, workers=2, thinking="data")
    args = eval_args(tiny_target_dir, tiny_target_dir / "checkpoints", prompts, tmp_path)
    stage = evaluate(params, args)
    # Every request in its id's split (core/splits.py): bench-1 hashes to dev, every other one to test; the long
    # held-out prompt is skipped when rendered.
    splits = stage.details["splits"]
    assert stage.details["requests"] == {"dev": {"bench": 1}, "test": {"bench": 1, "heldout": 4}}
    # What draftline compare must find equal besides the prompts: the dtype and the kind of device as resolved.
    assert {k: stage.details[k] for k in ("max_prompt_tokens", "dtype", "device")} == {
        "max_prompt_tokens": 200, "dtype": "float32", "device": resolve_device("auto").type}
    greedy, sampled = splits["test"]["greedy"], splits["test"]["sampled"]
    assert greedy["lossless"] == 1.0 == splits["dev"]["greedy"]["lossless"]
    assert sampled["lossless"] is None  # sampled: checked by distribution (tests)
    assert greedy["per_set"]["bench"]["turns"] == 2 == sampled["per_set"]["bench"]["turns"]  # bench-0's two turns
    assert splits["dev"]["greedy"]["per_set"]["bench"]["turns"] == 1 and not splits["dev"]["greedy"]["per_source"]
    assert set(greedy["per_source"]) == {"chat", "tools"}
    # Once per setting, counted by the stage from its two workers' reports.
    assert stage.skips.as_dict() == {"prompt longer than max_prompt_tokens": 2}
    fw = greedy["target_forwards"]
    assert fw["without_drafter"] == greedy["generated_tokens"] == 5 * 12  # a random target never ends this soon
    assert fw["with_drafter"] == 5 + greedy["steps"]
    for s in (greedy, sampled):
        assert s["tau"] == round((s["generated_tokens"] - 5) / s["steps"], 4) and sum(s["histogram"]) == pytest.approx(1)
    # The headline: per setting z-lab's acceptance per set on test, the held-out tau, the weakest source; dev's
    # held-out figure (none here: no held-out prompt hashed to dev); lossless.
    metrics = json.loads(args.metrics.read_text())
    assert set(metrics) == HEADLINE | {"dev"} and metrics["skipped"] == 2 and metrics["lossless"] == 1.0
    assert metrics["sampled"]["acceptance"] == {"bench": sampled["per_set"]["bench"]["acceptance"],
                                                "heldout": sampled["per_set"]["heldout"]["acceptance"]}
    assert metrics["dev"] == {"greedy": None, "sampled": None}
    assert json.loads(args.report.read_text())["splits"] == splits
    run = json.loads(run_file(args.report).read_text())
    assert set(run) == {"decode_seconds", "stage_seconds"}
    # The per-step file: one line per turn and setting, from which both figures are recomputed.
    lines = [json.loads(x) for x in args.steps.read_text().splitlines()]
    assert len(lines) == 12 and {(x["setting"], x["split"], x["set"]) for x in lines} >= {("sampled", "dev", "bench")}
    heldout = [x for x in lines if x["setting"] == "sampled" and x["set"] == "heldout"]
    assert sum(sum(x["produced"]) for x in heldout) / sum(len(x["produced"]) for x in heldout) == pytest.approx(
        sampled["per_set"]["heldout"]["tau"], abs=1e-4)
    for folder in (args.positions, args.lengths, args.intervals):
        assert sorted(p.name for p in folder.iterdir()) == ["greedy.csv", "sampled.csv"]
    # The error-bar plot: every set and held-out source of each split, its figure inside its interval.
    with open(args.intervals / "sampled.csv") as f:
        bars = list(csv.DictReader(f))
    assert [(b["split"], b["group"]) for b in bars] == [("dev", "set bench"), ("test", "set bench"),
                                                        ("test", "set heldout"), ("test", "chat"), ("test", "tools")]
    assert all(float(b["low"]) <= float(b["acceptance"]) <= float(b["high"]) for b in bars)
    assert float(bars[2]["acceptance"]) == sampled["per_set"]["heldout"]["acceptance"]
    with open(args.positions / "greedy.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["position"]) for r in rows] == list(range(1, 8))
    outputs = (args.metrics, args.report, args.steps, args.lengths / "sampled.csv")
    first = [p.read_bytes() for p in outputs]
    # Workers change nothing but the speed: the same bytes from one process as from two.
    again = evaluate(dataclasses.replace(params, workers=1), args)
    assert again.run["stage_seconds"] > 0 and [p.read_bytes() for p in outputs] == first
    assert again.skips.as_dict() == stage.skips.as_dict()


def test_the_next_turn_follows_the_targets_own_reply(tiny_target_dir, tmp_path):
    """mt-bench's second turn is rendered after the decoded reply to the first, as z-lab's benchmark does."""
    from draftline.core.requests import Request, stop_token_ids
    from draftline.core.target_loader import load_target as load_info
    from draftline.drafter.speculative import GREEDY, DFlashProposer
    from draftline.evaluate.decoder import Decoder, load_models

    info = load_info(tiny_target_dir / "target.json")
    params = eval_params(max_new_tokens=6)
    target, tok, drafter = load_models(info, tiny_target_dir / "checkpoints", params)
    decoder = Decoder(target, tok, DFlashProposer(drafter), stop_token_ids(info), params, False)
    req = Request("bench", "bench", "r", [], [{"role": "user", "content": "One?"}, {"role": "user", "content": "Two?"}])
    first, second = decoder.request("greedy", GREEDY, req, False, Skips(get_logger("test")))
    reply = tok.decode(first.speculative.tokens, skip_special_tokens=True)
    expected = render_prompt(tok, [req.turns[0], {"role": "assistant", "content": reply}, req.turns[1]], None, False)
    assert second.prompt_tokens == len(expected) and second.turn == 1


def test_unknown_params_and_missing_drafter_are_named(tiny_target_dir, tmp_path):
    with pytest.raises(ValueError, match="max_new_token"):
        eval_params(max_new_token=5)
    with pytest.raises(ValueError, match="enable_thinking"):  # not a param: the drafter's lineage says it
        eval_params(enable_thinking=False)
    with pytest.raises(ValueError, match="threads 2 and workers auto"):  # forked workers need a one-thread parent
        eval_params(threads=2, workers="auto")
    with pytest.raises(ValueError, match=r"evaluate\.workers must be >= 1 or auto"):
        eval_params(workers=0)
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
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"evaluate": {**default_params("evaluate"), "sets": {}}}))
    a = eval_args(tiny_target_dir, tmp_path / "none", prompts, tmp_path)
    flags = [x for f in ("checkpoint", "target", "prompts", "sets", "metrics", "report", "positions", "lengths",
                         "intervals", "steps")
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
    from drafter_support import untrained_drafter

    untrained_drafter(embedded_target / "target.json", tmp_path / "checkpoints", block_size=8, tapped=3)
    prompts = tmp_path / "eval.jsonl"
    recs = [PromptRecord(id=f"c{c.row}", source=c.source, row=c.row, tools=c.tools,
                         messages=[m for m in c.messages if m["role"] != "assistant"][:2])
            for c in tiny_conversations(8)]
    prompts.write_text("".join(r.to_json() + "\n" for r in recs))
    stage = evaluate(eval_params(max_new_tokens=24, max_prompts_per_source=8),
                     eval_args(embedded_target, tmp_path / "checkpoints", prompts, tmp_path))
    assert stage.details["requests"] == {"dev": {"heldout": 3}, "test": {"heldout": 5}}  # c1-c3 hash to dev
    for split, n in (("dev", 3), ("test", 5)):
        m = stage.details["splits"][split]["greedy"]
        assert m["per_set"]["heldout"]["turns"] == n and m["lossless"] == 1.0
        assert m["target_forwards"]["without_drafter"] == m["generated_tokens"]
    assert stage.headline["lossless"] == 1.0


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


def test_a_dflash2_drafter_is_decoded_through_its_selector_and_reports_its_figures(tiny_target_dir, tmp_path):
    """Greedy: lossless through the selector's path, with the figures DFlash 2 trainers log (sampled settings have
    none: they need the greedy gold tokens). A fresh selector (successor codebook zero) walks the unary path. That the
    sampled K-way path keeps the target's distribution is tests/drafter/test_sampling.py's chi-square test."""
    from transformers import PretrainedConfig

    info = load_target(tiny_target_dir / "target.json")
    target_cfg = PretrainedConfig.from_json_file(str(tiny_target_dir / "model" / "config.json"))
    cfg = make_config(Qwen3Config(**target_cfg.to_dict()), num_layers=1, block_size=8, mask_token_id=info.mask_token_id,
                      target_layer_ids=build_target_layer_ids(4, 2), lineage=lineage(info), architecture="dflash2",
                      dflash2={"conv_kernel_size": 3, "conv_group_size": 16, "selector_rank": 4, "selector_top_k": 4})
    torch.manual_seed(0)
    DFlashDrafter(cfg).save_pretrained(tmp_path / "d2")
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text("".join(prompt(i, "chat", t).to_json() + "\n" for i, t in enumerate(["Say hi.", "Count."])))
    stage = evaluate(eval_params(max_new_tokens=16), eval_args(tiny_target_dir, tmp_path / "d2", prompts, tmp_path))
    greedy, sampled = stage.details["splits"]["test"]["greedy"], stage.details["splits"]["test"]["sampled"]
    assert greedy["lossless"] == 1.0 and sampled["selector"] is None  # figures need the greedy gold tokens
    sel = greedy["selector"]
    assert sel["steps"] == greedy["steps"] and sel["tau_selector_path"] == sel["tau_unary_path"]
    assert 1.0 <= sel["tau_selector_path"] <= sel["tau_top_k_oracle"] <= 8
    assert 0.0 <= sel["selector_accuracy"] <= sel["top_k_recall"] <= 1.0


def test_a_worker_that_dies_stops_the_stage_instead_of_hanging():
    """A worker killed mid-request (the OOM killer, a SIGKILL) ends decoding with a one-line error naming the fix."""
    from types import SimpleNamespace

    from draftline.core.threads import torch_threads
    from draftline.evaluate.pool import WorkerDied, decode_all

    class Dies:
        target = SimpleNamespace(device=torch.device("cpu"))

        def request(self, setting, sampling, request, thinking, skips):
            if request == "fatal":
                os._exit(9)
            return [request]

    jobs = [("greedy", None, r, False) for r in ("a", "b", "fatal", "c")]
    with torch_threads(1), pytest.raises(WorkerDied, match="evaluate.workers: 1"):  # as the stage forks them
        list(decode_all(jobs, Dies(), 2, Skips(get_logger("test"))))


def test_thinking_on_and_off_are_decoded_and_reported_apart(tiny_target_dir, tmp_path):
    """The tiny target has Qwen3's hybrid template and a drafter trained on thinking-off data: every setting is
    decoded as trained (its plain name) and again with thinking on (``@thinking_on``), each prompt rendered in its
    mode, each reported on its own."""
    prompts = tmp_path / "eval.jsonl"
    recs = [prompt(i, "chat", text) for i, text in enumerate(("Say hello.", "Name three colours.", "2 + 2?"))]
    prompts.write_text("".join(r.to_json() + "\n" for r in recs))
    params = eval_params(max_new_tokens=4, workers=1, thinking="both")
    args = eval_args(tiny_target_dir, tiny_target_dir / "checkpoints", prompts, tmp_path)
    stage = evaluate(params, args)
    settings = {"greedy": "off", "sampled": "off", "greedy@thinking_on": "on", "sampled@thinking_on": "on"}
    assert stage.details["enable_thinking"] is False  # the training data's
    assert stage.details["thinking"] == {"template_has_thinking_mode": True, "settings": settings}
    assert stage.details["sampling"]["greedy@thinking_on"] == {**stage.details["sampling"]["greedy"],
                                                               "enable_thinking": True}
    assert set(stage.details["splits"]["test"]) == set(settings)
    metrics = json.loads(args.metrics.read_text())
    assert set(settings) <= set(metrics) and metrics["lossless"] == 1.0  # greedy verified in both modes
    # Each turn was rendered in its setting's mode: Qwen3's thinking-off prompt ends in an empty think block.
    tok = AutoTokenizer.from_pretrained(tiny_target_dir / "model", local_files_only=True)
    steps = [json.loads(x) for x in args.steps.read_text().splitlines()]
    by_id = {r.id: r for r in recs}
    assert len(steps) == 4 * len(recs)
    for x in steps:
        mode = settings[x["setting"]] == "on"
        assert x["prompt_tokens"] == len(render_prompt(tok, by_id[x["id"]].messages, None, mode))
    # ... and the two modes' prompts differ (else the split would tell nothing apart).
    assert all(len(render_prompt(tok, r.messages, None, False)) != len(render_prompt(tok, r.messages, None, True))
               for r in recs)


def test_which_thinking_modes_are_decoded():
    both, data = eval_params(thinking="both"), eval_params(thinking="data")
    assert list(decoded_settings(both, False, True)) == ["greedy", "sampled", "greedy@thinking_on",
                                                         "sampled@thinking_on"]
    assert list(decoded_settings(both, True, True)) == ["greedy", "sampled", "greedy@thinking_off",
                                                        "sampled@thinking_off"]
    # Data of mixed modes (null: the template's own): both explicit modes besides.
    assert [(k, s.thinking) for k, s in decoded_settings(both, None, True).items() if k.startswith("greedy")] == [
        ("greedy", None), ("greedy@thinking_off", False), ("greedy@thinking_on", True)]
    # A template without a thinking mode: nothing to tell apart, decoded once; `data` asks for the data's mode alone,
    # and for both explicit modes besides where the data mixes them (reported apart where it matters).
    assert list(decoded_settings(both, False, False)) == list(decoded_settings(data, False, True)) == [
        "greedy", "sampled"]
    assert decoded_settings(data, None, True).keys() == decoded_settings(both, None, True).keys()
    assert list(decoded_settings(data, None, False)) == ["greedy", "sampled"]
