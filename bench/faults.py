"""Fault campaign: kill every stage with SIGKILL at seeded random points, rerun ``dvc repro``, compare with a clean run.

On the embedded default shrunk as the pipeline test shrinks it (tests/project_clone.py; training 120 steps with a
state every 20, so that kills land between states), in a temporary git + DVC clone of this repository:

1. ``dvc repro`` once: the reference outputs;
2. per stage, one forced uninterrupted rerun (``dvc repro -f -s <stage>``), timed: it must reproduce the reference
   bytes, and its time places the kills;
3. per stage and fault, the same forced rerun killed (the whole process group: DVC and the stage) at a seeded
   random fraction of the stage script's own time, then the forced rerun again, uninterrupted (a plain
   ``dvc repro`` would check the reference outputs out of DVC's cache without running the stage: the stage's own
   recovery is what is tested), then ``dvc repro``, which must find nothing to run. The outputs are compared, file
   by file and row by row, with the reference.

A stage's scratch (the generation journal, the training states) is emptied before each of its runs, so a kill
lands in real work rather than in a resume of the reference run's. It prints one row per stage: faults injected
(kills that landed while the stage ran), reruns that completed, outputs identical, rows lost and rows duplicated
(summed over every output of the pipeline: JSON lines, Arrow rows by id, Parquet rows), and how the rerun resumed
(generate: results taken from the journal; train: the step it resumed from, which must be the last state saved).

    python bench/faults.py                      # every stage, 3 faults each (about 25 minutes on 2 cores)
    python bench/faults.py --stages generate,train --faults 2
"""

from __future__ import annotations

import sys
from pathlib import Path

# The temporary-clone helpers are the pipeline test's.
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))

import argparse  # noqa: E402
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from project_clone import SHRINK, make_project, ran, run

STAGES = ("sources", "conversations", "target", "prompts", "generate", "tokenize", "merge", "train", "evaluate")
# Where a stage keeps progress between runs (core.scratch): emptied before each of its runs.
SCRATCH = {"generate": "generate", "train": "train"}
CAMPAIGN = {"train": {"max_steps": 120, "save_every": 20}}


def stage_names(root: Path) -> dict[str, str]:
    """Each campaign stage's DVC name; a foreach group is represented by its first entry."""
    names = list(yaml.safe_load((root / "dvc.lock").read_text())["stages"])
    return {s: next(n for n in names if n == s or n.startswith(f"{s}@")) for s in STAGES}


def outputs(root: Path) -> list[Path]:
    """Every ``outs`` path of the pipeline: the data, the metrics and the reports (byte-identical between runs of the
    same inputs on one machine; the run files, which carry times, are not outputs)."""
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    return sorted({root / o["path"] for s in lock.values() for o in s.get("outs", [])
                   if o["path"].startswith(("data/", "metrics/", "reports/"))})


def file_digests(paths: list[Path], root: Path) -> dict[str, str]:
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*")) if p.exists() else [])]
    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.is_file()}


