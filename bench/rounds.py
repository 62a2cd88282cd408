"""Rounds that feed each other, on the embedded default: the README's round sequence, measured arm by arm.

Per target seed, in a temporary git + DVC clone of this repository (tests/project_clone.py):

1. **round 1**: ``dvc repro`` as shipped but for ``blend.total`` (``--round1-total``, see ROUND1_TOTAL); its merged
   set, drafter and evaluation kept as the README says (``data/bases/round1``, ``data/drafters/round1`` and its
   ``eval.json``), committed, tagged ``round1`` and pushed to a local DVC remote;
2. **round 2, one arm at a time** (ARMS), each a ``dvc exp run`` on round 1's merged set (``merge.base``) with the
   same budget: ``--round2-total`` new prompts and round 1's train steps. ``cold``: nothing of round 1 but its data;
   ``warm``: ``train.init_from`` and ``generate.draft_model`` = round 1's drafter; ``steered``: the blend steered by
   round 1's evaluation (``blend.steer``, which reads its ``dev`` split); ``warm + steered``: both. The drafter in
   generation changes how many target forwards a reply costs, not what the replies are drawn from (verification is
   lossless), and it is not part of generation's journal key: an arm after ``cold`` with the same prompts reads
   ``cold``'s journal (no request is sent, so it reports no drafter figures), and ``warm`` differs from ``cold`` by
   ``train.init_from`` alone, its replies byte-identical (its merged set grows by a few KB of metadata);
   ``--third`` adds ``warm + steered`` at a third of the steps (does a warm start reach round 1's tau sooner?);
3. rollback: ``git checkout round1 && dvc checkout`` gives round 1's merged set and drafter back byte-identical.

It prints, per seed, every arm's z-lab acceptance on the ``test`` split (never read by a decision), greedy and
sampled, overall and per source, with the evaluate stage's 95% interval; the target forwards saved in generation;
new prompts picked that were already in the base; how much the merged set grew per new shard byte; whether the
rollback restored round 1 byte for byte. Then, pooled over the seeds, each arm minus ``cold`` on the same test
requests (a seeded paired bootstrap over the seeds, then their requests: ``draftline.core.intervals.compare_seeds``),
overall and on each seed's weakest source by round 1's ``dev`` figure (the source steering is for).

    nice -n 10 python bench/rounds.py --seeds 0 --out /tmp/rounds-seed0.json   # about 50 minutes a seed
    python bench/rounds.py --pool /tmp/rounds-seed*.json                        # the pooled table
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

# The embedded samples hold 2,514 train prompts after the eval split (reports/prompts.json). Round 1 at 600 (not
# the shipped 1,200) leaves every source rows for round 2 to choose from, steered or not.
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
    """Per setting on the test split: acceptance with its interval, tau, per source, and every request's figure
    (for the pooled paired comparison); the dev split's per-source figures (what picks the weakest source); train
    steps and generation's drafter figures."""
    from draftline.core.intervals import request_acceptance

    report = json.loads((root / "reports/eval.json").read_text())["splits"]
    with open(root / "plots/eval_steps.jsonl", encoding="utf-8") as f:
        steps = [json.loads(line) for line in f]
    generate = json.loads((root / "reports/generate.json").read_text())
    out: dict[str, Any] = {"steps": json.loads((root / "metrics/train.json").read_text())["steps"],
                           "generation": generate.get("speculative"),
                           "generated_tokens": generate.get("output_tokens")}
    for name, s in report[SPLIT].items():
        heldout = s["per_set"]["heldout"]
        out[name] = {"acceptance": heldout["acceptance"], "ci": heldout["acceptance_ci"], "tau": heldout["tau"],
                     "per_source": {k: v["acceptance"] for k, v in s["per_source"].items()},
                     "dev_per_source": {k: v["acceptance"] for k, v in report["dev"][name]["per_source"].items()},
                     "requests": request_acceptance(steps, name, split=SPLIT)}
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


# What each arm takes from round 1 (``dvc exp run -S`` values); every arm also has round 1's merged set as its base.
WARM = ("train.init_from=data/drafters/round1", "generate.draft_model=data/drafters/round1")
STEER = ("blend.steer={eval: data/drafters/round1.eval.json, setting: sampled, strength: 1.0}",)
ARMS = {"cold": (), "warm": WARM, "steered": STEER, "warm + steered": WARM + STEER}
DEFAULT_ARMS = ["cold", "warm", "steered", "warm + steered"]


