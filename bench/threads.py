"""Thread counts for the float stages: training and local generation at 1 and 2 torch threads, alone and beside a
process that keeps one core busy, measured side by side in one run (issue 12: no 8x slowdown under load).

On the committed embedded default (``data/target``, ``data/merged``, ``data/prompts``: run ``dvc repro`` or
``dvc pull`` first). Each cell is the median of ``--reps`` alternating repetitions:

- train: seconds per optimizer step over ``--steps`` steps of the train stage's own loop (params.yaml's train
  section, its resumable states in a temporary cache);
- generate: seconds per batch of ``generate.local.batch_size`` prompts of the local backend.

It prints, per stage and thread count, the quiet time, the loaded time and their ratio; the default thread counts
in params.yaml are the ones whose loaded time is best.

    python bench/threads.py             # about 5 minutes on 2 cores
    python bench/threads.py --reps 1 --steps 10
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


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


def measure(fn, threads: int, work: int, loaded: bool) -> float:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if loaded else None
    try:
        return fn(threads, work)
    finally:
        if spinner:
            spinner.kill()
            spinner.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30, help="train steps per measurement")
    ap.add_argument("--batches", type=int, default=4, help="generation batches per measurement")
    args = ap.parse_args()
    cases = [("train", train_seconds_per_step, args.steps, "s/step"),
             ("generate", generate_seconds_per_batch, args.batches, "s/batch")]
    times: dict[tuple[str, int, bool], list[float]] = {}
    for _ in range(args.reps):  # alternating, so that drift on a shared machine hits every cell alike
        for name, fn, work, _unit in cases:
            for threads in (1, 2):
                for loaded in (False, True):
                    times.setdefault((name, threads, loaded), []).append(measure(fn, threads, work, loaded))
    print("| stage | threads | quiet | beside one busy process | loaded / quiet |")
    print("|---|---|---|---|---|")
    for name, _fn, _work, unit in cases:
        for threads in (1, 2):
            q, b = (statistics.median(times[(name, threads, loaded)]) for loaded in (False, True))
            print(f"| {name} | {threads} | {q:.3f} {unit} | {b:.3f} {unit} | {b / q:.2f}x |")


if __name__ == "__main__":
    main()
