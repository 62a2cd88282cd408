"""Scale benchmark: tokenize, merge (two rounds) and train at fractions of the reference run, side by side.

The reference run: 193K completions (545M new tokens; mean ~2,800 tokens a row, p90 ~4,150, thinking on, ~1% tool
rows) merged onto a legacy base of 902K rows / 1.87B tokens (``input_ids`` + ``loss_mask`` only, int64, as an old
script saved it). At fraction F the workload holds F of each. Per fraction, in a temporary git + DVC clone of this
repository's last commit (tests/project_clone.py) under /tmp, with the real Qwen3 tokenizer from ../shared:

1. setup (not measured): natural text (the Python standard library's own source: code, docstrings, comments),
   tokenized once; a tiny Qwen3-architecture target that carries the real tokenizer; the target stage; the legacy
   base written under data/bases/legacy and measured as it is ``dvc add``-ed;
2. round 1: completions written to data/completions, then ``dvc repro -s tokenize`` and ``dvc repro -s merge``
   onto the legacy base (rewritten once into draftline shards);
3. round 2, the README's round workflow: ``cp -rl data/merged data/bases/round1 && dvc add data/bases/round1``
   (the previous version's files linked, not copied), new completions (1% of them repeating round-1 prompts),
   tokenize, merge onto round 1's merged set (a draftline base: carried);
4. ``dvc repro -s train`` with ``train.max_steps: 1``: loads, verifies and plans every row, runs the memory
   preflight and one step.

Per measured step it prints wall and CPU seconds (``getrusage(RUSAGE_CHILDREN)``: DVC, the stage and its workers),
the peak memory of the process tree, polled from /proc every 0.1 s and summed over its processes: RSS, PSS (pages
shared by forked workers counted once) and ``anon`` (RSS without file-backed pages, i.e. without the memory-mapped
shards the kernel can drop at will), bytes written (the tree's write I/O),
DVC cache and workspace growth (distinct inodes, so a file linked into the cache counts once, as cache), and rows
in and out with the reasons for any difference; then the ratio of each figure between fractions and a linear
extrapolation to the full run. It also times raw ``encode_batch`` on the same rendered text as the stage
(bench/results/2026-12-01-tokenize-speed/ quotes both from this run).

Always run it niced (it shares the cores): ``nice -n 10 python bench/scale.py --fraction 0.01 0.1``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))

import argparse  # noqa: E402
import json
import os
import resource
import shutil
import subprocess
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import project_clone  # noqa: E402
import psutil  # noqa: E402
import pyarrow as pa  # noqa: E402
import yaml  # noqa: E402
from project_clone import make_project, run  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO.parent / "shared/fixtures/qwen3-tokenizer"
FULL = {"completions": 193_000, "new_tokens": 545e6, "base_rows": 902_000, "base_tokens": 1.87e9}
LEN_MEAN, LEN_P90 = 2800, 4150
TOOL_SHARE = 0.01
REPEAT_SHARE = 0.01  # round-2 completions that repeat a round-1 prompt id (dropped by the merge, by id)
SOURCES = ["infinity_instruct", "webinstructsub", "codefeedback", "metamathqa", "hermes_fc", "agent"]
LEGACY_SHARD_BYTES = 500 * 10**6  # datasets' save_to_disk default shard size
# The clone: train to its first step only, tapping the tiny target's layers; the target is a real folder.
CLONE_PARAMS = {"train": {"max_steps": 1, "save_every": 1, "log_every": 1, "target_layers": [1, 2]}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


# ---------------------------------------------------------------------------------------------- the workload
@dataclass
class Corpus:
    """Natural text tokenized once: ``cuts`` are token positions where a word starts after a letter token, so a
    span ``[cuts[i], cuts[j])`` decodes and re-encodes to the same ids inside a chat template."""

    text: str
    ids: np.ndarray
    char_at: np.ndarray  # character offset of each token
    cuts: np.ndarray

    def span(self, rng: np.random.Generator, tokens: int) -> tuple[int, int]:
        """About ``tokens`` tokens; redrawn where the cuts are too sparse (tables of data) to come close."""
        while True:
            i = int(rng.integers(0, len(self.cuts) // 2))
            j = max(int(np.searchsorted(self.cuts, self.cuts[i] + max(tokens, 1))), i + 1)
            if self.cuts[j] - self.cuts[i] <= 1.2 * tokens + 16:
                return int(self.cuts[i]), int(self.cuts[j])

    def words(self, rng: np.random.Generator, tokens: int) -> str:
        a, b = self.span(rng, tokens)
        return self.text[self.char_at[a] : self.char_at[b]].strip()


def load_corpus(tok: Any, max_tokens: int) -> Corpus:
    texts, n = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
        n += len(texts[-1]) // 4
        if n > max_tokens:
            break
    ids, char_at, base = [], [], 0
    for text, enc in zip(texts, tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)):
        ids.append(np.array(enc.ids, np.int32))
        char_at.append(np.array([s for s, _ in enc.offsets], np.int64) + base)
        base += len(text) + 2
    ids_all, at = np.concatenate(ids), np.concatenate(char_at)
    # Each token's own text (byte-level pieces such as "Ċ" for a newline would pass for letters).
    pieces = tok.backend_tokenizer.decode_batch([[i] for i in range(len(tok))], skip_special_tokens=False)
    starts_word = np.array([p[:1] == " " and p[1:].isascii() and p[1:].isalpha() for p in pieces])
    letters = np.array([p.lstrip(" ").isascii() and p.lstrip(" ").isalpha() for p in pieces])
    ok = np.flatnonzero(starts_word[ids_all[1:]] & letters[ids_all[:-1]]) + 1
    return Corpus("\n\n".join(texts), ids_all, at, ok)


def row_lengths(rng: np.random.Generator, n: int, mean: float) -> np.ndarray:
    """Lognormal lengths with the reference's mean and p90/mean ratio (sigma solves p90 = mean * 4150 / 2800)."""
    r = np.log(LEN_P90 / LEN_MEAN)
    sigma = 1.2816 - np.sqrt(1.2816**2 - 2 * r)
    return np.maximum(64, rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, n)).astype(np.int64)