def round2(root: Path, env: dict[str, str], total: int, steps: int, sets: tuple[str, ...]) -> dict[str, Any]:
    """One round 2 as a ``dvc exp run`` on top of round 1: its figures, new-prompt and growth counts; the workspace
    is put back to round 1 afterwards."""
    args = ["merge.base=data/bases/round1", f"blend.total={total}", f"train.max_steps={steps}", *sets]
    before = inodes(root)
    t0 = time.perf_counter()
    run(["dvc", "exp", "run", *(x for a in args for x in ("-S", a))], root, env, timeout=7200)
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


def measure(seed: int, round1_total: int, total: int, third: bool, arms: list[str]) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"rounds-seed{seed}-"))
    try:
        env = make_project(root, {"target": {"seed": seed}, "blend": {"total": round1_total}})
        run(["dvc", "repro"], root, env, timeout=7200)
        r1 = figures(root)
        merged, drafter = digest(root / "data/merged"), digest(root / "data/checkpoints")
        keep_round1(root, env)
        runs = {"round 1": r1}
        for arm in arms:
            runs[arm] = round2(root, env, total, r1["steps"], ARMS[arm])
        if third:
            runs["warm + steered, 1/3 steps"] = round2(root, env, total, r1["steps"] // 3, WARM + STEER)
        run(["git", "checkout", "-q", "round1"], root, env)
        run(["dvc", "checkout", "--force", "-q"], root, env)
        restored = digest(root / "data/merged") == merged and digest(root / "data/checkpoints") == drafter
        return {"seed": seed, "round1_total": round1_total, "round2_total": total, "runs": runs, "restored": restored}
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(root.parent / f"{root.name}-remote", ignore_errors=True)


def weakest(r1: dict[str, Any], setting: str) -> str:
    """Round 1's weakest source on the dev split: the one steering is for (read from dev, as any decision is)."""
    dev = r1[setting]["dev_per_source"]
    return min(dev, key=dev.get)


def report(r: dict[str, Any]) -> str:
    """One seed: every arm's test figures (with the evaluate stage's interval) and its bookkeeping."""
    runs = r["runs"]
    r1 = runs["round 1"]
    rows = [[f"{s}, test (95% interval)"] + [f"{x[s]['acceptance']:.2f} [{x[s]['ci'][0]:.2f}, {x[s]['ci'][1]:.2f}]"
                                            for x in runs.values()] for s in ("greedy", "sampled")]
    rows.append(["tau greedy / sampled"] + [f"{x['greedy']['tau']:.2f} / {x['sampled']['tau']:.2f}"
                                            for x in runs.values()])
    for source in sorted(r1["sampled"]["per_source"]):
        rows.append([f"{source}, greedy / sampled"] + [
            f"{x['greedy']['per_source'].get(source, 0):.2f} / {x['sampled']['per_source'].get(source, 0):.2f}"
            for x in runs.values()])
    rows.append(["train steps"] + [str(x["steps"]) for x in runs.values()])
    rows.append(["tokens generated"] + [str((x.get("generated_tokens") or {}).get("total", "-")) for x in runs.values()])
    rows.append(["generation: acceptance / forwards saved"] + [
        "-" if not x.get("generation") else f"{x['generation']['acceptance']:.2f} / {x['generation']['forwards_saved']:.0%}"
        for x in runs.values()])
    later = list(runs.values())[1:]
    rows.append(["new prompts already in the base"] + ["-"] + [str(x["picked_again"]) for x in later])
    rows.append(["merged set growth (workspace + cache) / new shard byte"] + ["-"] + [
        f"{x['growth']['merged']} ({x['new_shard_bytes']} B)" for x in later])
    rows.append(["round wall seconds"] + ["-"] + [str(x["seconds"]) for x in later])
    header = ["", *runs]
    lines = [f"seed {r['seed']}, round 1 = {r['round1_total']} prompts, round 2 = {r['round2_total']} new ones; "
             f"round 1's weakest source on dev (sampled): {weakest(r1, 'sampled')}; rollback to round 1 "
             f"byte-identical: {r['restored']}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def requests(result: dict[str, Any], arm: str, setting: str, only_weakest: bool) -> dict[str, tuple[str, float]]:
    """An arm's per-request test figures keyed ``<seed>/<request>``, or those of the seed's weakest source (the one
    steering is for: by the sampled dev figure, as STEER reads it, whichever setting is compared)."""
    src = weakest(result["runs"]["round 1"], "sampled")
    return {f"{result['seed']}/{k}": v for k, v in result["runs"][arm][setting]["requests"].items()
            if not only_weakest or v[0] == src}


def pooled(results: list[dict[str, Any]], baseline: str = "cold", resamples: int = 10_000) -> str:
    """Each arm minus ``baseline``, paired over the same test requests of every seed, overall and on each seed's
    weakest source (round 1's dev figure), greedy and sampled; the interval resamples the seeds, then their
    requests."""
    from draftline.core.intervals import compare_seeds

    arms = [a for a in results[0]["runs"] if a not in ("round 1", baseline) and all(a in r["runs"] for r in results)]
    header = [f"arm minus {baseline}",
              *(f"{s}, {w}" for s in ("greedy", "sampled") for w in ("overall", "weakest source"))]
    rows = []
    for arm in arms:
        cells = []
        for setting in ("greedy", "sampled"):
            for only in (False, True):
                a = [requests(r, arm, setting, only) for r in results]
                b = [requests(r, baseline, setting, only) for r in results]
                iv = compare_seeds(a, b, None, resamples, 0.95, 0)
                cells.append(f"{iv.estimate:+.2f} [{iv.low:+.2f}, {iv.high:+.2f}] (n={iv.n})")
        rows.append([arm, *cells])
    seeds = ", ".join(str(r["seed"]) for r in results)
    lines = [f"Pooled over target seeds {seeds} (test split, {resamples} resamples of seeds then requests, 95%):", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def merge_seeds(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per seed: the arms of every run of that seed together. Runs of one seed must agree on round 1
    (the same params and inputs give the same figures), else pooling them would pair different rounds."""
    def measured(r1: dict[str, Any]) -> dict[str, Any]:
        return {k: v["requests"] for k, v in r1.items() if isinstance(v, dict) and "requests" in v}

    by_seed: dict[int, dict[str, Any]] = {}
    for r in results:
        have = by_seed.setdefault(r["seed"], {**r, "runs": {}})
        if "round 1" in have["runs"] and measured(have["runs"]["round 1"]) != measured(r["runs"]["round 1"]):
            raise SystemExit(f"seed {r['seed']}: two runs disagree on round 1; they cannot be pooled")
        have["runs"].update(r["runs"])
    return list(by_seed.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--round1-total", type=int, default=ROUND1_TOTAL, help="round 1's blend.total (shipped: 1200)")
    ap.add_argument("--round2-total", type=int, default=ROUND2_TOTAL, help="new prompts in round 2")
    ap.add_argument("--third", action="store_true", help="add warm + steered at a third of round 1's steps")
    ap.add_argument("--arms", nargs="*", default=DEFAULT_ARMS, choices=list(ARMS),
                    help="round 2's arms (every arm is compared with cold: leave it out only to pool with a file "
                         "that has it)")
    ap.add_argument("--versus", nargs="*", default=[], choices=list(ARMS),
                    help="more baselines to compare every other arm with (e.g. steered)")
    ap.add_argument("--out", type=Path, default=None, help="write the seeds' results here (JSON lines)")
    ap.add_argument("--pool", type=Path, nargs="*", default=[], help="results written by --out to pool with these")
    args = ap.parse_args()
    results = merge_seeds([json.loads(line) for f in args.pool for line in f.read_text().splitlines()])
    for seed in args.seeds if not args.pool else []:
        arms = [*(["cold"] if "cold" in args.arms else []), *(a for a in args.arms if a != "cold")]
        result = measure(seed, args.round1_total, args.round2_total, args.third, arms)
        if args.out:
            with open(args.out, "a", encoding="utf-8") as f:
                f.write(json.dumps(result) + "\n")
        print(report(result), flush=True)
        results.append(result)
    for baseline in ["cold", *args.versus] if results else []:
        if all(baseline in r["runs"] for r in results):  # else: pool these results with a file that has it
            print(pooled(results, baseline), flush=True)


if __name__ == "__main__":
    main()
