"""Every stage beside another busy process: quiet, beside one busy process, beside one ``nice -n 19`` busy
process, side by side in one run (issue 21: the defaults hold their speed without the user setting anything).

Each cell runs a shortened stage exactly as ``stages/<stage>.py`` runs it (``draftline.core.runner.execute``, the
shipped params.yaml, a temporary output folder) in a fresh interpreter, since OpenMP reads its wait policy once,
when torch loads. The busy process is ``while True: pass`` started with ``setsid`` (a session of its own, as a
user's other terminal or job is: with the kernel's autogroup, the CPU is then shared between the two sessions, so a
``nice -n 19`` inside the other session does not yield to us). Policies:

- ``draftline``: the environment as a user has it, no OpenMP variable set: what draftline sets for itself
  (``draftline/__init__.py``: OMP_WAIT_POLICY=PASSIVE);
- ``active``: OMP_WAIT_POLICY=ACTIVE, waiting threads spin (libgomp's behaviour before draftline set a policy);
- ``spin:N``: GOMP_SPINCOUNT=N, waiting threads spin N times, then sleep;
- ``cores``: OpenMP, the BLAS libraries and the tokenizers' Rayon pool one thread per core (what the stages ran
  before the one-core rule of ``draftline/core/threads.py``; tokenize's ``workers`` stays the param's).
- ``workers:N``: draftline's environment, and the stages that run processes (``target.embedded.workers``,
  ``generate.local.workers``, ``tokenize.workers``, ``evaluate.workers``) N of them instead of the param's
  (``workers:auto``: target and evaluate only).

Cells (on the committed embedded default: ``dvc repro`` or ``dvc pull`` first):

- target: seconds per optimizer step of the embedded target's build (``--steps`` steps, target.embedded.threads
  threads in target.embedded.workers processes);
- generate: seconds of generation for ``--prompts`` prompts of data/prompts/train.jsonl (generate.local.workers
  processes of generate.local.threads threads; model loading excluded);
- train: seconds per optimizer step over ``--steps`` steps (train.threads);
- evaluate: decoding seconds (reports/eval.run.json decode_seconds) of one eval prompt per source (evaluate.threads);
- prompts, tokenize, merge: the whole stage's seconds on the committed inputs (its params: tokenize.workers).

Each cell is the median of ``--reps`` repetitions, alternating cells so that drift hits every cell alike.

    python bench/threads.py                                   # about 25 minutes on 2 cores
    python bench/threads.py --stages target --policies draftline active spin:10000 --reps 1
    python bench/threads.py --stages evaluate --policies workers:1 workers:2 workers:auto   # evaluate's processes
    python bench/threads.py --stages target --policies workers:1 workers:2 workers:auto     # the target's ranks
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from busy import beside

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
LOADS = ("quiet", "busy", "niced")
WORKERS = "DRAFTLINE_BENCH_WORKERS"  # set by the workers:N policy for the cell's interpreter


def workers(param: int | str) -> int | str:
    """The cell's process count: the workers:N policy's N (``auto``: evaluate's choice), else the param's."""
    value = os.environ.get(WORKERS)
    return param if value is None else value if value == "auto" else int(value)


def _target(tmp: Path, steps: int, _prompts: int) -> float:
    from draftline.core.runner import execute
    from draftline.target.params import TargetParams
    from draftline.target.stage import TargetArgs, run_target

    p = TargetParams.load("target")
    spec = dataclasses.replace(p.embedded, steps=steps, warmup_steps=min(p.embedded.warmup_steps, steps), held_out=1,
                               greedy_tokens=1, workers=workers(p.embedded.workers))
    args = TargetArgs(conversations=DATA / "conversations", out=tmp / "target", metrics=tmp / "m.json",
                      report=tmp / "r.json", plot=tmp / "p.csv")
    return execute("target", run_target, dataclasses.replace(p, embedded=spec), args).run["train_s"] / steps


def _generate(tmp: Path, _steps: int, prompts: int) -> float:
    from draftline.core.runner import execute
    from draftline.generate.params import GenerateParams
    from draftline.generate.stage import GenerateArgs, run_generate

    lines = (DATA / "prompts" / "train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp / "train.jsonl").write_text("".join(lines[:prompts]), encoding="utf-8")
    args = GenerateArgs(prompts=tmp / "train.jsonl", target=DATA / "target" / "target.json", out=tmp / "completions",
                        metrics=tmp / "m.json", report=tmp / "r.json", drafters=DATA / "drafters")
    p = GenerateParams.load("generate")
    p = dataclasses.replace(p, local=dataclasses.replace(p.local, workers=workers(p.local.workers)))
    return execute("generate", run_generate, p, args).run["generation_seconds"]


def _train(tmp: Path, steps: int, _prompts: int) -> float:
    from draftline.core.runner import execute
    from draftline.train.params import TrainParams
    from draftline.train.stage import TrainArgs, run_train

    cfg = dataclasses.replace(TrainParams.load("train"), max_steps=steps, save_every=10**9, log_every=steps)
    args = TrainArgs(merged=DATA / "merged", target=DATA / "target" / "target.json", out=tmp / "ckpt",
                     metrics=tmp / "m.json", report=tmp / "r.json", plot=tmp / "p.csv", drafters=DATA / "drafters")
    return execute("train", run_train, cfg, args).run["train_seconds"] / steps


def _evaluate(tmp: Path, _steps: int, _prompts: int) -> float:
    from draftline.core.runner import execute
    from draftline.evaluate.params import EvalParams
    from draftline.evaluate.stage import EvalArgs, run_evaluate

    params = EvalParams.load("evaluate")
    params = dataclasses.replace(params, max_prompts_per_source=1, workers=workers(params.workers))
    args = EvalArgs(checkpoint=DATA / "checkpoints", target=DATA / "target" / "target.json",
                    prompts=DATA / "prompts" / "eval.jsonl", sets=DATA / "sets" / "conversations",
                    metrics=tmp / "m.json", report=tmp / "r.json", positions=tmp / "positions",
                    lengths=tmp / "lengths", intervals=tmp / "intervals", steps=tmp / "steps.jsonl")
    run = execute("evaluate", run_evaluate, params, args).run
    return run["decode_seconds"]


def _prompts(tmp: Path, _steps: int, _prompts: int) -> float:
    from draftline.core.runner import execute
    from draftline.prompts.params import load
    from draftline.prompts.stage import PromptsArgs, run_prompts

    args = PromptsArgs(conversations=DATA / "conversations", target=DATA / "target" / "target.json", out=tmp / "p",
                       metrics=tmp / "m.json", report=tmp / "r.json", plot=tmp / "mix.csv",
                       plot_shares=tmp / "shares.csv", plot_languages=tmp / "languages.csv",
                       drafters=DATA / "drafters",
                       bases=DATA / "bases")
    return execute("prompts", run_prompts, load(), args).run["stage_seconds"]


def _tokenize(tmp: Path, _steps: int, _prompts: int) -> float:
    from draftline.core.runner import execute
    from draftline.tokenize.params import load
    from draftline.tokenize.stage import TokenizeArgs, run_tokenize

    args = TokenizeArgs(completions=DATA / "completions", target=DATA / "target" / "target.json", out=tmp / "t",
                        metrics=tmp / "m.json", report=tmp / "r.json", plot=tmp / "p.csv")
    p = load()
    return execute("tokenize", run_tokenize, dataclasses.replace(p, workers=workers(p.workers)), args).run["stage_seconds"]


def _merge(tmp: Path, _steps: int, _prompts: int) -> float:
    from draftline.core.runner import execute
    from draftline.merge.params import load
    from draftline.merge.stage import MergeArgs, run_merge

    args = MergeArgs(tokenized=DATA / "tokenized", target=DATA / "target" / "target.json", out=tmp / "m",
                     metrics=tmp / "m.json", report=tmp / "r.json", plot=tmp / "p.csv", bases=DATA / "bases")
    return execute("merge", run_merge, load(), args).run["stage_seconds"]


CELLS = {"target": (_target, "s/step"), "generate": (_generate, "s"), "train": (_train, "s/step"),
         "evaluate": (_evaluate, "s"), "prompts": (_prompts, "s"), "tokenize": (_tokenize, "s"),
         "merge": (_merge, "s")}


def environment(policy: str) -> dict[str, str]:
    """The environment a user has (none of draftline's variables set), with ``policy``'s changes."""
    from draftline.core.threads import ONE_CORE

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", *ONE_CORE)}
    if policy == "active":
        env["OMP_WAIT_POLICY"] = "ACTIVE"
    elif policy.startswith("spin:"):
        env["GOMP_SPINCOUNT"] = policy.split(":", 1)[1]
    elif policy == "cores":  # every pool one thread per core: what the stages ran before the one-core rule
        env.update(dict.fromkeys(ONE_CORE, str(os.cpu_count() or 1)))
    elif policy.startswith("workers:"):
        env[WORKERS] = policy.split(":", 1)[1]
    elif policy != "draftline":
        raise SystemExit(f"unknown policy {policy!r}: draftline, active, cores, spin:<N> or workers:<N>")
    return env


def measure(stage: str, policy: str, load: str, steps: int, prompts: int) -> float:
    """One cell in a fresh interpreter, in the repository (its params.yaml), with a private scratch cache."""
    with tempfile.TemporaryDirectory() as tmp, beside(load):
        env = {**environment(policy), "DRAFTLINE_CACHE": str(Path(tmp) / "cache")}
        cmd = [sys.executable, __file__, "--cell", stage, tmp, str(steps), str(prompts)]
        out = subprocess.run(cmd, env=env, cwd=REPO, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60, help="target and train steps per cell")
    ap.add_argument("--prompts", type=int, default=64, help="prompts generated per cell")
    ap.add_argument("--stages", nargs="+", default=list(CELLS), choices=list(CELLS))
    ap.add_argument("--policies", nargs="+", default=["draftline", "active"])
    ap.add_argument("--loads", nargs="+", default=list(LOADS), choices=list(LOADS))
    ap.add_argument("--json", type=Path, help="also write every measurement here")
    ap.add_argument("--cell", nargs=4, metavar=("STAGE", "TMP", "STEPS", "PROMPTS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cell:
        stage, tmp, steps, prompts = args.cell
        print(CELLS[stage][0](Path(tmp), int(steps), int(prompts)))
        return
    grid = [(stage, policy) for stage in args.stages for policy in args.policies]
    times: dict[str, list[float]] = {}
    for _ in range(args.reps):
        for stage, policy in grid:
            for load in args.loads:
                t = measure(stage, policy, load, args.steps, args.prompts)
                times.setdefault(f"{stage}/{policy}/{load}", []).append(t)
                print(f"{stage} {policy} {load}: {t:.3f}", file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps(times, indent=2))
    print("| stage | policy | " + " | ".join(args.loads) + " | " + " | ".join(f"{x} / quiet" for x in args.loads[1:])
          + " |")
    print("|---" * (2 + 2 * len(args.loads) - 1) + "|")
    for stage, policy in grid:
        med = [statistics.median(times[f"{stage}/{policy}/{load}"]) for load in args.loads]
        unit = CELLS[stage][1]
        print(f"| {stage} | {policy} | " + " | ".join(f"{m:.3f} {unit}" for m in med) + " | "
              + " | ".join(f"{m / med[0]:.2f}x" for m in med[1:]) + " |")


if __name__ == "__main__":
    main()