def write_completions(folder: Path, corpus: Corpus, n: int, round_: int, seed: int) -> None:
    """``n`` completions of the reference's lengths; round 2 repeats the ids of 1% of round 1's."""
    rng = np.random.default_rng(seed)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    repeat = int(REPEAT_SHARE * n) if round_ > 1 else 0
    out = None
    for i, total in enumerate(row_lengths(rng, n, LEN_MEAN)):
        if i % 1000 == 0:
            out and out.close()
            out = open(folder / f"part-{i // 1000:05d}.jsonl", "w", encoding="utf-8")
        prompt = int(min(600, max(20, total * rng.uniform(0.03, 0.15))))
        reasoning = int((total - prompt) * rng.uniform(0.4, 0.7))
        reply = {"role": "assistant", "content": corpus.words(rng, total - prompt - reasoning - 20),
                 "reasoning_content": corpus.words(rng, reasoning)}
        tool = rng.random() < TOOL_SHARE
        if tool:
            reply["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
        rec = {"id": f"r{1 if i < repeat else round_}-{i:07d}", "source": SOURCES[i % len(SOURCES)], "row": i,
               "messages": [{"role": "user", "content": corpus.words(rng, prompt)}, reply],
               "tools": TOOLS if tool else None, "finish_reason": "tool_calls" if tool else "stop",
               "generation": {"enable_thinking": True}}
        out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    out and out.close()


def write_legacy_base(folder: Path, corpus: Corpus, tok: Any, rows: int, tokens: float, seed: int) -> None:
    """A base as an old script saved it: int64 ``input_ids`` + int64 0/1 ``loss_mask``, nothing else, in
    save_to_disk's 500 MB shards; rows are chat renders of corpus spans (real Qwen3 ids that round-trip)."""
    import datasets

    from draftline.core.dataset import write_folder_index

    features = datasets.Features({"input_ids": datasets.List(datasets.Value("int64")),
                                  "loss_mask": datasets.List(datasets.Value("int64"))})
    enc = lambda s: np.array(tok.encode(s, add_special_tokens=False), np.int64)  # noqa: E731
    head, mid = enc("<|im_start|>user\n"), enc("<|im_end|>\n<|im_start|>assistant\n")
    think, tail = enc("<think>\n"), (enc("\n</think>\n\n"), enc("<|im_end|>"))
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    files, pending, size = [], [], 0

    def flush() -> None:
        nonlocal pending, size
        offsets = np.concatenate([[0], np.cumsum([len(i) for i, _ in pending])]).astype(np.int32)
        cols = [pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate([x[k] for x in pending])))
                for k in (0, 1)]
        name = f".part-{len(files):05d}"
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, features.arrow_schema) as w:
            w.write_table(pa.Table.from_arrays(cols, schema=features.arrow_schema), max_chunksize=1000)
        files.append(name)
        pending, size = [], 0

    for total in row_lengths(rng, rows, tokens / rows):
        p = int(min(600, max(20, total * rng.uniform(0.03, 0.15))))
        spans = [corpus.span(rng, k) for k in (p, int((total - p) * 0.55), int((total - p) * 0.45))]
        prompt = np.concatenate([head, corpus.ids[slice(*spans[0])], mid])
        reply = np.concatenate([think, corpus.ids[slice(*spans[1])], tail[0], corpus.ids[slice(*spans[2])], tail[1]])
        pending.append((np.concatenate([prompt, reply]), np.r_[np.zeros(len(prompt), np.int64), np.ones(len(reply), np.int64)]))
        size += 16 * (len(prompt) + len(reply))
        if size >= LEGACY_SHARD_BYTES:
            flush()
    if pending:
        flush()
    names = [f"data-{i:05d}-of-{len(files):05d}.arrow" for i in range(len(files))]
    for old, new in zip(files, names):
        os.replace(folder / old, folder / new)
    write_folder_index(folder, names, features=features)


