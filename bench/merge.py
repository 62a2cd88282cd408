"""Benchmark the merge stage: does a merge cost what the new data costs?

Builds a base of 1M rows and 200K new rows (1% of them repeating base prompts) of synthetic but genuine token
ids (real texts encoded by the target tokenizer, so the re-encode guard runs on real data), then prints, measured
side by side in this run (repetitions alternate, medians reported):

  merge time / time to write the new shards alone          (target <= 1.5)
    for merge.carry auto (a reflink, or here on ext4 a hardlink) and for copy (what a base costs when it
    must be copied: it grows with the base, not with the new data)
  DVC cache growth from the merge / the new shards' bytes  (target <= 1.1)

Each timed step starts after ``os.sync()``, so none pays for the previous one's disk writeback. ``--scale 0.05``
runs in a minute or two.

    python bench/merge.py --scale 0.05
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, and its tokenize.py would shadow the standard library's
# tokenize module for everything imported below: take bench/ off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from draftline.core import dataset as fmt  # noqa: E402
from draftline.core.files import write_json  # noqa: E402
from draftline.core.params import load_section  # noqa: E402
from draftline.core.runner import execute  # noqa: E402
from draftline.merge.params import MergeParams  # noqa: E402
from draftline.merge.stage import MergeArgs, run_merge  # noqa: E402
from draftline.target.describe import describe_target  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SOURCES = ["infinity_instruct", "webinstructsub", "codefeedback", "metamathqa", "hermes_fc", "agent", "http_traces"]
CHUNK_ROWS = 50_000


def make_pool(tok, size: int, mean_words: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``size`` real encoded chat rows: (offsets, ids, mask) to tile the synthetic datasets from."""
    rng = random.Random(seed)
    words = [w for w in tok.get_vocab() if w.isalpha() and w.isascii() and len(w) > 2][:5000]
    texts, cuts = [], []
    for _ in range(size):
        q = " ".join(rng.choice(words) for _ in range(rng.randint(5, mean_words // 2)))
        a = " ".join(rng.choice(words) for _ in range(rng.randint(mean_words // 2, mean_words * 3 // 2)))
        prompt = f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
        texts.append(prompt + a + "<|im_end|>\n")
        cuts.append(len(prompt))
    enc = tok(texts, add_special_tokens=False, return_offsets_mapping=True)
    ids = [np.array(x, np.int32) for x in enc["input_ids"]]
    mask = [np.array([s >= c for s, _ in off], bool) for off, c in zip(enc["offset_mapping"], cuts)]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in ids])])
    return offsets, np.concatenate(ids), np.concatenate(mask)


def tables(pool, row_ids: list[str], seed: int):
    """Rows ``row_ids``, each a random pool row, in chunks of pyarrow tables."""
    p_off, p_ids, p_mask = pool
    rng = np.random.default_rng(seed)
    for start in range(0, len(row_ids), CHUNK_ROWS):
        ids = row_ids[start : start + CHUNK_ROWS]
        pick = rng.integers(0, len(p_off) - 1, len(ids))
        lengths = p_off[pick + 1] - p_off[pick]
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        gather = np.repeat(p_off[pick] - offsets[:-1], lengths) + np.arange(offsets[-1])
        sources = [SOURCES[i] for i in rng.integers(0, len(SOURCES), len(ids))]
        yield fmt.build_table(ids, sources, offsets, p_ids[gather], p_mask[gather])


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def timed(fn) -> tuple[float, float]:
    """Wall seconds and CPU seconds (this process and the children it waited for, e.g. the re-encode check)."""
    def cpu() -> float:
        return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))

    t, c = time.perf_counter(), cpu()
    fn()
    return time.perf_counter() - t, cpu() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of 1M base / 200K new rows")
    ap.add_argument("--mean-words", type=int, default=200, help="words per reply on average (~300 tokens per row)")
    ap.add_argument("--tokenizer", default=str(REPO.parent / "shared/fixtures/qwen3-tokenizer"))
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions of each side (median reported)")
    ap.add_argument("--workdir", default=None, help="where to build the datasets (default: a temporary folder)")
    args = ap.parse_args()
    n_base, n_new = int(1_000_000 * args.scale), int(200_000 * args.scale)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-merge-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        from transformers import AutoTokenizer

        # Saved with tokenizer.json, as real checkpoints ship it (fast to load).
        AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True).save_pretrained(work / "tok")
        info = describe_target(work / "tok")
        write_json(work / "target/target.json", info.to_dict())
        tok = AutoTokenizer.from_pretrained(work / "tok", local_files_only=True)
        pool = make_pool(tok, 4096, args.mean_words, seed=0)
        meta = fmt.DatasetMeta(
            tokenizer_fingerprint=info.tokenizer_fingerprint, chat_template_sha256=info.chat_template_sha256,
            enable_thinking=False, max_len=3072, mask_token_id=info.mask_token_id,
            end_of_turn_token_id=info.end_of_turn_token_id,
        )  # fmt: skip
        print(f"building {n_base:,} base rows and {n_new:,} new rows in {work} ...", flush=True)
        base_meta = fmt.write_dataset(work / "bases/r1", tables(pool, [f"b{i}" for i in range(n_base)], 1), replace(meta))
        repeat = n_new // 100
        new_ids = [f"b{i}" for i in range(0, n_base, max(1, n_base // repeat))][:repeat]
        new_ids += [f"n{i}" for i in range(n_new - len(new_ids))]
        fmt.write_dataset(work / "tokenized", tables(pool, new_ids, 2), replace(meta))

        # The new rows the merge keeps, in memory, for the baseline: write them as a dataset of their own.
        new_table = fmt.load(work / "tokenized").data.table
        kept = new_table.filter(pc.invert(pc.is_in(new_table.column("id"), value_set=pa.array(new_ids[:repeat]))))

        def write_new() -> None:
            fmt.write_dataset(work / "new_only", [kept], replace(meta))

        def merge(name: str, **params) -> None:
            defaults = load_section("merge", REPO / "params.yaml")
            params = MergeParams.parse({**defaults, "base": str(work / "bases/r1"), **params}, "merge")
            args = MergeArgs(tokenized=work / "tokenized", target=work / "target/target.json", out=work / f"merged-{name}",
                             metrics=work / f"m-{name}.json", report=work / f"report-{name}.json",
                             plot=work / f"mix-{name}.csv", bases=work / "bases")
            execute("merge", run_merge, params, args)

        steps = {
            "write the new shards alone": write_new,
            "merge, carry auto": lambda: merge("auto"),
            "merge, carry auto, check_rows 0": lambda: merge("nocheck", check_rows=0),
            "merge, carry copy": lambda: merge("copy", carry="copy"),
        }
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in steps}
        for _ in range(args.reps):
            for name, step in steps.items():
                os.sync()
                runs[name].append(timed(step))
        wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
        metrics = json.loads((work / "report-auto.json").read_text())
        carried_by = metrics["carried_by"]
        (work / "merged-auto").rename(work / "merged")
        for name in ("nocheck", "copy"):
            shutil.rmtree(work / f"merged-{name}")

        # DVC: the base is tracked first (as it is in a project); then the merged output.
        dvc = str(Path(sys.executable).with_name("dvc"))
        env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
        subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=work, check=True, env=env)
        subprocess.run([dvc, "add", "-q", "bases/r1"], cwd=work, check=True, env=env)
        before = folder_bytes(work / ".dvc/cache")
        subprocess.run([dvc, "add", "-q", "merged"], cwd=work, check=True, env=env)
        growth = folder_bytes(work / ".dvc/cache") - before
        merged_files = fmt.shard_files(work / "merged")
        new_bytes = sum((work / "merged" / f).stat().st_size for f in merged_files[len(base_meta.shards) :])

        base_bytes = sum(s.num_bytes for s in base_meta.shards)
        print(f"base: {n_base:,} rows, {base_meta.num_tokens:,} tokens, {base_bytes / 1e9:.2f} GB in {len(base_meta.shards)} shards")
        print(f"new: {n_new:,} rows, {metrics['overlap']['dropped']:,} dropped as already in the base; "
              f"new shards {new_bytes / 1e6:.1f} MB")  # fmt: skip
        base_wall = wall["write the new shards alone"]
        print(f"medians of {args.reps} alternating runs (carry auto did: {carried_by}; cpu includes child processes):")
        for name in steps:
            print(f"  {name:32s} wall {wall[name]:6.2f} s   cpu {cpu[name]:6.2f} s   "
                  f"wall / new-shard write {wall[name] / base_wall:5.2f}   all walls: "
                  + " ".join(f"{w:.2f}" for w, _ in runs[name]))  # fmt: skip
        print(f"merge time / new-shard write time = {wall['merge, carry auto'] / base_wall:.2f}   (target <= 1.5)")
        print(f"DVC cache growth / new data bytes = {growth / new_bytes:.3f}   (target <= 1.1; "
              f"{growth / 1e6:.1f} MB for {new_bytes / 1e6:.1f} MB)")  # fmt: skip
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
