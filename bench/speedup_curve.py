"""Acceptance against rows and steps, and the served speed-up it buys.

Each arm is the ``reports/eval.json`` of one run of the real-model preset with other rows or steps (its acceptance,
z-lab's tokens per step, with the report's interval over requests). A speculative step in llama.cpp costs the same
whatever it accepts (the target verifies the whole block, the drafter drafts it), so at one block size the decoding
speed-up is proportional to acceptance: an arm's projection is the served run's (``--served``, the serve stage's
``reports/serve.json`` of one drafter of the same recipe) scaled by the arm's acceptance over the served one. The
same proportion gives the acceptance a 2x speed-up needs with that drafter's step ("never" above the block size,
which no drafter can give), and ``bench/verify_cost.py``'s costs (``--verify``) the acceptance it needs with a
drafter that costs nothing, per target file: 2 x (the block's cost) / (one decoded token's).

    python bench/speedup_curve.py --served reports/serve.json --verify verify.json \\
        --arm 'rows 869, 900 steps=reports/eval.json' --out curve.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SPLITS = ("dev", "test")
SETTINGS = ("greedy", "sampled")


def served_step(serve_report: dict) -> dict:
    """The served drafter's greedy acceptance and decoding speed-up (the figure per token of its step's cost)."""
    drafter = serve_report["arms"]["drafter"]
    return {"block_size": serve_report["served"]["block_size"], "acceptance": drafter["greedy"]["acceptance"][0],
            "decode_speed_up": drafter["decode_speed_up"][0]}


def needed(speed_up: float, per_token: float, block: int) -> float | str:
    """The acceptance at which ``per_token`` x acceptance reaches ``speed_up``; "never" above the block size."""
    need = speed_up / per_token
    return round(need, 2) if need <= block else "never"


def arm(label: str, eval_json: Path, served: dict) -> dict:
    report = json.loads(eval_json.read_text())
    if report["block_size"] != served["block_size"]:
        raise SystemExit(f"{eval_json}: block {report['block_size']}, the served drafter's {served['block_size']}")
    per_token = served["decode_speed_up"] / served["acceptance"]
    out = {"arm": label, "eval": str(eval_json), "splits": {}}
    for split in SPLITS:
        for setting in SETTINGS:
            fig = report["splits"][split][setting]
            bounds = [fig["acceptance"], *fig["acceptance_ci"]]
            out["splits"][f"{split}/{setting}"] = {
                "acceptance": bounds, "requests": len(fig["per_request"]),
                "projected_decode_speed_up": [round(a * per_token, 3) for a in bounds]}
    return out


def labelled(value: str) -> tuple[str, Path]:
    label, sep, path = value.partition("=")
    if not sep or not label or not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"{value!r}: give LABEL=path/to/an/existing/reports/eval.json")
    return label, Path(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--served", type=Path, required=True, help="the serve stage's reports/serve.json")
    ap.add_argument("--verify", type=Path, required=True, help="bench/verify_cost.py's JSON")
    ap.add_argument("--arm", action="append", required=True, type=labelled, help="LABEL=path/to/reports/eval.json")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    served = served_step(json.loads(args.served.read_text()))
    block = served["block_size"]
    arms = [arm(label, path, served) for label, path in args.arm]
    free = {f["file"]: {b: needed(2.0, f["decode_ms"] / ms, int(b)) for b, ms in f["block_ms"].items() if int(b) > 1}
            for f in json.loads(args.verify.read_text())["files"]}
    result = {"served": served, "arms": arms,
              "acceptance_for_2x": {"this_step": needed(2.0, served["decode_speed_up"] / served["acceptance"], block),
                                    "free_drafter": free}}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for a in arms:
        print(a["arm"], {k: v["acceptance"] + v["projected_decode_speed_up"] for k, v in a["splits"].items()})
    print("acceptance a 2x speed-up needs:", result["acceptance_for_2x"])


if __name__ == "__main__":
    main()
