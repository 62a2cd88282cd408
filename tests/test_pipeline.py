"""The whole pipeline under DVC, in a temporary git repository: repro, no-op repro, experiments, rollback, remote.

This is the slow test of the suite: one `dvc repro` of every stage on the embedded default, shrunk (a smaller
target, fewer prompts and training steps) so that the module stays within a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import urllib.request
from pathlib import Path

import pytest
import yaml
from project_clone import SHRINK, digest, make_project, ran, run

pytestmark = pytest.mark.slow

ALL_STAGES = {"target", "prompts", "generate", "tokenize", "merge", "export", "train", "evaluate", "serve"}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("project")
    env = make_project(root, SHRINK)
    log = run(["dvc", "repro"], root, env)
    assert ALL_STAGES <= ran(log)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "first data version"], root, env)
    return root, env


def test_repro_builds_every_output(project):
    root, env = project
    for out in ("data/target/target.json", "data/prompts/train.jsonl", "data/prompts/eval.jsonl",
                "data/completions/part-00000.jsonl", "data/tokenized/draftline.json", "data/merged/draftline.json",
                "data/checkpoints/config.json", "data/checkpoints/model.safetensors", "metrics/eval.json",
                "reports/eval.json", "reports/sources/agent.json"):
        assert (root / out).is_file(), out
    train_rows = (root / "data/prompts/train.jsonl").read_text().count("\n")
    assert train_rows == SHRINK["blend"]["total"]
    ev = json.loads((root / "metrics/eval.json").read_text())
    assert ev["lossless"] == 1.0
    # Even a 40-step drafter is accepted beyond the one token every verification step gives for free, greedy and
    # sampled; every set is evaluated (mt_bench turn by turn).
    for setting in ("greedy", "sampled"):
        assert ev[setting]["tau"] > 1.1
        assert set(ev[setting]["acceptance"]) == {"heldout", "gsm8k", "mt_bench"}
        # the headline carries the held-out figure's interval, which holds it
        assert ev[setting]["acceptance_low"] <= ev[setting]["acceptance"]["heldout"] <= ev[setting]["acceptance_high"]
    assert set(ev["dev"]) == {"greedy", "sampled"}  # dev's held-out figure beside test's headline
    steps = [json.loads(x) for x in (root / "plots/eval_steps.jsonl").read_text().splitlines()]
    assert {(x["setting"], x["set"], x["turn"]) for x in steps} >= {("sampled", "mt_bench", 1), ("greedy", "gsm8k", 0)}
    assert {x["split"] for x in steps} == {"dev", "test"}
    # The run files (times, speeds) stay out of git: a rerun never shows as a change to commit.
    assert not [line for line in run(["git", "status", "--porcelain"], root, env).splitlines() if ".run.json" in line]
    assert (root / "reports" / "train.run.json").is_file()


def test_llama_cpp_serves_the_exported_drafter_as_evaluate_decodes_it(project):
    """The serve stage ran the real llama-server (built, or found in its cache) on the export stage's drafter.gguf
    beside its target.gguf, computing in float32 as evaluate does (``serve.exact``): on the test split, every greedy
    turn took the output ids and the verification steps evaluate's own loop took, and equals the target's output
    alone; the headline gives the speed-up with its interval and the served acceptance."""
    root, _ = project
    manifest = json.loads((root / "data/export/gguf/export.json").read_text())
    target = json.loads((root / "data/target/target.json").read_text())
    assert manifest["drafter"]["lineage"]["tokenizer_fingerprint"] == target["tokenizer_fingerprint"]
    report = json.loads((root / "reports/serve.json").read_text())
    assert report["served"]["drafter"] == "drafter.gguf" and report["served"]["target"] == "target.gguf"
    drafter = report["arms"]["drafter"]
    assert drafter["evaluate"]["turns"] >= 5, drafter
    assert drafter["evaluate"]["same_tokens"] == drafter["evaluate"]["same_steps"] == drafter["evaluate"]["turns"]
    assert drafter["evaluate"]["acceptance_engine"] == drafter["evaluate"]["acceptance_evaluate"]
    assert drafter["lossless"] == 1.0
    headline = json.loads((root / "metrics/serve.json").read_text())
    assert headline["served_acceptance"] == drafter["greedy"]["acceptance"][0] > 1
    low, high = drafter["speed_up"][1:]
    assert low <= headline["speed_up"] <= high


def test_llama_cpp_tokenizes_rendered_prompts_as_transformers_does(project, llama_server):
    """The embedded target's GGUF, whose pre-tokenizer the converter named from the tokenizer's own declaration
    (core/gguf.py): llama.cpp's tokens of every rendered train prompt (tools, system prompts, every source) are
    transformers' tokens."""
    from draftline.core.chat import render
    from draftline.core.launch import Server
    from draftline.core.records import read_prompts
    from draftline.core.skips import Skips
    from draftline.core.target_loader import load_target, load_tokenizer

    root, _ = project
    tok = load_tokenizer(load_target(root / "data/target/target.json"))
    prompts = read_prompts(root / "data/prompts/train.jsonl", Skips(logging.getLogger("test")))
    texts = [render(tok, p.messages, p.tools, enable_thinking=False, generation_prompt=True) for p in prompts]
    port = 30000 + os.getpid() % 20000
    argv = [str(llama_server), "--model", str(root / "data/export/gguf/target.gguf"), "--port", str(port),
            "--threads", "1", "--no-webui"]
    with Server(argv, f"http://127.0.0.1:{port}", root / "tokenize.log", health_timeout_s=120):
        same = [tok(t, add_special_tokens=False)["input_ids"] == llama_tokens(port, t) for t in texts]
    assert len(same) >= 100 and all(same), f"{same.count(False)} of {len(same)} differ"


