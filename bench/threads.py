"""Thread counts and OpenMP's wait policy for the float stages: the target build, training and local generation at
1 and 2 torch threads, alone and beside a process that keeps one core busy, measured side by side in one run
(issue 12: no 8x slowdown under load).

On the committed embedded default (``data/conversations``, ``data/target``, ``data/merged``, ``data/prompts``: run
``dvc repro`` or ``dvc pull`` first). Every cell runs in a fresh process, since OpenMP reads ``OMP_WAIT_POLICY``
once, when torch loads: ``active``, a waiting thread spins (how libgomp behaves when the variable is unset);
``passive``, it sleeps (what the docs suggest on a shared machine; the same bytes). Each cell is the median of
``--reps`` alternating repetitions:

- target: seconds per optimizer step of the embedded target's build (params.yaml's target.embedded, ``--steps``
  steps, in a temporary folder);
- train: seconds per optimizer step over ``--steps`` steps of the train stage's own loop (params.yaml's train
  section, its resumable states in a temporary cache);
- generate: seconds per batch of ``generate.local.batch_size`` prompts of the local backend.

It prints, per stage, policy and thread count, the quiet time, the loaded time and their ratio.

    python bench/threads.py             # about 20 minutes on 2 cores (12 cells x 2 loads x 3 reps, ~15 s each)
    python bench/threads.py --reps 1 --steps 10 --stages train
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def target_seconds_per_step(threads: int, steps: int) -> float:
    from draftline.core.logs import get_logger
    from draftline.core.skips import Skips
    from draftline.target.embedded.build import build_embedded_target
    from draftline.target.stage import TargetParams, read_all_conversations

    p = TargetParams.load("target")
    spec = replace(p.embedded, threads=threads, steps=steps, warmup_steps=min(p.embedded.warmup_steps, steps),
                   held_out=1, greedy_tokens=1)
    skips = Skips(get_logger("bench"))
    with tempfile.TemporaryDirectory() as tmp:
        build = build_embedded_target(read_all_conversations(REPO / "data/conversations", skips), tmp, spec, p.seed, skips)
    return build.metrics["train_s"] / steps


def train_seconds_per_step(threads: int, steps: int) -> float:
    from draftline.train.params import TrainParams
    from draftline.train.trainer import Paths, train

    cfg = replace(TrainParams.load("train"), threads=threads, max_steps=steps, save_every=10**9, log_every=steps)
    with tempfile.TemporaryDirectory() as tmp:
        paths = Paths(merged=REPO / "data/merged", target_dir=REPO / "data/target", checkpoint=Path(tmp) / "ckpt",
                      metrics=Path(tmp) / "train.json", plot=Path(tmp) / "loss.csv", cache_root=Path(tmp) / "cache")
        metrics = train(cfg, paths)
    return metrics["train_seconds"] / steps


def generate_seconds_per_batch(threads: int, batches: int) -> float:
    from draftline.core.records import read_prompts
    from draftline.core.skips import Skips
    from draftline.core.target import load_target
    from draftline.core.threads import torch_threads
    from draftline.generate.local import LocalBackend
    from draftline.generate.params import GenerateParams

    s = GenerateParams.load("generate")
    backend = LocalBackend(load_target(REPO / "data/target"), s.sampling, s.enable_thinking, s.local)
    prompts = read_prompts(REPO / "data/prompts/train.jsonl", Skips(__import__("logging").getLogger("bench")))
    size = backend.batch_size
    with torch_threads(threads):
        t = time.perf_counter()
        for b in range(batches):
            batch = prompts[b * size : (b + 1) * size]
            backend.generate([(p.messages, p.tools) for p in batch])
        return (time.perf_counter() - t) / batches


CASES = {"target": (target_seconds_per_step, "s/step"), "train": (train_seconds_per_step, "s/step"),
         "generate": (generate_seconds_per_batch, "s/batch")}


def measure(stage: str, policy: str, threads: int, work: int, loaded: bool) -> float:
    """One cell in a fresh interpreter with ``OMP_WAIT_POLICY=policy``, beside a busy process when ``loaded``."""
    env = dict(os.environ, OMP_WAIT_POLICY=policy.upper())
    cmd = [sys.executable, __file__, "--cell", stage, str(threads), str(work)]
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if loaded else None
    try:
        out = subprocess.run(cmd, env=env, cwd=REPO, check=True, capture_output=True, text=True).stdout
    finally:
        if spinner:
            spinner.kill()
            spinner.wait()
    return float(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30, help="target and train steps per measurement")
    ap.add_argument("--batches", type=int, default=4, help="generation batches per measurement")
    ap.add_argument("--stages", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--cell", nargs=3, metavar=("STAGE", "THREADS", "WORK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cell:
        stage, threads, work = args.cell[0], int(args.cell[1]), int(args.cell[2])
        print(CASES[stage][0](threads, work))
        return
    grid = [(stage, policy, threads) for stage in args.stages for policy in ("active", "passive") for threads in (1, 2)]
    times: dict[tuple, list[float]] = {}
    for _ in range(args.reps):  # alternating, so that drift on a shared machine hits every cell alike
        for stage, policy, threads in grid:
            work = args.batches if stage == "generate" else args.steps
            for loaded in (False, True):
                times.setdefault((stage, policy, threads, loaded), []).append(
                    measure(stage, policy, threads, work, loaded))
    print("| stage | OMP_WAIT_POLICY | threads | quiet | beside one busy process | loaded / quiet |")
    print("|---|---|---|---|---|---|")
    for stage, policy, threads in grid:
        q, b = (statistics.median(times[(stage, policy, threads, loaded)]) for loaded in (False, True))
        unit = CASES[stage][1]
        print(f"| {stage} | {policy} | {threads} | {q:.3f} {unit} | {b:.3f} {unit} | {b / q:.2f}x |")


if __name__ == "__main__":
    main()
