"""Rounds that feed each other, on the embedded default: the README's round sequence, measured.

Per target seed, in a temporary git + DVC clone of this repository (tests/project_clone.py):

1. **round 1**: ``dvc repro`` as shipped but for ``blend.total`` (``--round1-total``, 600: the shipped 1,200
   leaves round 2 nothing to steer in the samples, see ROUND1_TOTAL); its merged set, drafter and evaluation kept as the README says
   (``data/bases/round1``, ``data/drafters/round1`` and its ``eval.json``), committed, tagged ``round1`` and pushed
   to a local DVC remote;
2. **round 2, warm**: ``dvc exp run`` with ``merge.base`` = round 1's merged set, ``train.init_from`` and
   ``generate.draft_model`` = round 1's drafter, the blend steered by round 1's evaluation (``blend.steer``),
   ``--round2-total`` new prompts, round 1's train steps; and the same with a third of them (does a warm start
   reach round 1's tau in a third of the steps?);
3. **round 2, cold**: the same base and new-prompt budget, no init, no steering, no drafter, round 1's steps;
4. rollback: ``git checkout round1 && dvc checkout`` gives round 1's merged set and drafter back byte-identical.

It prints, each round 2 against round 1: z-lab's acceptance greedy and sampled, overall (held-out) and per source,
the pooled tau and whether it reaches round 1's; the weakest source; the train steps; the target forwards saved
during generation (the drafter's acceptance there); new prompts picked that were already in the base; how much the
merged set (the data version the next round builds on: its workspace files and cache objects) grew per new shard
byte, and how much everything the round wrote did; and whether the rollback restored round 1 byte for byte.

    nice -n 10 python bench/rounds.py --seeds 0 1      # about 40 minutes a seed on a quiet 2-core machine
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

import yaml
from project_clone import digest, make_project, run

SPLIT = "test"  # the rounds' figures are reported, not used to pick a default (core/splits.py)

# The embedded samples hold 1,730 train prompts after the eval split; the shipped round 1 (1,200) leaves 530, 500
# of them metamathqa's: nothing to steer. Round 1 at 600 leaves every weighted source rows to choose from.
ROUND1_TOTAL = 600
ROUND2_TOTAL = 300


def inodes(root: Path) -> dict[int, int]:
    """Workspace + DVC cache files as {inode: bytes}, each distinct inode once; scratch (.draftline: resumable
    training states and journals; .dvc/tmp) and git are not part of a data version and are left out."""
    sizes = {}
    for p in root.rglob("*"):
        rel = p.relative_to(root).parts
        if rel[0] in (".git", ".draftline") or rel[:2] == (".dvc", "tmp") or p.is_symlink() or not p.is_file():
            continue
        st = p.stat()
        sizes[st.st_ino] = st.st_size
    return sizes


def merged_files(root: Path) -> list[Path]:
    """The merged set's files in the workspace and their DVC cache objects (from dvc.lock's ``.dir`` listing)."""
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]["merge"]["outs"]
    md5 = next(o["md5"] for o in lock if o["path"] == "data/merged")
    cache = root / ".dvc/cache/files/md5"
    listing = cache / md5[:2] / md5[2:]
    objects = [cache / e["md5"][:2] / e["md5"][2:] for e in json.loads(listing.read_text())]
    return [*(root / "data/merged").rglob("*"), listing, *objects]


def growth(root: Path, before: dict[int, int]) -> dict[str, int]:
    """Bytes the round added: on the whole (workspace + cache: completions, tokenized rows, the drafter, ...) and for
    the merged set alone (the data version the next round builds on: new inodes among its files and cache objects)."""
    after = inodes(root)
    merged = {st.st_ino: st.st_size for st in (f.stat() for f in merged_files(root) if f.is_file())}
    return {"all": sum(b for i, b in after.items() if i not in before),
            "merged": sum(b for i, b in merged.items() if i not in before)}


def figures(root: Path) -> dict[str, Any]:
    """Acceptance per setting (held-out and per source), tau, train steps, generation's drafter figures."""
    settings = json.loads((root / "reports/eval.json").read_text())["splits"][SPLIT]
    generate = json.loads((root / "reports/generate.json").read_text())
    out: dict[str, Any] = {"steps": json.loads((root / "metrics/train.json").read_text())["steps"],
                           "generation": generate.get("speculative")}
    for name, s in settings.items():
        out[name] = {"acceptance": s["per_set"]["heldout"]["acceptance"], "tau": s["per_set"]["heldout"]["tau"],
                     "per_source": {k: v["acceptance"] for k, v in s["per_source"].items()}}
    return out


def base_ids(root: Path) -> set[str]:
    """The prompt ids of round 1's merged set (a row's id is its prompt's)."""
    from draftline.core.dataset import mapped_shards, verified_shard_files

    folder = root / "data/bases/round1"
    return {i for t in mapped_shards(folder, verified_shard_files(folder)[1]) for i in t.column("id").to_pylist()}


def picked_again(root: Path, base: set[str]) -> int:
    prompts = [json.loads(x)["id"] for x in (root / "data/prompts/train.jsonl").read_text().splitlines()]
    return sum(p in base for p in prompts)


def keep_round1(root: Path, env: dict[str, str]) -> None:
    """The README's steps: round 1's merged set and drafter become tracked inputs, the version is tagged and pushed."""
    for src, dst in (("data/merged", "data/bases/round1"), ("data/checkpoints", "data/drafters/round1")):
        run(["cp", "-rl", src, dst], root, env)
        run(["dvc", "add", dst], root, env)
    shutil.copy(root / "reports/eval.json", root / "data/drafters/round1.eval.json")
    run(["dvc", "remote", "add", "-d", "local", str(root.parent / f"{root.name}-remote")], root, env)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "round 1"], root, env)
    run(["git", "tag", "round1"], root, env)
    run(["dvc", "push", "-q"], root, env)


