"""Train for how the target is served: drafters trained on greedy vs sampled completions, judged greedy and sampled.

One temporary clone of this repository (tests/project_clone.py, the shipped params) runs ``dvc repro``; then
``dvc exp run`` regenerates the completions at each serving setting (``generate.temperature/top_p/top_k``, seeded by
``generate.seed``, so a rerun is byte-identical) and retrains the drafter at the same budget (the same prompts, the
same ``train.max_steps``), and the evaluate stage judges each under every setting of ``evaluate.sampling``. It
prints, per variant: z-lab's acceptance greedy and sampled on the held-out prompts and on each set, the sampled
pooled tau, the weakest held-out source, and the supervised tokens the drafter trained on.

    python bench/served.py            # 3 variants, about 35 minutes on a quiet 2-core machine
    python bench/served.py --variants greedy card
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))

import argparse  # noqa: E402
import json
import shutil
import tempfile
import time
from typing import Any

from project_clone import make_project, run

SPLIT = "dev"  # this bench picks generate's sampling default: a decision reads dev only (core/splits.py)

# The completions' sampling: greedy (the default), Qwen3's own non-thinking setting, and the DFlash 2 cards' setting.
VARIANTS = {
    "greedy": {"temperature": 0.0, "top_p": 1.0, "top_k": -1},
    "qwen3": {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
    "card": {"temperature": 1.0, "top_p": 0.95, "top_k": 20},
}


def figures(root: Path) -> dict[str, Any]:
    settings = json.loads((root / "reports" / "eval.json").read_text())["splits"][SPLIT]
    tokenize = json.loads((root / "reports" / "tokenize.json").read_text())
    run_file = json.loads((root / "reports" / "eval.run.json").read_text())
    out: dict[str, Any] = {"trained_tokens": tokenize["loss_tokens"], "eval_seconds": run_file["stage_seconds"]}
    for name, s in settings.items():
        out[name] = {"acceptance": {k: v["acceptance"] for k, v in s["per_set"].items()},
                     "tau": s["per_set"]["heldout"]["tau"],
                     "min_source": min((v["acceptance"], k) for k, v in s["per_source"].items()),
                     "per_source": {k: [v["tau"], v["acceptance"]] for k, v in s["per_source"].items()},
                     "per_set_tau": {k: v["tau"] for k, v in s["per_set"].items()}}
    return out


def measure(variants: list[str]) -> dict[str, dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="served-"))
    results = {}
    try:
        env = make_project(root)
        for name in variants:
            t0 = time.perf_counter()
            sets = [x for k, v in VARIANTS[name].items() for x in ("-S", f"generate.{k}={v}")]
            run(["dvc", "exp", "run", *sets], root, env, timeout=7200)
            results[name] = figures(root)
            print(f"{name}: {time.perf_counter() - t0:.0f} s, {json.dumps(results[name])}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


def table(results: dict[str, dict[str, Any]]) -> str:
    sets = sorted(next(iter(results.values()))["greedy"]["acceptance"])
    header = ["completions", *[f"{s} greedy / sampled" for s in sets], "sampled tau", "weakest source (sampled)",
              "trained tokens"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, r in results.items():
        cells = [f"{r['greedy']['acceptance'][s]:.2f} / {r['sampled']['acceptance'][s]:.2f}" for s in sets]
        low, source = r["sampled"]["min_source"]
        cells += [f"{r['sampled']['tau']:.2f}", f"{source} {low:.2f}", str(r["trained_tokens"])]
        lines.append("| " + " | ".join([f"{name} {VARIANTS[name]}", *cells]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    print(table(measure(ap.parse_args().variants)))


if __name__ == "__main__":
    main()