def llama_tokens(port: int, text: str) -> list[int]:
    body = json.dumps({"content": text, "add_special": False, "parse_special": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)["tokens"]


def flat(d: dict, prefix: str = "") -> list[str]:
    """The column names `dvc metrics show` makes of nested keys (``greedy.acceptance.gsm8k``)."""
    return [k for key, v in d.items() for k in (flat(v, f"{prefix}{key}.") if isinstance(v, dict) else [prefix + key])]


def test_metrics_show_is_a_few_headline_columns(project):
    """`dvc metrics show` is one table, a column per distinct key: the headline figures alone, a screen wide."""
    root, env = project
    shown = json.loads(run(["dvc", "metrics", "show", "--json"], root, env))
    files = next(iter(shown.values()))["data"]
    keys = {key for f in files.values() for key in flat(f["data"])}
    assert {"rows", "tokens", "skipped", "greedy.tau", "sampled.acceptance.gsm8k", "lossless"} <= keys, sorted(keys)
    # 37: the held-out acceptance's interval added 4, dev's figure 2; the serve stage 5 (speed_up, decode_speed_up,
    # tokens_per_s, served_acceptance, served_acceptance_sampled: a null one is still a column); decontamination 4
    # (contaminated: total and per set); generate's tool_calls_valid a column per tool source (3)
    assert len(keys) <= 48, sorted(keys)
    assert sorted(files) == sorted(f"metrics/{s}.json" for s in ("target", "prompts", "generate", "tokenize", "merge",
                                                                  "export", "train", "eval", "serve"))


def test_second_repro_runs_nothing(project):
    root, env = project
    assert list((root / "src" / "draftline").rglob("*.pyc")), "the stages ran without writing bytecode"
    log = run(["dvc", "repro"], root, env)
    assert ran(log) == set()
    assert "Data and pipelines are up to date." in run(["dvc", "status"], root, env)
    lock = (root / "dvc.lock").read_text()
    assert ".pyc" not in lock and "__pycache__" not in lock


def _changed_after_editing(root: Path, env: dict[str, str], relative: str) -> set[str]:
    """The stages `dvc status` reports after appending a comment to one source file (restored afterwards)."""
    path = root / relative
    before = path.read_bytes()
    try:
        path.write_bytes(before + b"# an edit\n")
        return set(json.loads(run(["dvc", "status", "--json"], root, env)))
    finally:
        path.write_bytes(before)


def test_code_deps_cover_what_each_stage_runs(project):
    root, env = project
    stages = {s for s in yaml.safe_load((root / "dvc.lock").read_text())["stages"]}
    # core/ is shared by every stage: a change there marks all of them, every source's stages included.
    assert _changed_after_editing(root, env, "src/draftline/core/records.py") == stages
    # evaluate's own package marks evaluate alone: the drafter is never retrained for it.
    assert _changed_after_editing(root, env, "src/draftline/evaluate/report.py") == {"evaluate"}
    # The drafter package marks the stages that load a drafter: train, evaluate and generate (its speculative loop
    # with generate.draft_model; a rerun finds every prompt in the journal and sends nothing)
    # (export and serve too: they check a drafter's fit to the target before converting or serving it).
    assert _changed_after_editing(root, env, "src/draftline/drafter/model.py") == {"generate", "export", "train",
                                                                                   "evaluate", "serve"}
    assert "Data and pipelines are up to date." in run(["dvc", "status"], root, env)


def test_one_source_param_reruns_that_source_alone(project):
    root, env = project
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["sources"]["codefeedback"]["max_rows"] = 100
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        status = json.loads(run(["dvc", "status", "--json"], root, env))
        # That source's two stages; the prompt stage reads every source's name (their order) and sees it too.
        assert {s for s in status if "@" in s} == {"sources@codefeedback", "conversations@codefeedback"}
        assert set(status) <= {"sources@codefeedback", "conversations@codefeedback", "prompts"}
    finally:
        run(["git", "checkout", "params.yaml"], root, env)


def test_exp_run_changes_the_blend_and_reruns_from_prompts(project):
    root, env = project
    n = SHRINK["blend"]["total"] - 40
    log = run(["dvc", "exp", "run", "-S", f"blend.total={n}"], root, env)
    assert ran(log) == ALL_STAGES - {"target"}
    assert (root / "data/prompts/train.jsonl").read_text().count("\n") == n
    # Back to the committed version for the tests that follow, as a user goes back: git's files (params, lock,
    # metrics, reports, plots) from git, the data from DVC's cache.
    run(["git", "checkout", "--", "."], root, env)
    run(["dvc", "checkout", "--force"], root, env)
    assert "Data and pipelines are up to date." in run(["dvc", "status"], root, env)


def test_compare_finds_a_weakened_drafter_worse(project):
    """`draftline compare` on DVC experiments and a git revision: a drafter trained one step is worse than one trained
    300 (the committed 40-step drafter of this shrunk project is barely past one step), greedy and sampled, the
    interval below 0; the committed evaluation against itself cannot tell."""
    root, env = project
    for name, steps in (("weak", 1), ("strong", 300)):
        log = run(["dvc", "exp", "run", "-n", name, "-S", f"train.max_steps={steps}"], root, env)
        # export and serve too: this project exports the drafter as GGUF and serves it.
        assert ran(log) == {"train", "evaluate", "export", "serve"}
    # --min-n 1: this shrunk project's test split has about 10 turns in all, a handful per group; the plumbing is
    # under test here, not how sure a verdict on so few is (tests/evaluate/test_compare.py).
    got = json.loads(run(["draftline", "compare", "weak", "strong", "--json", "--min-n", "1"], root, env))
    for setting in ("greedy", "sampled"):
        overall = got[setting]["overall"]
        assert overall["verdict"] == "worse" and overall["acceptance"]["high"] < 0, overall
    itself = json.loads(run(["draftline", "compare", "HEAD", "HEAD", "--json", "--min-n", "1"], root, env))
    assert {g["verdict"] for s in itself.values() for g in s.values()} == {"cannot tell"}
    run(["git", "checkout", "--", "."], root, env)
    run(["dvc", "checkout", "--force"], root, env)
    assert "Data and pipelines are up to date." in run(["dvc", "status"], root, env)


def test_rollback_restores_the_previous_dataset_and_remote_restores_a_lost_cache(project, tmp_path):
    root, env = project
    first = digest(root / "data/merged")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["merge"]["seed"] = 1
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    log = run(["dvc", "repro"], root, env)
    assert ran(log) == {"merge", "export", "train", "evaluate", "serve"}
    assert digest(root / "data/merged") != first
    run(["git", "commit", "-qam", "second data version"], root, env)
    second = digest(root / "data/merged")

    run(["git", "checkout", "-q", "HEAD~1"], root, env)
    run(["dvc", "checkout"], root, env)
    assert digest(root / "data/merged") == first

    # A lost cache comes back from the remote, every version of it.
    run(["dvc", "remote", "add", "--local", "-d", "backup", str(tmp_path / "remote")], root, env)
    run(["dvc", "push", "--all-commits"], root, env)
    shutil.rmtree(root / ".dvc" / "cache")
    shutil.rmtree(root / "data" / "merged")
    run(["dvc", "pull"], root, env)
    assert digest(root / "data/merged") == first
    run(["git", "checkout", "-q", "-"], root, env)
    run(["dvc", "pull"], root, env)
    assert digest(root / "data/merged") == second
