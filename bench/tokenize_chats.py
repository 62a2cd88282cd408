"""Benchmark of the tokenize stage against the raw fast tokenizer, measured side by side in one run.

    python bench/tokenize_chats.py [--quick] [--rows N] [--tokenizer PATH]

Prints:
- raw: ``tokenizer.backend_tokenizer.encode_batch`` over the stage's own rendered texts, one thread;
- the stage (``run_tokenize`` through the runner: read JSONL, render, tokenize, mask, Arrow shards, metrics) with 1 worker, and its
  ratio to raw (target >= 0.8);
- the stage with 2 workers, and the 1 -> 2 worker scaling;
- bytes per token on disk.

Each figure is the best of --rounds interleaved rounds, as wall-clock tokens/s and as tokens per CPU-second (this process plus its
worker processes): on a machine shared with other jobs the wall-clock scaling understates what the stage does,
and "CPU per token" (2 workers vs 1, ideally x1.0) shows the cost of the parallel machinery itself (each worker
warms its own tokenizer cache). The main process's CPU share says how many workers one reader can feed.

Rows are natural text (the Python standard library's source: code, docstrings, comments), cut into reasoning
chats of the reference run's lengths (mean ~2,800 tokens, p90 ~4,150, thinking on, ~1% tool calls: the workload of
bench/scale.py), with the real Qwen3 tokenizer from ../shared/fixtures by default. A small vocabulary of repeated
words tokenizes ~2x faster than natural text, so only natural text gives figures that carry over. On a machine
shared with other jobs, compare ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

# One thread per process on both sides: the comparison is per core.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from draftline.core.fingerprint import template_sha256, tokenizer_fingerprint
from draftline.core.params import load_section
from draftline.core.records import TargetInfo
from draftline.core.runner import execute
from draftline.tokenize.chunks import parse_completion, read_lines
from draftline.tokenize.loss_mask import render_example
from draftline.tokenize.params import TokenizeParams
from draftline.tokenize.stage import TokenizeArgs, run_tokenize

REPO = Path(__file__).resolve().parents[1]
DEFAULTS = load_section("tokenize", REPO / "params.yaml")
CHUNK = DEFAULTS["chunk_rows"]
DEFAULT_TOKENIZER = REPO.parent / "shared" / "fixtures" / "qwen3-tokenizer"


def write_inputs(folder: Path, rows: int, tok_dir: Path, seed: int = 0) -> tuple[Path, Path]:
    from scale import load_corpus, write_completions
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    comp = folder / "completions"
    write_completions(comp, load_corpus(tok, 2_000_000), rows, 1, seed)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    info = TargetInfo(
        path=str(tok_dir), tokenizer_fingerprint=tokenizer_fingerprint(tok_dir, tok.chat_template),
        chat_template_sha256=template_sha256(tok.chat_template), eos_token="<|im_end|>", eos_token_id=eot,
        pad_token_id=tok.pad_token_id, end_of_turn_token="<|im_end|>", end_of_turn_token_id=eot,
        think_start_token="<think>", think_end_token="</think>", mask_token_id=151656, vocab_size=len(tok),
    )  # fmt: skip
    target = folder / "target"
    target.mkdir()
    (target / "target.json").write_text(json.dumps(info.to_dict()))
    return comp, target / "target.json"


def cpu_seconds() -> tuple[float, float]:
    """CPU time of this process, and of its finished children (the stage's worker processes)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def measure(fn) -> tuple[float, float, float]:
    """(wall, cpu of this process and its workers, cpu of this process alone) seconds of one call."""
    w0, (s0, k0) = time.perf_counter(), cpu_seconds()
    fn()
    s1, k1 = cpu_seconds()
    return time.perf_counter() - w0, s1 - s0 + k1 - k0, s1 - s0


def raw_encoder(comp: Path, tok_dir: Path):
    """``(tokens, run)``: ``run`` calls encode_batch alone over the texts the stage renders (rendering done
    beforehand, not timed), in the stage's chunk size, on one thread."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    lines = read_lines(sorted(comp.glob("part-*.jsonl")))
    texts = [render_example(tok, ex)[1] for where, line in lines for ex in parse_completion(line, where, "last")[0]]
    backend = tok.backend_tokenizer
    n = sum(len(e.ids) for e in backend.encode_batch(texts, add_special_tokens=False))

    def run() -> None:
        for i in range(0, len(texts), CHUNK):
            backend.encode_batch(texts[i : i + CHUNK], add_special_tokens=False)

    return n, run


def stage_runner(comp: Path, target: Path, out: Path, workers: int, metrics: dict):
    params = TokenizeParams.parse({**DEFAULTS, "workers": workers, "max_len": 100_000}, "tokenize")
    args = TokenizeArgs(completions=comp, target=target, out=out / f"w{workers}", metrics=out / "m.json",
                        report=out / "report.json", plot=out / "p.csv")

    def run() -> None:
        metrics.update(execute("tokenize", run_tokenize, params, args).details)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="600 rows: under a minute on an idle core")
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each figure is the best round")
    args = ap.parse_args()
    rows = 600 if args.quick else args.rows
    if not (args.tokenizer / "tokenizer_config.json").is_file():
        sys.exit(f"no tokenizer at {args.tokenizer}; pass --tokenizer PATH (a Hugging Face tokenizer folder)")
    for name in ("draftline.tokenize.stage", "tokenize"):  # the stage's log and the runner's
        logging.getLogger(name).setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        comp, target = write_inputs(tmp, rows, args.tokenizer)
        n, raw = raw_encoder(comp, args.tokenizer)
        metrics: dict = {}
        runs = {"raw": raw, 1: stage_runner(comp, target, tmp, 1, metrics), 2: stage_runner(comp, target, tmp, 2, metrics)}
        # Rounds interleave the three, and each keeps its best: load from other jobs hits all of them alike.
        best = {k: (float("inf"),) * 3 for k in runs}
        for _ in range(args.rounds):
            for k, fn in runs.items():
                best[k] = tuple(map(min, best[k], measure(fn)))
    (raw_w, raw_c, _), (one_w, one_c, _), (two_w, two_c, two_main) = best["raw"], best[1], best[2]
    assert metrics["total_tokens"] == n, "the stage and the raw tokenizer saw different texts"
    print(f"rows {rows}, tokens {n} (mean {n / rows:.0f}/row), cores {os.cpu_count()}")
    print("                            tokens/s (wall)   tokens/CPU-s")
    print(f"raw encode_batch, 1 thread : {n / raw_w:12,.0f} {n / raw_c:14,.0f}")
    print(f"stage, 1 worker            : {n / one_w:12,.0f} {n / one_c:14,.0f}   "
          f"ratio to raw {raw_w / one_w:.2f} wall, {raw_c / one_c:.2f} CPU (target >= 0.80)")
    print(f"stage, 2 workers           : {n / two_w:12,.0f} {n / two_c:14,.0f}   "
          f"scaling 1 -> 2 workers x{one_w / two_w:.2f} wall; CPU per token x{two_c / one_c:.2f}")
    # The reading/writing process must keep up with every worker: its share bounds the useful number of workers.
    print(f"main process (read, write) : {two_main / two_c:.1%} of the CPU with 2 workers")
    print(f"bytes per token on disk    : {metrics['bytes_per_token']:.3f} (target <= 4.2)")


if __name__ == "__main__":
    main()