def differing(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def rows(paths: list[Path]) -> Counter:
    """A multiset of the rows the outputs hold: JSON lines by content, Arrow rows by id, Parquet rows by content."""
    out: Counter = Counter()
    for p in paths:
        for f in ([p] if p.is_file() else sorted(p.rglob("*")) if p.exists() else []):
            tag = str(f.parent.name)
            if f.suffix == ".jsonl":
                out.update(f"{tag}:{hashlib.sha1(line).hexdigest()}" for line in f.read_bytes().splitlines())
            elif f.suffix == ".arrow":
                table = pa.ipc.open_stream(pa.memory_map(str(f))).read_all()
                if "id" in table.column_names:
                    out.update(f"{tag}:{i}" for i in table.column("id").to_pylist())
            elif f.suffix == ".parquet":
                out.update(f"{tag}:{json.dumps(r, sort_keys=True, default=str)}" for r in pq.read_table(f).to_pylist())
    return out


def clear_scratch(root: Path, stage: str) -> None:
    if stage in SCRATCH:
        shutil.rmtree(root / ".draftline" / "cache" / SCRATCH[stage], ignore_errors=True)


def states(root: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in (root / ".draftline/cache/train").glob("*/state-*.pt"))


def journaled(root: Path) -> int:
    return sum(p.read_bytes().count(b'"status":"ok"') for p in (root / ".draftline/cache/generate").glob("*/journal.jsonl"))


def stage_running(pid: int) -> bool:
    """Whether the DVC process ``pid`` has a stage script running under it (``python stages/<stage>.py``)."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return False
    for k in kids:
        try:
            if any(a.startswith("stages/") for a in k.cmdline()):
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


def run_stage(cmd: list[str], root: Path, env: dict[str, str], kill_after: float | None = None) -> tuple[float, bool]:
    """Run ``cmd`` (a DVC command running one stage) in its own process group. Returns how long the stage script
    itself ran (DVC's start-up and caching excluded) and whether it was killed: with ``kill_after``, the whole group
    gets SIGKILL that many seconds after the stage script started."""
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    started = ended = None
    while proc.poll() is None:
        now = time.monotonic()
        running = stage_running(proc.pid)
        if running and started is None:
            started = now
        elif not running and started is not None and ended is None:
            ended = now
        if started is not None and kill_after is not None and now - started >= kill_after and ended is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return now - started, True
        time.sleep(0.02)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed: {proc.stderr.read()[-4000:]}")
    end = ended or time.monotonic()
    return (end - started) if started is not None else 0.0, False


def resumed_note(stage: str, name: str, root: Path, log: str, before: dict[str, Any]) -> str:
    if name not in ran(log):
        return "the rerun did not run it"
    if stage == "train":
        saved = before["states"]
        line = next((ln for ln in log.splitlines() if "resuming from step" in ln), "")
        got = int(line.split("resuming from step")[1].split()[0]) if line else 0
        expect = max(saved) if saved else 0
        return f"step {got} (last state {expect})" + ("" if got == expect else " MISMATCH")
    if stage == "generate":
        run_ = json.loads((root / "reports/generate.run.json").read_text())
        return f"{run_['resumed']} from journal ({before['journaled']} journaled)"
    return ""


def campaign(root: Path, env: dict[str, str], stages: list[str], faults: int, seed: int) -> list[dict[str, Any]]:
    t0 = time.monotonic()
    run(["dvc", "repro"], root, env)
    print(f"reference dvc repro: {time.monotonic() - t0:.0f} s", flush=True)
    outs = outputs(root)
    ref_files, ref_rows = file_digests(outs, root), rows(outs)
    names = stage_names(root)
    rng = random.Random(seed)
    table = []
    for stage in stages:
        name = names[stage]
        clear_scratch(root, stage)
        clean_s, _ = run_stage(["dvc", "repro", "-f", "-s", name], root, env)
        changed = differing(file_digests(outs, root), ref_files)
        assert not changed, f"a clean forced rerun of {name} changed {changed}: the stage is not deterministic here"
        row = {"stage": name, "clean_s": round(clean_s, 1), "injected": 0, "completed": 0, "identical": 0,
               "rows_lost": 0, "rows_duplicated": 0, "resumed": []}
        for _ in range(faults):
            at = rng.uniform(0.05, 0.95) * clean_s
            for _attempt in range(3):  # a stage faster than its clean run (a quieter machine) ends first: earlier
                clear_scratch(root, stage)
                _, injected = run_stage(["dvc", "repro", "-f", "-s", name], root, env, kill_after=at)
                if injected:
                    break
                at /= 2
            before = {"states": states(root), "journaled": journaled(root) if stage == "generate" else 0}
            row["injected"] += injected
            try:
                # Forced: a plain `dvc repro` would check the reference outputs out of DVC's cache (the lock still
                # matches the deps) instead of running the stage, and the stage's own recovery is what is tested.
                log = run(["dvc", "repro", "-f", "-s", name], root, env)
                after = run(["dvc", "repro"], root, env)
                if ran(after):
                    raise AssertionError(f"after the rerun, dvc repro ran {sorted(ran(after))} again")
                row["completed"] += 1
            except AssertionError as e:
                print(f"  {name}: rerun after a kill at {at:.1f} s failed:\n{e}", flush=True)
                continue
            got_files, got_rows = file_digests(outs, root), rows(outs)
            row["identical"] += got_files == ref_files
            row["rows_lost"] += sum((ref_rows - got_rows).values())
            row["rows_duplicated"] += sum((got_rows - ref_rows).values())
            if injected and (note := resumed_note(stage, name, root, log, before)):
                row["resumed"].append(note)
            print(f"  {name}: killed {at:.1f} s into its {clean_s:.1f} s" + ("" if injected else " (it had ended)")
                  + f", rerun identical: {got_files == ref_files}", flush=True)
        table.append(row)
    return table


def print_table(table: list[dict[str, Any]]) -> None:
    head = ("stage", "stage s", "faults injected", "reruns completed", "outputs identical", "rows lost",
            "rows duplicated", "resumed")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in table:
        cells = (r["stage"], r["clean_s"], r["injected"], r["completed"], r["identical"], r["rows_lost"],
                 r["rows_duplicated"], "; ".join(r["resumed"]) or "-")
        print("| " + " | ".join(str(c) for c in cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated, from: " + ", ".join(STAGES))
    ap.add_argument("--faults", type=int, default=3, help="kills per stage")
    ap.add_argument("--seed", type=int, default=0, help="seeds where the kills land")
    ap.add_argument("--keep", type=Path, help="build the clone here and keep it (default: a temporary folder)")
    ap.add_argument("--json", type=Path, help="also write the table as JSON here")
    args = ap.parse_args()
    stages = args.stages.split(",")
    unknown = set(stages) - set(STAGES)
    if unknown:
        ap.error(f"unknown stage(s) {sorted(unknown)}; choose from {', '.join(STAGES)}")
    with tempfile.TemporaryDirectory(prefix="draftline-faults-") as tmp:
        root = args.keep or Path(tmp) / "project"
        root.mkdir(parents=True, exist_ok=True)
        env = make_project(root, SHRINK, CAMPAIGN)
        table = campaign(root, env, stages, args.faults, args.seed)
    print_table(table)
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
    main()
