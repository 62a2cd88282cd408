"""Acceptance against rows and steps, and the served speed-up it buys on the measured costs of a step.

Each arm is the ``reports/eval.json`` of one run of the real-model preset with other rows or steps (its acceptance,
z-lab's tokens per step, with the report's interval over requests). A speculative step in llama.cpp costs the target
one verification of the block and the drafter its own step, so a drafter of acceptance a at block B on a target file
decodes at ``a x decode_ms / (block_ms[B] + draft_ms)`` of the target alone: ``block_ms`` and ``decode_ms`` are
``bench/verify_cost.py``'s for that file, ``draft_ms`` what the served run's step took beyond verifying
(``--draft-ms``). The projection is checked against the preset's served figure in the study that uses it. For each
file it also states the acceptance a 2x speed-up needs at block B ("never" when that is more than B, which no drafter
can give).

    python bench/speedup_curve.py --verify verify.json --draft-ms 10 \\
        --arm 'rows 860, 900 steps=/work/smol/reports/eval.json' --out curve.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SPLITS = ("dev", "test")
SETTINGS = ("greedy", "sampled")


def projected(acceptance: float, costs: dict, block: int, draft_ms: float) -> float:
    return round(acceptance * costs["decode_ms"] / (costs["block_ms"][str(block)] + draft_ms), 3)


def needed_for(speed_up: float, costs: dict, block: int, draft_ms: float) -> float | str:
    need = speed_up * (costs["block_ms"][str(block)] + draft_ms) / costs["decode_ms"]
    return round(need, 2) if need <= block else "never"


def arm(label: str, eval_json: Path, files: list[dict], draft_ms: float) -> dict:
    report = json.loads(eval_json.read_text())
    block = report["block_size"]
    out = {"arm": label, "eval": str(eval_json), "block_size": block, "splits": {}}
    for split in SPLITS:
        for setting in SETTINGS:
            fig = report["splits"][split][setting]
            lo, hi = fig["acceptance_ci"]
            out["splits"][f"{split}/{setting}"] = {
                "acceptance": fig["acceptance"], "acceptance_ci": [lo, hi], "requests": len(fig["per_request"]),
                "projected_speed_up": {f["file"]: [projected(a, f, block, draft_ms) for a in (fig["acceptance"], lo, hi)]
                                       for f in files}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verify", type=Path, required=True, help="bench/verify_cost.py's JSON")
    ap.add_argument("--draft-ms", type=float, required=True, help="a drafting step's own cost in the engine (ms)")
    ap.add_argument("--arm", action="append", required=True, help="LABEL=path/to/reports/eval.json")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    files = json.loads(args.verify.read_text())["files"]
    arms = [arm(label, Path(path), files, args.draft_ms) for label, path in (a.split("=", 1) for a in args.arm)]
    blocks = sorted({a["block_size"] for a in arms})
    result = {"draft_ms": args.draft_ms, "verify": str(args.verify), "arms": arms,
              "acceptance_for_2x": {f["file"]: {b: needed_for(2.0, f, b, args.draft_ms) for b in blocks} for f in files}}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for a in arms:
        dev, test = a["splits"]["dev/greedy"], a["splits"]["test/greedy"]
        print(f"{a['arm']}: dev greedy {dev['acceptance']} {dev['acceptance_ci']}, test greedy {test['acceptance']} "
              f"{test['acceptance_ci']}; projected (test greedy): {test['projected_speed_up']}")
    print("acceptance a 2x speed-up needs:", result["acceptance_for_2x"])


if __name__ == "__main__":
    main()