def make_target(folder: Path) -> None:
    """A tiny Qwen3-architecture checkpoint with the real tokenizer: train needs hidden states of a model whose
    vocabulary is the data's; its size does not matter to what this bench measures."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER), local_files_only=True)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=151_936, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=40_960,
                         tie_word_embeddings=True, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    Qwen3ForCausalLM(config).to(torch.float32).save_pretrained(folder)
    tok.save_pretrained(folder)


# ---------------------------------------------------------------------------------------------- measuring
@dataclass
class Step:
    name: str
    wall: float = 0.0
    cpu: float = 0.0
    rss: int = 0
    pss: int = 0
    anon: int = 0
    written: int = 0
    cache: int = 0
    workspace: int = 0
    rows_in: str = ""
    rows_out: str = ""
    why: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def disk(root: Path) -> tuple[int, int]:
    """(workspace bytes, DVC cache bytes) of a clone: each distinct inode once, as cache when it is in the cache."""
    cache = {st.st_ino: st.st_size for p in (root / ".dvc/cache").rglob("*") if p.is_file() for st in [p.stat()]}
    work = {}
    for p in root.rglob("*"):
        if ".git" in p.parts or ".dvc" in p.parts and "cache" in p.parts or p.is_symlink() or not p.is_file():
            continue
        st = p.stat()
        if st.st_ino not in cache:
            work[st.st_ino] = st.st_size
    return sum(work.values()), sum(cache.values())


def children_usage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime, r.ru_oublock * 512


def measured(name: str, cmd: list[str], root: Path, env: dict[str, str]) -> Step:
    """Run ``cmd`` in the clone and measure it (see the module docstring)."""
    step = Step(name)
    (w0, c0), (cpu0, out0), t0 = disk(root), children_usage(), time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = threading.Event()

    def poll() -> None:
        me = psutil.Process(proc.pid)
        while not done.is_set():
            rss = pss = anon = 0
            try:
                for p in [me, *me.children(recursive=True)]:
                    m = p.memory_full_info()
                    rss, pss, anon = rss + m.rss, pss + m.pss, anon + m.rss - m.shared
            except psutil.Error:
                pass
            step.rss, step.pss, step.anon = max(step.rss, rss), max(step.pss, pss), max(step.anon, anon)
            done.wait(0.1)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    log = proc.communicate()[0]
    done.set()
    poller.join()
    step.wall = time.perf_counter() - t0
    cpu1, out1 = children_usage()
    step.cpu, step.written = cpu1 - cpu0, out1 - out0
    w1, c1 = disk(root)
    step.workspace, step.cache = w1 - w0, c1 - c0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{log[-6000:]}")
    return step


def set_params(root: Path, section: str, **values: Any) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params[section].update(values)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def metrics(root: Path, stage: str) -> dict[str, Any]:
    """A stage's headline figures."""
    return json.loads((root / f"metrics/{stage}.json").read_text())


