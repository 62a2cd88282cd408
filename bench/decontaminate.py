"""Benchmark of decontamination (issue 57): the prompt stage with vs without the check, side by side in one run.

    nice python bench/decontaminate.py [--prompts 200000] [--eval 5000] [--repeats 2] [--out DIR]
    nice python bench/decontaminate.py --samples [--out DIR]   # how the defaults were chosen

``--samples`` measures the check on the embedded samples (``data/conversations`` and ``data/sets/conversations``
of the default pipeline, after ``dvc repro set_conversations conversations``) at each setting of a grid: the pairs
it flags against the sets and against the held-out prompts, how many of them are not the same question (after
number normalisation neither text contains the other: false positives), and its recall on copies of every
evaluation prompt that has counted n-grams, planted by kind of edit.

Needs the real Qwen3 tokenizer (../shared/fixtures/qwen3-tokenizer, or --tokenizer). The world: ``--prompts``
synthetic prompts in 4 sources (each ~120 words in sentences of 8-16 words, drawn from a 5,000-word vocabulary
of letters only, so that no two share an n-gram by chance, and English function words), an evaluation set of ``--eval`` such prompts (~60
words), and 1% of the training prompts planted as copies of evaluation prompts (verbatim, upper-cased, a sentence
swapped). The prompt stage runs ``--repeats`` times per variant, alternating, each in a fresh child process;
``off`` is the same stage with ``decontaminate.enabled: false``. Near dedup is off in both (as in bench/mix.py), so
the ratio is taken over the smaller denominator. Prints a table and writes ``result.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
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

SOURCES = ["alpha", "beta", "gamma", "delta"]
PLANTED_SHARE = 0.01


# A third of the words are English function words: the stage's language rule then knows the text as English without
# asking langid (core/classify.py), as it does real English prompts; gibberish would make labelling the stage's cost.
FUNCTION_WORDS = "the of and is are was this that what which how with for from you your it can would not have".split()


def _text(rng: random.Random, vocab: list[str], words: int) -> str:
    out, left = [], words
    while left > 0:
        k = min(left, rng.randint(8, 16))
        picked = [rng.choice(FUNCTION_WORDS) if rng.random() < 0.33 else rng.choice(vocab) for _ in range(k)]
        out.append(" ".join(picked).capitalize() + ".")
        left -= k
    return " ".join(out)


def write_world(root: Path, n: int, n_eval: int, tokenizer: Path) -> dict:
    """Sources under ``root/conversations``, the set under ``root/sets/bench``, the target under ``root/target``."""
    from conftest import default_params

    from draftline.core.records import CONVERSATIONS_FILE, CONVERSATIONS_STATS_FILE, Conversation
    from draftline.target.params import TargetParams
    from draftline.target.stage import write_target

    rng = random.Random(0)
    vocab = sorted({"".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))) for _ in range(6000)})[:5000]
    evals = [_text(rng, vocab, 60) for _ in range(n_eval)]

    def write(folder: Path, source: str, texts: list[str]) -> None:
        folder.mkdir(parents=True)
        with open(folder / CONVERSATIONS_FILE, "w", encoding="utf-8") as f:
            for row, t in enumerate(texts):
                f.write(Conversation(source, row, [{"role": "user", "content": t},
                                                   {"role": "assistant", "content": "ok " * 20}]).to_json() + "\n")
        (folder / CONVERSATIONS_STATS_FILE).write_text(json.dumps({"rows_read": len(texts), "skipped": {},
                                                                   "media_parts_dropped": 0}))

    write(root / "sets" / "bench", "bench", evals)
    planted = 0
    for s, name in enumerate(SOURCES):
        texts = []
        for _ in range(n // len(SOURCES)):
            if rng.random() < PLANTED_SHARE:
                e = evals[rng.randrange(n_eval)]
                first, _, rest = e.partition(". ")
                texts.append([e, e.upper(), f"{rest} {first}."][planted % 3] + f" Variant {chr(97 + s)}{planted}x.")
                planted += 1
            else:
                texts.append(_text(rng, vocab, 120))
        write(root / "conversations" / name, name, texts)
    write_target(TargetParams.parse(default_params("target", path=str(tokenizer)), "target"), root / "target")
    return {"prompts": n, "eval_prompts": n_eval, "planted": planted}


def child(root: Path, variant: str, out: Path) -> None:
    """One run of the prompt stage in this fresh process: its wall time and counts to stdout as JSON."""
    from conftest import default_params

    from draftline.core.runner import execute
    from draftline.prompts.params import BlendParams, DecontaminateParams, DedupParams, PromptsParams, PromptsSettings
    from draftline.prompts.stage import PromptsArgs, run_prompts

    n = sum(1 for name in SOURCES for _ in (root / "conversations" / name / "conversations.jsonl").open())
    dedup = default_params("dedup")
    settings = PromptsSettings(
        SOURCES, PromptsParams.parse(default_params("prompts"), "prompts"),
        DedupParams.parse({**dedup, "priority": [], "near": {**dedup["near"], "enabled": False, "exact_numbers": []}},
                          "dedup"),
        BlendParams.parse({**default_params("blend"), "total": n // 2, "sources": {}}, "blend"), False, None,
        DecontaminateParams.parse({**default_params("decontaminate"), "enabled": variant == "on"}, "decontaminate"),
        ["bench"])
    for d in ("drafters", "bases"):
        (root / d).mkdir(exist_ok=True)
    t = time.perf_counter()
    done = execute("prompts", run_prompts, settings, PromptsArgs(
        conversations=root / "conversations", target=root / "target" / "target.json", out=out / "prompts",
        metrics=out / "metrics.json", report=out / "report.json", plot=out / "mix.csv", plot_shares=out / "shares.csv",
        plot_languages=out / "languages.csv", drafters=root / "drafters", bases=root / "bases", sets=root / "sets"))
    print(json.dumps({"seconds": time.perf_counter() - t, "rows": done.headline["rows"],
                      "contaminated": done.headline.get("contaminated"),
                      "decontaminate_seconds": done.run.get("decontaminate_seconds")}))


def _edits(text: str) -> dict[str, str | None]:
    """Planted copies of an evaluation prompt, by kind (None: the kind does not apply to it)."""
    import re

    sentences = re.split(r"(?<=[.!?])\s+", text.strip())
    words = text.split()
    return {
        "verbatim": text, "whitespace": "  " + text.replace(" ", "  \t", 3) + "\n\n", "case": text.upper(),
        "number": re.sub(r"\d+", lambda m: str(int(m.group()) + 7), text, count=1) if re.search(r"\d", text) else None,
        "swapped": " ".join([sentences[1], sentences[0], *sentences[2:]]) if len(sentences) >= 2 else None,
        "wrapped": f"Please answer the following question carefully.\n\n{text}\n\nThanks a lot!",
        "one word replaced": " ".join(words[: len(words) // 2] + ["banana"] + words[len(words) // 2 + 1 :])
        if len(words) >= 12 else None,
        "last sentence dropped": " ".join(sentences[:-1]) if len(sentences) >= 3 else None,
    }


def measure_samples(grid: list[tuple[int, float, int]]) -> list[dict]:
    """The check on the samples at each (ngram, threshold, shared_by): flagged pairs, false ones, planted recall."""
    import logging

    from draftline.core.contamination import HELDOUT, WORD, EvalIndex, EvalPrompt, normalize, set_prompts
    from draftline.core.skips import Skips
    from draftline.prompts.canonical import user_text
    from draftline.prompts.params import load
    from draftline.prompts.stage import collect, deduplicate, held_out_ids

    logging.disable(logging.WARNING)
    p = load()
    order = list(p.sources)
    records, reports = collect(order, p.prompts, REPO / "data/conversations")
    kept = deduplicate(records, reports, p.dedup, order)
    held = held_out_ids(kept, p.blend, order)
    prompts = set_prompts(p.sets, REPO / "data/sets/conversations", Skips(logging.getLogger("bench")))
    prompts += [EvalPrompt(HELDOUT, r.id, user_text(r)) for r in kept if r.id in held]
    texts = [user_text(r) for r in kept]
    words = lambda t: " ".join(WORD.findall(normalize(t)))  # noqa: E731
    out = []
    for ngram, threshold, shared_by in grid:
        index = EvalIndex.build(prompts, ngram, shared_by)
        pairs = {"sets": [0, 0], "heldout": [0, 0]}  # [flagged, not the same question]
        dropped = set()
        for r, t, hit in zip(kept, texts, index.hits(texts, threshold)):
            for e in hit:
                if r.id in held and prompts[e].set == HELDOUT:
                    continue
                dropped.add(r.id)
                a, b = words(prompts[e].text), words(t)
                kind = pairs["heldout" if prompts[e].set == HELDOUT else "sets"]
                kind[0] += 1
                kind[1] += not (a in b or b in a)
        planted = [(kind, e, x) for e, ev in enumerate(prompts) if index.sizes[e] > 0
                   for kind, x in _edits(ev.text).items() if x]
        recall: dict[str, list[int]] = {}
        for (kind, e, _), hit in zip(planted, index.hits([x for _, _, x in planted], threshold)):
            recall.setdefault(kind, [0, 0])
            recall[kind][0] += e in hit
            recall[kind][1] += 1
        row = {"ngram": ngram, "threshold": threshold, "shared_by": shared_by, "dropped": len(dropped),
               **{f"{k}_flagged": v[0] for k, v in pairs.items()}, **{f"{k}_false": v[1] for k, v in pairs.items()},
               "recall": {k: f"{a}/{b}" for k, (a, b) in recall.items()}}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def run_child(args: list[str]) -> dict:
    res = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=200_000)
    ap.add_argument("--eval", type=int, default=5_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokenizer", default=str(REPO.parent / "shared/fixtures/qwen3-tokenizer"))
    ap.add_argument("--out", default=None, help="folder for result.json")
    ap.add_argument("--samples", action="store_true", help="measure the check on the samples over a grid of params")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.samples:
        grid = [(n, t, s) for n in (6, 8, 10) for s in (3, 5, 10) for t in (0.5, 0.6, 0.7, 0.8)]
        rows = measure_samples(grid)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "samples.json").write_text(json.dumps(rows, indent=1) + "\n")
        return
    if args.child:
        child(Path(args.child[0]), args.child[1], Path(args.child[2]))
        return
    with tempfile.TemporaryDirectory(prefix="bench-decontaminate-") as tmp:
        root = Path(tmp)
        world = write_world(root, args.prompts, args.eval, Path(args.tokenizer))
        times: dict[str, list[float]] = {"off": [], "on": []}
        last = {}
        for r in range(args.repeats):
            for variant in times:
                last[variant] = run_child(["--child", str(root), variant, str(root / f"out-{variant}-{r}")])
                times[variant].append(round(last[variant]["seconds"], 2))
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {**world, "repeats": args.repeats, "seconds": times, "median_seconds": med,
              "ratio_on_off": round(med["on"] / med["off"], 3), "check_seconds": last["on"]["decontaminate_seconds"],
              "contaminated": last["on"]["contaminated"], "train_rows": last["on"]["rows"],
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"}
    print(f"prompt stage, {world['prompts']:,} prompts vs {world['eval_prompts']:,} evaluation prompts "
          f"({world['planted']} planted), near dedup off, medians of {args.repeats}:")
    for k in times:
        print(f"  {k:<4} {med[k]:7.1f} s  (runs: {', '.join(f'{x:.1f}' for x in times[k])})")
    print(f"  on / off = {result['ratio_on_off']:.3f} (target <= 1.2); the check itself {result['check_seconds']} s; "
          f"dropped {result['contaminated']}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "result.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