def round2(root: Path, env: dict[str, str], total: int, steps: int, warm: bool) -> dict[str, Any]:
    """One round 2 as a ``dvc exp run`` on top of round 1: its figures, new-prompt and growth counts; the workspace
    is put back to round 1 afterwards."""
    sets = ["-S", "merge.base=data/bases/round1", "-S", f"blend.total={total}", "-S", f"train.max_steps={steps}"]
    if warm:
        sets += ["-S", "train.init_from=data/drafters/round1", "-S", "generate.draft_model=data/drafters/round1",
                 "-S", "blend.steer={eval: data/drafters/round1.eval.json, setting: sampled, strength: 1.0}"]
    before = inodes(root)
    t0 = time.perf_counter()
    run(["dvc", "exp", "run", *sets], root, env, timeout=7200)
    out = figures(root)
    out["seconds"] = round(time.perf_counter() - t0)
    # The round's new rows: the merged set's shards that are not the base's (carried ones share its inodes).
    base = {p.stat().st_ino for p in (root / "data/bases/round1").glob("*.arrow")}
    new_shards = sum(p.stat().st_size for p in (root / "data/merged").glob("*.arrow") if p.stat().st_ino not in base)
    out["new_shard_bytes"] = new_shards
    out["growth"] = {k: round(v / new_shards, 3) for k, v in growth(root, before).items()} if new_shards else None
    out["picked_again"] = picked_again(root, base_ids(root))
    run(["git", "checkout", "--", "."], root, env)
    run(["dvc", "checkout", "--force", "-q"], root, env)
    return out


def measure(seed: int, round1_total: int, total: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"rounds-seed{seed}-"))
    try:
        env = make_project(root, {"target": {"seed": seed}, "blend": {"total": round1_total}})
        run(["dvc", "repro"], root, env, timeout=7200)
        r1 = figures(root)
        merged, drafter = digest(root / "data/merged"), digest(root / "data/checkpoints")
        keep_round1(root, env)
        runs = {"round 1": r1,
                "round 2 warm + steered": round2(root, env, total, r1["steps"], warm=True),
                "round 2 warm + steered, 1/3 steps": round2(root, env, total, r1["steps"] // 3, warm=True),
                "round 2 cold": round2(root, env, total, r1["steps"], warm=False)}
        run(["git", "checkout", "-q", "round1"], root, env)
        run(["dvc", "checkout", "--force", "-q"], root, env)
        restored = digest(root / "data/merged") == merged and digest(root / "data/checkpoints") == drafter
        return {"seed": seed, "round1_total": round1_total, "round2_total": total, "runs": runs, "restored": restored}
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(root.parent / f"{root.name}-remote", ignore_errors=True)


def report(r: dict[str, Any]) -> str:
    runs = r["runs"]
    r1 = runs["round 1"]
    rows = [[f"{s} acceptance (tau)"] + [f"{x[s]['acceptance']:.2f} ({x[s]['tau']:.2f})" for x in runs.values()]
            for s in ("greedy", "sampled")]
    rows.append(["reaches round 1's tau, greedy / sampled"] + ["-"] + [
        f"{x['greedy']['tau'] >= r1['greedy']['tau']} / {x['sampled']['tau'] >= r1['sampled']['tau']}"
        for x in list(runs.values())[1:]])
    for source in sorted(r1["sampled"]["per_source"]):
        rows.append([f"{source}, sampled"] + [f"{x['sampled']['per_source'].get(source, 0):.2f}" for x in runs.values()])
    weakest = {k: min(x["sampled"]["per_source"].values()) for k, x in runs.items()}
    rows.append(["weakest source, sampled (vs round 1's)"] + [
        f"{w:.2f}" + ("" if k == "round 1" else f" ({w / weakest['round 1'] - 1:+.1%})") for k, w in weakest.items()])
    rows.append(["train steps"] + [str(x["steps"]) for x in runs.values()])
    rows.append(["generation: acceptance / forwards saved"] + [
        "-" if not x.get("generation") else f"{x['generation']['acceptance']:.2f} / {x['generation']['forwards_saved']:.0%}"
        for x in runs.values()])
    later = list(runs.values())[1:]
    rows.append(["new prompts already in the base"] + ["-"] + [str(x["picked_again"]) for x in later])
    rows.append(["merged set growth (workspace + cache) / new shard byte"] + ["-"] + [
        f"{x['growth']['merged']} ({x['new_shard_bytes']} B)" for x in later])
    rows.append(["all the round's outputs (completions, rows, drafter, ...) / new shard byte"] + ["-"] + [
        str(x["growth"]["all"]) for x in later])
    rows.append(["round wall seconds"] + ["-"] + [str(x["seconds"]) for x in later])
    header = ["", *runs]
    lines = [f"seed {r['seed']}, round 1 = {r['round1_total']} prompts, round 2 = {r['round2_total']} new ones: "
             f"rollback to round 1 byte-identical: "
             f"{r['restored']}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--round1-total", type=int, default=ROUND1_TOTAL, help="round 1's blend.total (shipped: 1200)")
    ap.add_argument("--round2-total", type=int, default=ROUND2_TOTAL, help="new prompts in round 2")
    args = ap.parse_args()
    for seed in args.seeds:
        result = measure(seed, args.round1_total, args.round2_total)
        print(json.dumps(result), flush=True)
        print(report(result), flush=True)


if __name__ == "__main__":
    main()