def stage_report(root: Path, stage: str) -> dict[str, Any]:
    """A stage's details."""
    return json.loads((root / f"reports/{stage}.json").read_text())


def tokenize_rows(step: Step, root: Path, lines: int) -> None:
    m = stage_report(root, "tokenize")
    step.rows_in, step.rows_out = f"{lines:,} completions", f"{m['samples']:,} rows"
    step.why = ", ".join(f"{k} {v}" for k, v in m["skips"].items()) or "-"
    step.extra = {"tokens": m["total_tokens"], "len_mean": m["len_mean"], "len_p90": m["len_p90"]}


def merge_rows(step: Step, root: Path) -> None:
    m = stage_report(root, "merge")
    base = m["base"]["samples"] if m["base"] else 0
    step.rows_in = f"{base:,} base + {m['new']['samples']:,} new"
    step.rows_out = f"{m['merged']['samples']:,} rows"
    o = m["overlap"]
    step.why = (f"dropped {o['dropped_by_id']} by id, {o['dropped_by_prompt_tokens']} by prompt key; base "
                f"{'carried' if m['base_shards_carried'] else 'rewritten'} ({m['carried_by']})")


# ---------------------------------------------------------------------------------------------- one fraction
def raw_encode_rate(tok: Any, completions: Path, rows: int) -> tuple[int, float]:
    """(tokens, CPU seconds) of raw ``encode_batch`` on one thread over the stage's own renders of ``rows``
    completions (rendering not timed), in the stage's chunk size."""
    from draftline.tokenize.chunks import parse_completion, read_lines
    from draftline.tokenize.loss_mask import render_example

    texts = []
    for where, line in read_lines(sorted(completions.glob("part-*.jsonl"))):
        texts += [render_example(tok, ex)[1] for ex in parse_completion(line, where, "last")[0]]
        if len(texts) >= rows:
            break
    backend, tokens, cpu = tok.backend_tokenizer, 0, time.process_time()
    for i in range(0, len(texts), 64):
        tokens += sum(len(e.ids) for e in backend.encode_batch(texts[i : i + 64], add_special_tokens=False))
    return tokens, time.process_time() - cpu


