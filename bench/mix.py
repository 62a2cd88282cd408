"""Benchmark of the content mix (issue 25, item 5): what labelling every prompt and a base's rows costs.

    nice -n 10 python bench/mix.py [--prompts 200000] [--base-rows 45100 90200] [--skip-prompts] [--skip-base]

Needs the real Qwen3 tokenizer (../shared/fixtures/qwen3-tokenizer, or --tokenizer). Two parts:

1. **The prompt stage with vs without labelling**, on ``--prompts`` synthetic prompts (the embedded samples' prompts
   repeated with a distinct suffix each, so every domain, tool prompts with their long system prompts included, and
   nothing dedups away), half of them taken by the blend. Each variant runs the conversations stage once (not timed)
   and the prompt stage three times, alternating, in fresh child processes; medians of wall time are compared:
   ``labelled / unlabelled`` (target <= 1.2). "Unlabelled" is the same stage with
   :func:`draftline.core.classify.classify_messages` replaced by a constant (what the stage cost before it labelled).
   A third variant sets ``blend.target_mix`` (every prompt kept is labelled, not only the blend's).
2. **A legacy base labelled from its tokens**, at the reference run's lengths (902K rows, 1.87B tokens: a mean of
   ~2,070 tokens a row, lognormal, p90/mean as in bench/scale.py), at each ``--base-rows`` size: rows whose prompts
   are the embedded samples' prompts rendered by the chat template, replies random token ids. For each size, in a
   fresh child process: the time to label it once (:func:`draftline.core.mix.folder_mix`, nothing cached), what
   labelling adds to the resident memory (VmRSS and its anonymous part, sampled every 20 ms), then the time to read it back from the per-row cache, and from a ``mix.json`` record
   (what a later round does). The per-row rate extrapolates to 902K rows; memory at two sizes shows whether memory
   grows with the row count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO / "tests"))

import numpy as np  # noqa: E402

REFERENCE = {"rows": 902_000, "tokens": 1.87e9}
SOURCES = ["infinity_instruct", "webinstructsub", "codefeedback", "metamathqa", "hermes_fc", "agent", "http_traces"]


def sample_conversations(tmp: Path) -> dict[str, list[dict]]:
    """The embedded samples through the sources and conversations stages: every source's conversations."""
    import early_stages as run

    from draftline.conversations.params import ConversationsParams
    from draftline.core.source_spec import SourceSpec

    params = ConversationsParams.parse({"multimodal": "drop", "strict": False}, "conversations")
    out = {}
    for name in SOURCES:
        spec = SourceSpec.parse({"path": str(REPO / "data/samples" / f"{name}.jsonl"), "adapter": name}, f"sources.{name}")
        run.sources(tmp, name, spec)
        run.conversations(tmp, name, spec, params)
        out[name] = [json.loads(line) for line in (tmp / "conversations" / name / "conversations.jsonl").open()]
    return out


# --- part 1: the prompt stage ------------------------------------------------------------------------------------
def write_prompt_world(root: Path, n: int, tokenizer: Path) -> None:
    """``root/conversations/<source>/``: n conversations in all, the samples' own repeated with a unique suffix on
    their first user turn; ``root/target``: a target.json for the real tokenizer."""
    from conftest import default_params

    from draftline.core.records import CONVERSATIONS_FILE, CONVERSATIONS_STATS_FILE
    from draftline.target.params import TargetParams
    from draftline.target.stage import write_target

    convs = sample_conversations(root / "samples")
    per = n // len(SOURCES)
    for name in SOURCES:
        folder = root / "conversations" / name
        folder.mkdir(parents=True)
        with open(folder / CONVERSATIONS_FILE, "w", encoding="utf-8") as f:
            base = convs[name]
            for i in range(per):
                c = json.loads(json.dumps(base[i % len(base)]))
                first = next(m for m in c["messages"] if m["role"] == "user")
                first["content"] += f" (case {i})"
                c["row"] = i
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
        (folder / CONVERSATIONS_STATS_FILE).write_text(json.dumps({"rows_read": per, "skipped": {}, "media_parts_dropped": 0}))
    write_target(TargetParams.parse(default_params("target", path=str(tokenizer)), "target"), root / "target")


