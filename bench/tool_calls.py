"""Valid tool calls of the embedded target, per tool source and target seed: issue 58's figure.

A completion of a tool prompt is valid when its reply calls an offered tool with a JSON object of arguments
(``draftline.core.tool_calls.has_valid_tool_call``, the figure ``metrics/generate.json`` reports as
``tool_calls_valid``); a reply cut at ``generate.max_tokens`` counts as invalid here, since it is one the target
failed to end. Each arm is a set of param changes over the shipped params; each (arm, seed) runs ``dvc repro
generate`` (sources to generate, the shipped params otherwise) in one of ``--lanes`` temporary clones
(tests/project_clone.py), which keep their DVC cache between jobs, so sources and conversations run once per lane.

    python bench/tool_calls.py --seeds 0 1 2 3 4 5 6 7 8 9 \\
        --arm shipped= --arm 'http3=target.embedded.source_weights={hermes_fc: 3, agent: 3, http_traces: 3}'

Prints a table per arm (seeds as columns) and writes ``--out`` (JSON: per arm and seed, the valid and sent tool rows
per source, the truncated share per source and the target stage's seconds).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))

import argparse  # noqa: E402
import json
import shutil
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from queue import Queue
from typing import Any

import yaml
from embedded import completion_rates
from project_clone import make_project, run

from draftline.core.tool_calls import has_valid_tool_call


def parse_arm(spec: str) -> tuple[str, dict[str, Any]]:
    """``name=dotted.key=yaml;other.key=yaml`` as (name, {dotted key: value}); ``name=`` is the shipped params."""
    name, _, rest = spec.partition("=")
    items = (item.partition("=") for item in filter(None, rest.split(";")))
    return name, {key.strip(): yaml.safe_load(value) for key, _, value in items}


def apply(params: dict[str, Any], changes: dict[str, Any]) -> None:
    """Set each dotted key's value (a whole value: a mapping replaces the mapping); a key params.yaml lacks is an
    error."""
    for key, value in changes.items():
        *parents, leaf = key.split(".")
        node = params
        for p in parents:
            node = node[p]
        if leaf not in node:
            raise KeyError(f"params.yaml has no {key}")
        node[leaf] = value


def tool_validity(root: Path) -> dict[str, dict[str, int]]:
    """Per tool source: tool rows sent (kept completions and truncated ones) and valid calls among them."""
    sent, valid = Counter(), Counter()
    for part in sorted((root / "data" / "completions").glob("part-*.jsonl")):
        for line in part.read_text().splitlines():
            row = json.loads(line)
            if row.get("tools"):
                sent[row["source"]] += 1
                valid[row["source"]] += has_valid_tool_call(row["messages"][-1], row["tools"])
    per_source = json.loads((root / "reports" / "generate.json").read_text())["per_source"]
    for source in sent:  # truncated tool replies are left out of the completions: count them as sent, invalid
        sent[source] += per_source.get(source, {}).get("truncated", 0)
    return {s: {"sent": sent[s], "valid": valid[s]} for s in sorted(sent)}


def measure(lane: tuple[Path, dict[str, str]], changes: dict[str, Any], seed: int) -> dict[str, Any]:
    root, env = lane
    params = yaml.safe_load((root / "params.shipped.yaml").read_text())
    apply(params, {**changes, "target.seed": seed})
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["dvc", "repro", "generate"], root, env, timeout=7200)
    target_s = json.loads((root / "reports" / "target.run.json").read_text())["stage_seconds"]
    cut = {source: round(r["truncated"], 4) for source, r in completion_rates(root).items()}
    return {"seed": seed, "tools": tool_validity(root), "truncated": cut, "target_s": target_s}


def report(name: str, results: list[dict[str, Any]]) -> str:
    sources = sorted({s for r in results for s in r["tools"]})
    head = "| source | " + " | ".join(f"seed {r['seed']}" for r in results) + " | all |\n|" + "---|" * (len(results) + 2)
    rows = []
    for s in sources:
        cells = [f"{r['tools'][s]['valid']}/{r['tools'][s]['sent']}" for r in results]
        valid = sum(r["tools"][s]["valid"] for r in results)
        sent = sum(r["tools"][s]["sent"] for r in results)
        worst = min(r["tools"][s]["valid"] / r["tools"][s]["sent"] for r in results)
        rows.append(f"| {s} | " + " | ".join(cells) + f" | {valid / sent:.0%} (worst seed {worst:.0%}) |")
    worst_cut = [max(r["truncated"].values()) for r in results]
    rows.append("| cut at max_tokens, worst source | " + " | ".join(f"{w:.0%}" for w in worst_cut) + " | |")
    rows.append("| target stage s | " + " | ".join(f"{r['target_s']:.0f}" for r in results) + " | |")
    return f"{name}:\n\n{head}\n" + "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    ap.add_argument("--arm", action="append", default=None, help="name=key=yaml;key=yaml (default: shipped=)")
    ap.add_argument("--lanes", type=int, default=2, help="clones run side by side (one core each)")
    ap.add_argument("--out", type=Path, default=Path("tool_calls.json"))
    args = ap.parse_args()
    arms = [parse_arm(a) for a in args.arm or ["shipped="]]
    lanes: Queue = Queue()
    roots = [Path(tempfile.mkdtemp(prefix=f"tool-calls-{i}-")) for i in range(args.lanes)]
    for root in roots:
        env = make_project(root)
        shutil.copy2(root / "params.yaml", root / "params.shipped.yaml")
        lanes.put((root, env))

    def job(arm: tuple[str, dict[str, Any]], seed: int) -> tuple[str, dict[str, Any]]:
        lane = lanes.get()
        try:
            result = measure(lane, arm[1], seed)
        finally:
            lanes.put(lane)
        print(f"{arm[0]} seed {seed}: {json.dumps(result['tools'])}", flush=True)
        return arm[0], result

    try:
        with ThreadPoolExecutor(args.lanes) as pool:
            done = list(pool.map(lambda a: job(*a), [(arm, s) for arm in arms for s in args.seeds]))
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
    out = {name: {"changes": changes, "runs": [r for n, r in done if n == name]} for name, changes in arms}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for name in out:
        print(report(name, out[name]["runs"]) + "\n")


if __name__ == "__main__":
    main()