def run_fraction(f: float, work: Path, corpus: Corpus, tok: Any, target: Path) -> dict[str, Any]:
    root = work / f"project-{f:g}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    env = make_project(root, CLONE_PARAMS, {"target": {"path": str(target), "hash_weights": False}})
    dvc = str(Path(sys.executable).with_name("dvc"))
    run([sys.executable, "stages/target.py", "--conversations", "data/conversations", "--out", "data/target",
         "--metrics", "metrics/target.json", "--report", "reports/target.json", "--plot", "plots/target_loss.csv"],
        root, env)
    n_new, n_base = round(FULL["completions"] * f), round(FULL["base_rows"] * f)
    print(f"[F={f:g}] legacy base: {n_base:,} rows, ~{FULL['base_tokens'] * f / 1e6:,.0f}M tokens ...", flush=True)
    write_legacy_base(root / "data/bases/legacy", corpus, tok, n_base, FULL["base_tokens"] * f, seed=1)
    steps = [measured("legacy base: dvc add", [dvc, "add", "-q", "data/bases/legacy"], root, env)]
    steps[-1].rows_in = steps[-1].rows_out = f"{n_base:,} rows"
    rounds = {}
    for r in (1, 2):
        if r == 2:
            prep = measured("round-2 base: cp -rl + dvc add",
                            ["sh", "-c", f"cp -rl data/merged data/bases/round1 && {dvc} add -q data/bases/round1"],
                            root, env)
            prep.rows_in = prep.rows_out = f"{stage_report(root, 'merge')['merged']['samples']:,} rows"
            steps.append(prep)
        print(f"[F={f:g}] round {r}: {n_new:,} completions ...", flush=True)
        write_completions(root / "data/completions", corpus, n_new, r, seed=10 + r)
        steps.append(measured(f"tokenize r{r}", [dvc, "repro", "-s", "tokenize"], root, env))
        tokenize_rows(steps[-1], root, n_new)
        if r == 1:
            raw = raw_encode_rate(tok, root / "data/completions", 2000)
        base = "data/bases/legacy" if r == 1 else "data/bases/round1"
        set_params(root, "merge", base=base, assume_same_tokenizer=r == 1)
        steps.append(measured(f"merge r{r} ({'legacy' if r == 1 else 'draftline'} base)",
                              [dvc, "repro", "-s", "merge"], root, env))
        merge_rows(steps[-1], root)
        meta = json.loads((root / "data/merged/draftline.json").read_text())
        carried = stage_report(root, "merge")["base_shards_carried"]
        rounds[r] = sum(s["num_bytes"] for s in meta["shards"][carried:]) if carried else None
        run(["git", "add", "-A"], root, env)
        run(["git", "commit", "-qm", f"round {r}"], root, env)
    steps.append(measured("train (to step 1)", [dvc, "repro", "-s", "train"], root, env))
    t = metrics(root, "train")
    steps[-1].rows_in, steps[-1].rows_out = f"{json.loads((root / 'data/merged/draftline.json').read_text())['num_rows']:,} rows", f"{t['rows']:,} planned"
    skips = json.loads((root / "reports/train.json").read_text())["skips"]  # by reason: the report's, not the metrics'
    steps[-1].why = ", ".join(f"{k} {v}" for k, v in skips.items()) or "-"
    r2 = [s for s in steps if s.name.startswith(("round-2 base", "merge r2"))]
    tok_step = next(s for s in steps if s.name == "tokenize r1")
    return {"steps": steps, "round2_new_bytes": rounds[2],
            "round2_growth": sum(s.cache + s.workspace for s in r2),
            "raw_encode": raw, "tokenize_tokens": tok_step.extra["tokens"], "tokenize_cpu": tok_step.cpu,
            "tokenize_wall": tok_step.wall}


# ---------------------------------------------------------------------------------------------- printing
def fmt_bytes(b: float) -> str:
    return f"{b / 1e9:.2f}G" if abs(b) >= 1e9 else f"{b / 1e6:.1f}M"


