"""``draftline compare``: request by request over the same prompts, a verdict per group, refusals by name, and the
three ways to name an evaluation (a file, a git revision; DVC experiments in tests/test_pipeline.py)."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from draftline.cli import main
from draftline.evaluate.compare import MIN_N, NotComparable, compare, load, table

SOURCES = ("agent", "metamathqa")


def report(shift: float = 0.0, seed: int = 0, n: int = 40) -> dict:
    """A report of ``n`` held-out turns per source and 10 gsm8k turns: produced / steps per turn, steps 10, the
    produced counts of seed ``seed`` plus ``shift`` tokens a step (so A - B of two shifts is exactly their gap)."""
    rng = np.random.default_rng(seed)
    per_request = {}
    for source in SOURCES:
        for i in range(n):
            per_request[f"heldout/{source}-{i}#0"] = [source, int(rng.integers(20, 60)) + int(10 * shift), 10]
    for i in range(10):
        per_request[f"gsm8k/gsm8k-{i}#0"] = ["gsm8k", int(rng.integers(20, 40)) + int(10 * shift), 10]
    settings = {"greedy": {"per_request": per_request}, "sampled": {"per_request": per_request}}
    return {"splits": {"dev": copy.deepcopy(settings), "test": copy.deepcopy(settings)}, "max_new_tokens": 128,
            "max_prompt_tokens": 2048, "dtype": "float32", "device": "cpu",
            "enable_thinking": False, "target": {"model_fingerprint": "m", "tokenizer_fingerprint": "t"},
            "prompts": {"fingerprint": "p", "requests": 2 * n + 10},
            "sampling": {"greedy": {"temperature": 0.0, "top_p": 1.0, "top_k": 0},
                         "sampled": {"temperature": 1.0, "top_p": 0.95, "top_k": 20}},
            "intervals": {"resamples": 1000, "confidence": 0.95, "seed": 0}}


def write(path: Path, rep: dict) -> Path:
    path.write_text(json.dumps(rep))
    return path


def test_an_evaluation_against_itself_cannot_tell_anywhere(tmp_path):
    a = load(str(write(tmp_path / "a.json", report())), tmp_path)
    result = compare(a, a)
    assert set(result) == {"greedy", "sampled"}
    groups = [r.group for r in result["greedy"]]
    assert groups == ["overall", "set:gsm8k", "set:heldout", "source:agent", "source:metamathqa"]
    for rows in result.values():
        for r in rows:
            assert r.verdict == "cannot tell"
            assert (r.acceptance.estimate, r.acceptance.low, r.acceptance.high) == (0.0, 0.0, 0.0)
            assert (r.tau.low, r.tau.high) == (0.0, 0.0)


def test_a_shift_of_one_token_a_step_is_better_and_its_reverse_worse(tmp_path):
    a = load(str(write(tmp_path / "a.json", report(shift=1.0))), tmp_path)
    b = load(str(write(tmp_path / "b.json", report())), tmp_path)
    rows = {r.group: r for r in compare(a, b)["greedy"]}
    assert rows["overall"].acceptance.estimate == pytest.approx(1.0) and rows["overall"].verdict == "better"
    assert rows["source:agent"].acceptance.n == 40 and rows["set:gsm8k"].acceptance.n == 10
    assert rows["overall"].tau.estimate == pytest.approx(1.0)
    assert {r.verdict for r in compare(b, a)["sampled"]} == {"worse"}


def test_noise_alone_cannot_tell_and_a_real_gap_under_noise_is_found(tmp_path):
    base = report(seed=1)
    noisy, gap = copy.deepcopy(base), copy.deepcopy(base)
    rng = np.random.default_rng(2)
    for key, (_, produced, _) in base["splits"]["test"]["greedy"]["per_request"].items():
        noise = int(rng.integers(-6, 7))  # +-0.6 tokens a step, mean 0
        noisy["splits"]["test"]["greedy"]["per_request"][key][1] = produced + noise
        gap["splits"]["test"]["greedy"]["per_request"][key][1] = produced + noise + 5
    b = load(str(write(tmp_path / "b.json", base)), tmp_path)
    same = {r.group: r for r in compare(load(str(write(tmp_path / "n.json", noisy)), tmp_path), b)["greedy"]}
    assert same["overall"].verdict == "cannot tell"
    better = {r.group: r for r in compare(load(str(write(tmp_path / "g.json", gap)), tmp_path), b)["greedy"]}
    assert better["overall"].verdict == "better" and better["overall"].acceptance.low > 0.3


def test_a_group_under_the_minimum_gets_no_verdict_however_clear_its_interval(tmp_path, capsys):
    """One held-out turn of agent and MIN_N - 1 of metamathqa, each a token a step better: their intervals exclude
    0 (one turn's is the point +1), yet they are too few for a verdict; gsm8k's MIN_N turns and overall get one."""
    keep = {"heldout/agent-0#0", *(f"heldout/metamathqa-{i}#0" for i in range(MIN_N - 1))}
    reports = []
    for shift in (1.0, 0.0):
        rep = report(shift=shift)
        for setting in rep["splits"]["test"].values():
            setting["per_request"] = {k: v for k, v in setting["per_request"].items()
                                      if k in keep or k.startswith("gsm8k/")}
        reports.append(rep)
    a = load(str(write(tmp_path / "a.json", reports[0])), tmp_path)
    b = load(str(write(tmp_path / "b.json", reports[1])), tmp_path)
    result = compare(a, b)
    rows = {r.group: r for r in result["greedy"]}
    assert (rows["source:agent"].acceptance.n, rows["source:metamathqa"].acceptance.n) == (1, MIN_N - 1)
    assert rows["source:agent"].acceptance.low == pytest.approx(1.0) and rows["source:metamathqa"].acceptance.low > 0
    assert rows["source:agent"].verdict == rows["source:metamathqa"].verdict == "too few"
    assert rows["set:gsm8k"].acceptance.n == MIN_N and rows["set:gsm8k"].verdict == "better"
    assert rows["overall"].verdict == "better"
    agent = next(line for line in table(a, b, result).splitlines() if line.strip().startswith("source:agent"))
    assert agent.split()[1] == "1" and agent.endswith("too few")  # n is shown beside it
    # Lowered knowingly on the command line, the same group gets its verdict; below 1 is refused.
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json", "--min-n", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["greedy"]["source:agent"]["verdict"] == "better"
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--min-n", "0"]) == 2
    assert "--min-n must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("field, value", [
    ("prompts", {"fingerprint": "other", "requests": 90}),
    ("target", {"model_fingerprint": "m2", "tokenizer_fingerprint": "t"}),
    ("max_new_tokens", 64),
    ("intervals", {"resamples": 5000, "confidence": 0.95, "seed": 0}),
    ("dtype", "bfloat16"),  # bf16 flips near-ties float32 keeps: other drafts accepted
    ("device", "cuda"),
    ("max_prompt_tokens", 256),  # other turns skipped as too long
])
def test_different_prompts_targets_or_draws_are_refused_by_name(tmp_path, field, value):
    other = report()
    other[field] = value
    a = load(str(write(tmp_path / "a.json", report())), tmp_path)
    b = load(str(write(tmp_path / "b.json", other)), tmp_path)
    with pytest.raises(NotComparable, match=f"differ in {field}"):
        compare(a, b)


def test_a_setting_sampled_otherwise_is_refused_and_an_old_report_is_named(tmp_path):
    other = report()
    other["sampling"]["sampled"]["temperature"] = 0.7
    a = load(str(write(tmp_path / "a.json", report())), tmp_path)
    with pytest.raises(NotComparable, match="differ in sampling.sampled"):
        compare(a, load(str(write(tmp_path / "b.json", other)), tmp_path))
    old = report()
    del old["splits"]["test"]["greedy"]["per_request"]
    with pytest.raises(NotComparable, match="no per-request figures of the test split.*dvc repro evaluate"):
        load(str(write(tmp_path / "old.json", old)), tmp_path)
    older = {k: v for k, v in report().items() if k != "splits"} | {"settings": report()["splits"]["test"]}
    with pytest.raises(NotComparable, match="of the dev split \\(its splits: none"):  # before the splits existed
        load(str(write(tmp_path / "older.json", older)), tmp_path, "dev")
    (tmp_path / "cut.json").write_text('{"splits": {"test": ')  # a report cut half-way: named, no traceback
    with pytest.raises(NotComparable, match="cut.json: not an eval report"):
        load(str(tmp_path / "cut.json"), tmp_path)


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def test_revisions_read_the_committed_report_where_dvc_yaml_puts_it(tmp_path, capsys):
    root = tmp_path / "project"
    (root / "out").mkdir(parents=True)
    git(root, "init", "-q")
    git(root, "config", "user.email", "t@t")
    git(root, "config", "user.name", "t")
    (root / "dvc.yaml").write_text("vars:\n  - paths:\n      reports: out\nstages: {}\n")
    write(root / "out" / "eval.json", report())
    git(root, "add", "-A")
    git(root, "commit", "-qm", "first")
    write(root / "out" / "eval.json", report(shift=1.0))
    git(root, "commit", "-qam", "second")
    assert main(["compare", "HEAD", "HEAD~1", "--repo", str(root)]) == 0
    out = capsys.readouterr().out
    assert "A = HEAD, B = HEAD~1" in out
    overall = next(line for line in out.splitlines() if line.strip().startswith("overall"))
    assert overall.split()[-1] == "better" and "+1.000" in overall
    assert main(["compare", "HEAD", "HEAD", "--repo", str(root), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert {g["verdict"] for s in got.values() for g in s.values()} == {"cannot tell"}
    # --split dev reads the dev split only: there the second commit is no better than the first.
    second = report(shift=1.0)
    second["splits"]["dev"] = report()["splits"]["dev"]
    write(root / "out" / "eval.json", second)
    git(root, "commit", "-qam", "third: better on test only")
    assert main(["compare", "HEAD", "HEAD~2", "--repo", str(root), "--split", "dev"]) == 0
    out = capsys.readouterr().out
    assert "on the dev split" in out and "better" not in out and "worse" not in out
    assert main(["compare", "HEAD", "no-such-rev", "--repo", str(root)]) == 2
    assert "neither a file, a git revision nor a DVC experiment" in capsys.readouterr().err