def child_prompts(root: Path, variant: str, out: Path) -> None:
    """One run of the prompt stage (in this fresh process): its wall time to stdout as JSON."""
    import early_stages as run
    from conftest import default_params

    import draftline.prompts.stage as stage_mod
    from draftline.core.classify import Label
    from draftline.prompts.params import BlendParams, DedupParams, PromptsParams, PromptsSettings

    if variant == "unlabelled":
        stage_mod.classify_messages = lambda messages, tools: Label("general", "en")
    n = sum(1 for name in SOURCES for _ in (root / "conversations" / name / "conversations.jsonl").open())
    blend = {**default_params("blend"), "total": n // 2, "sources": {}}
    if variant == "target_mix":
        blend["target_mix"] = {"code": 0.2, "math": 0.3, "tool_use": 0.3, "general": 0.2}
    dedup = default_params("dedup")
    settings = PromptsSettings(SOURCES, PromptsParams.parse(default_params("prompts"), "prompts"),
                               DedupParams.parse({**dedup, "near": {**dedup["near"], "enabled": False}}, "dedup"),
                               BlendParams.parse(blend, "blend"), False, None)
    t = time.perf_counter()
    done = run.prompts(root, settings, out=out)
    print(json.dumps({"seconds": time.perf_counter() - t, "rows": done.headline["rows"],
                      "label_seconds": done.run.get("label_seconds"),
                      "mix": done.headline["mix"]}))


def bench_prompts(n: int, tokenizer: Path, repeats: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-mix-") as tmp:
        root = Path(tmp)
        write_prompt_world(root, n, tokenizer)
        times: dict[str, list[float]] = {"unlabelled": [], "labelled": [], "target_mix": []}
        last = {}
        for r in range(repeats):
            for variant in times:
                res = child(["--child-prompts", str(root), variant, str(root / f"out-{variant}-{r}")])
                times[variant].append(res["seconds"])
                last[variant] = res
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"prompt stage, {n:,} prompts ({last['labelled']['rows']:,} taken), near dedup off, medians of {repeats}:")
        for k, v in med.items():
            print(f"  {k:<11} {v:7.1f} s  (runs: {', '.join(f'{x:.1f}' for x in times[k])}; labelling "
                  f"{last[k]['label_seconds']} s)  {last[k]['mix']}")
        print(f"  labelled / unlabelled = {med['labelled'] / med['unlabelled']:.3f}   (target <= 1.2); "
              f"target_mix / unlabelled = {med['target_mix'] / med['unlabelled']:.3f}")


# --- part 2: a legacy base ---------------------------------------------------------------------------------------
def write_base(folder: Path, rows: int, tokenizer: Path, seed: int = 0) -> dict:
    """A legacy save_to_disk folder (input_ids + loss_mask, no draftline.json) of ``rows`` rows at the reference
    run's mean length; shards of ~500 MB as the tokenize stage cuts them."""
    from transformers import AutoTokenizer

    from draftline.core import dataset as fmt
    from draftline.core.records import Conversation
    from draftline.prompts.canonical import cut_prompt

    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    with tempfile.TemporaryDirectory() as tmp:
        convs = sample_conversations(Path(tmp))
    prompts = []
    for name in SOURCES:
        for c in convs[name]:
            try:
                r = cut_prompt(Conversation.from_dict(c), "first")
            except Exception:
                continue
            ids = tok.apply_chat_template(r.messages, tools=r.tools, add_generation_prompt=True, tokenize=True,
                                          return_dict=False, enable_thinking=False)
            prompts.append(np.asarray(ids, np.int32))
    rng = np.random.default_rng(seed)
    mean = REFERENCE["tokens"] / REFERENCE["rows"]
    sigma = 0.55
    lengths = np.maximum(64, rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, rows)).astype(np.int64)
    writer = fmt.ShardWriter(folder)
    total = 0
    for start in range(0, rows, fmt.BATCH_ROWS):
        n = min(fmt.BATCH_ROWS, rows - start)
        picks = rng.integers(0, len(prompts), n)
        parts, masks, offsets = [], [], [0]
        for k, p in zip(range(start, start + n), picks):
            prompt = prompts[p]
            reply = rng.integers(1000, 100_000, max(8, int(lengths[k]) - len(prompt)), dtype=np.int32)
            parts += [prompt, reply]
            masks += [np.zeros(len(prompt), bool), np.ones(len(reply), bool)]
            offsets.append(offsets[-1] + len(prompt) + len(reply))
        table = fmt.build_table([f"r{start + i}" for i in range(n)], ["legacy"] * n, np.array(offsets),
                                np.concatenate(parts), np.concatenate(masks))
        total += int(offsets[-1])
        writer.add(table)
    infos = writer.close()
    fmt.write_folder_index(folder, [s.filename for s in infos])
    for s in infos:  # legacy: no prompt-key sidecars, no draftline.json
        fmt.keys_path(folder / s.filename).unlink(missing_ok=True)
    return {"rows": rows, "tokens": total, "shards": len(infos), "bytes": sum(s.num_bytes for s in infos)}