def report(results: dict[float, dict[str, Any]]) -> None:
    fs = sorted(results)
    names = [s.name for s in results[fs[0]]["steps"]]
    cols = ("wall", "cpu", "rss", "pss", "anon", "written", "cache", "workspace")
    for f in fs:
        print(f"\n=== F = {f:g} ===")
        print(f"{'step':32s} {'wall s':>8s} {'cpu s':>8s} {'peak RSS':>9s} {'PSS':>8s} {'anon':>8s} {'written':>8s} "
              f"{'cache +':>8s} {'work +':>8s}  rows in -> out (why)")
        for s in results[f]["steps"]:
            print(f"{s.name:32s} {s.wall:8.1f} {s.cpu:8.1f} {fmt_bytes(s.rss):>9s} {fmt_bytes(s.pss):>8s} {fmt_bytes(s.anon):>8s} "
                  f"{fmt_bytes(s.written):>8s} {fmt_bytes(s.cache):>8s} {fmt_bytes(s.workspace):>8s}  "
                  f"{s.rows_in} -> {s.rows_out} ({s.why})")
        r = results[f]
        for s in r["steps"]:
            if s.name.startswith("tokenize"):
                print(f"  {s.name}: {s.extra['tokens']:,} tokens, mean {s.extra['len_mean']:.0f}, p90 {s.extra['len_p90']:.0f}")
        growth, new = r["round2_growth"], r["round2_new_bytes"]
        print(f"  round 2 (base prep + merge): workspace + cache +{fmt_bytes(growth)} for {fmt_bytes(new)} of new "
              f"shards = {growth / new:.3f}x (target <= 1.2)")
        tokens, cpu = r["raw_encode"]
        stage_rate = r["tokenize_tokens"] / r["tokenize_cpu"]
        print(f"  tokenize r1: stage {stage_rate:,.0f} tokens/CPU-s (all of dvc repro), "
              f"{r['tokenize_tokens'] / r['tokenize_wall']:,.0f} tokens/s wall; raw encode_batch {tokens / cpu:,.0f} "
              f"tokens/CPU-s on the same renders ({tokens:,} tokens): stage / raw = {stage_rate / (tokens / cpu):.2f}")
    if len(fs) < 2:
        return
    lo, hi = fs[-2], fs[-1]
    print(f"\n=== growth F={lo:g} -> F={hi:g} (x{hi / lo:g} the data), and linear extrapolation to F=1 ===")
    print(f"{'step':32s} " + " ".join(f"{c:>16s}" for c in cols))
    for i, name in enumerate(names):
        a, b = results[lo]["steps"][i], results[hi]["steps"][i]
        cells = []
        for c in cols:
            x, y = getattr(a, c), getattr(b, c)
            full = x + (y - x) * (1 - lo) / (hi - lo)
            ratio = f"x{y / x:.2f}" if x > 0 else "-"
            shown = f"{full:.0f}s" if c in ("wall", "cpu") else fmt_bytes(full)
            cells.append(f"{ratio:>7s} ->{shown:>7s}")
        print(f"{name:32s} " + " ".join(f"{c:>16s}" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fraction", type=float, nargs="+", default=[0.01, 0.1], help="fractions of the reference run")
    ap.add_argument("--workdir", type=Path, default=None, help="where the clones go (default: a folder under /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep each clone (default: deleted after it is measured)")
    ap.add_argument("--corpus-tokens", type=int, default=4_000_000, help="natural text to draw rows from")
    args = ap.parse_args()
    if not (TOKENIZER / "tokenizer_config.json").is_file():
        sys.exit(f"no tokenizer at {TOKENIZER}: this bench needs ../shared/fixtures")
    from transformers import AutoTokenizer

    work = args.workdir or Path(tempfile.mkdtemp(prefix="draftline-scale-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER), local_files_only=True)
    t0 = time.perf_counter()
    corpus = load_corpus(tok, args.corpus_tokens)
    print(f"corpus: {len(corpus.ids):,} tokens of the standard library's source in {time.perf_counter() - t0:.0f} s; "
          f"work in {work}", flush=True)
    # The clones copy the last commit (a local git clone of it), not the working tree: the code measured is code
    # that was committed whole, whatever is being edited meanwhile.
    head = work / "head"
    shutil.rmtree(head, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", "--local", str(REPO), str(head)], check=True)
    project_clone.REPO = head
    print(f"code: commit {subprocess.run(['git', '-C', str(head), 'rev-parse', '--short', 'HEAD'], text=True, capture_output=True).stdout.strip()}")
    target = work / "target"
    if not (target / "config.json").is_file():
        make_target(target)
    results = {}
    for f in sorted(args.fraction):
        results[f] = run_fraction(f, work, corpus, tok, target)
        if not args.keep:
            shutil.rmtree(work / f"project-{f:g}", ignore_errors=True)
        report({f: results[f]})
    report(results)


if __name__ == "__main__":
    main()
