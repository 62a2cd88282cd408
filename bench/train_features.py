"""The train stage with the target's features cached in memory against computed online, side by side in one run.

On the committed embedded default (``data/target``, ``data/merged``: run ``dvc repro`` or ``dvc pull`` first), the
train stage's own run (the stage runner's ``execute``) with params.yaml's train section, ``--steps`` steps, its
resumable states in a temporary cache. Repetitions alternate cached and online, so drift on a shared machine hits
both alike. It prints per mode the median seconds of the steps, of the rest of the stage (the cache's one pass over
the rows is there), the whole stage, and whether both modes wrote the same checkpoint bytes (they must: the cache
holds the very features a step would compute).

    python bench/train_features.py              # about 3 minutes on 2 cores
    python bench/train_features.py --steps 2400 --reps 1
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def run_stage(feature_cache_gb: float, steps: int) -> dict:
    from draftline.core.runner import execute
    from draftline.train.params import TrainParams
    from draftline.train.stage import TrainArgs, run_train

    cfg = replace(TrainParams.load("train"), max_steps=steps, save_every=10**9, log_every=steps,
                  feature_cache_gb=feature_cache_gb)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DRAFTLINE_CACHE"] = str(Path(tmp) / "cache")  # the resumable states: a fresh start each run
        out = Path(tmp)
        args = TrainArgs(merged=REPO / "data/merged", target=REPO / "data/target/target.json", out=out / "ckpt",
                         metrics=out / "train.json", report=out / "report.json", plot=out / "loss.csv",
                         drafters=REPO / "data/drafters")
        t = time.perf_counter()
        stage = execute("train", run_train, cfg, args)
        wall = time.perf_counter() - t
        digest = hashlib.sha256((args.out / "model.safetensors").read_bytes()).hexdigest()
    seconds = stage.run["train_seconds"]
    return {"steps": seconds, "rest": wall - seconds, "wall": wall, "mode": stage.details["target_features"],
            "gb": stage.details["feature_cache_gb"], "digest": digest}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"cached": [], "online": []}
    for _ in range(args.reps):
        for budget in (float("inf"), 0.0):
            r = run_stage(budget, args.steps)
            runs[r["mode"]].append(r)
    print(f"| features | steps ({args.steps}) | rest of the stage | whole stage | cache |")
    print("|---|---|---|---|---|")
    for mode, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("steps", "rest", "wall")}
        print(f"| {mode} | {med['steps']:.1f} s | {med['rest']:.1f} s | {med['wall']:.1f} s | {rs[0]['gb']} GB |")
    digests = {r["digest"] for rs in runs.values() for r in rs}
    print(f"checkpoints: {'the same bytes' if len(digests) == 1 else 'DIFFERENT bytes'} in every run")
    c, o = (statistics.median(r["wall"] for r in runs[m]) for m in ("cached", "online"))
    print(f"whole stage online / cached = {o / c:.2f}x")


if __name__ == "__main__":
    main()