def _status_mb() -> dict[str, float]:
    """This process's resident memory now, MB: all of it (VmRSS) and its anonymous part (RssAnon: without the
    file pages of memory-mapped shards, which the kernel can drop at will)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            out[key] = int(value.split()[0]) / 1024
    return out


def child_base(folder: Path, tokenizer: Path, cache: Path) -> None:
    """Label ``folder`` once (nothing cached), then read it from the cache, then from a record: times, and resident
    memory sampled every 20 ms while labelling (peak minus the level just before: what labelling adds)."""
    import threading

    from transformers import AutoTokenizer

    from draftline.core.classify import classify
    from draftline.core.mix import folder_mix, shares, write_record

    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    classify("warm up: load the language model", False)
    before = _status_mb()
    peak = dict(before)
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.02):
            for k, v in _status_mb().items():
                peak[k] = max(peak[k], v)

    threading.Thread(target=poll, daemon=True).start()
    t = time.perf_counter()
    fm, _ = folder_mix(folder, tok, cache=cache)
    label_s = time.perf_counter() - t
    done.set()
    t = time.perf_counter()
    cached, _ = folder_mix(folder, tok, cache=cache)
    cached_s = time.perf_counter() - t
    write_record(folder, fm.entries())
    t = time.perf_counter()
    recorded, _ = folder_mix(folder, None, cache=cache / "none")
    recorded_s = time.perf_counter() - t
    assert cached.total == fm.total == recorded.total and recorded.recorded == len(fm.checksums)
    print(json.dumps({"label_s": label_s, "cached_s": cached_s, "recorded_s": recorded_s, "before": before,
                      "peak": peak, "rows": fm.rows_labelled, "shares": shares(fm.total.amounts("samples"))}))


def bench_base(sizes: list[int], tokenizer: Path) -> None:
    results = []
    for rows in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-mix-base-") as tmp:
            t = time.perf_counter()
            info = write_base(Path(tmp) / "base", rows, tokenizer)
            made = time.perf_counter() - t
            res = child(["--child-base", str(Path(tmp) / "base"), str(Path(tmp) / "cache")])
            results.append((rows, info, res))
            print(f"base {rows:,} rows, {info['tokens']:,} tokens ({info['tokens'] / rows:,.0f} a row), "
                  f"{info['shards']} shards, {info['bytes'] / 1e9:.2f} GB (made in {made:.0f} s):")
            add = {k: res["peak"][k] - res["before"][k] for k in res["peak"]}
            print(f"  labelled once {res['label_s']:.1f} s ({rows / res['label_s']:,.0f} rows/s); resident while "
                  f"labelling: peak {res['peak']['VmRSS']:,.0f} MB (+{add['VmRSS']:,.0f} over the {res['before']['VmRSS']:,.0f} "
                  f"before), anonymous +{add['RssAnon']:,.0f} MB; again from the cache {res['cached_s']:.2f} s; from mix.json "
                  f"{res['recorded_s'] * 1000:.0f} ms; shares {res['shares']}")
    if results:
        rows, _, res = results[-1]
        full = REFERENCE["rows"] / rows * res["label_s"]
        print(f"extrapolated to {REFERENCE['rows']:,} rows: {full / 60:.1f} min to label once (target < 10 min on 2 "
              f"cores; this runs on one), peak RSS by size: "
              + ", ".join(f"{r:,} rows +{x['peak']['VmRSS'] - x['before']['VmRSS']:,.0f} MB resident, "
                          f"+{x['peak']['RssAnon'] - x['before']['RssAnon']:,.0f} MB anonymous" for r, _, x in results))


def child(argv: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])}
    r = subprocess.run([sys.executable, __file__, *argv, "--tokenizer", ARGS.tokenizer], env=env, capture_output=True,
                       text=True, check=False)
    if r.returncode:
        sys.exit(f"child {argv} failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--base-rows", type=int, nargs="*", default=[45_100, 90_200])
    ap.add_argument("--tokenizer", default=str(REPO.parent / "shared/fixtures/qwen3-tokenizer"))
    ap.add_argument("--skip-prompts", action="store_true")
    ap.add_argument("--skip-base", action="store_true")
    ap.add_argument("--child-prompts", nargs=3)
    ap.add_argument("--child-base", nargs=2)
    ARGS = ap.parse_args()
    import logging

    from draftline.core.logs import get_logger  # noqa: F401  (logging configured as the stages do)

    logging.disable(logging.INFO)
    if ARGS.child_prompts:
        root, variant, out = ARGS.child_prompts
        return child_prompts(Path(root), variant, Path(out))
    if ARGS.child_base:
        folder, cache = ARGS.child_base
        return child_base(Path(folder), Path(ARGS.tokenizer), Path(cache))
    if not ARGS.skip_prompts:
        bench_prompts(ARGS.prompts, Path(ARGS.tokenizer), ARGS.repeats)
    if not ARGS.skip_base:
        bench_base(ARGS.base_rows, Path(ARGS.tokenizer))


ARGS: argparse.Namespace

if __name__ == "__main__":
    main()
