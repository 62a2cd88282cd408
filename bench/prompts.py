"""Benchmark of the prompt stage, per core, on seeded synthetic prompts of ~1 KB (half behind shared system prompts).

    python bench/prompts.py [--n 200000] [--quick] [--tokenizer PATH]

Rates are per core: CPU time of this one process (so a machine shared with other jobs does not skew them).
Prints, each with its target:
- exact dedup: canonical ids (normalise + xxh3-128) and the survivor pass, prompts/s (target >= 9K/s/core);
- near-duplicate signatures: numpy MinHash of user-text 5-grams, prompts/s (target >= 2.5K/s/core), beside
  datasketch's MinHash on a subsample (the ratio is what to compare on a shared machine);
- the whole stage (read raw Parquet, adapt, cut, dedup, blend, token estimates, write), seconds (target < 180 s
  for 200K prompts).
"""

from __future__ import annotations

import sys
from pathlib import Path

# The stage drivers of the tests (each stage run as its runner runs it).
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))

import argparse  # noqa: E402
import os
import random
import tempfile
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import early_stages  # noqa: E402

from draftline.conversations.adapters import adapt_rows, make_adapter
from draftline.conversations.params import ConversationsParams
from draftline.core.logs import get_logger
from draftline.core.params import load_section
from draftline.core.raw import rows_to_table, write_raw
from draftline.core.skips import Skips
from draftline.core.source_spec import SourceSpec
from draftline.prompts.canonical import cut_prompt, prompt_id, user_text
from draftline.prompts.dedup import MinHasher, exact_duplicates
from draftline.prompts.params import BlendParams, DedupParams, PromptsParams, PromptsSettings
from draftline.target.params import TargetParams
from draftline.target.stage import write_target

REPO = Path(__file__).resolve().parents[1]


def synthetic_rows(n: int, seed: int = 0) -> list[dict]:
    """sharegpt rows with ~1 KB user text; every other row behind one of 20 shared ~3 KB system prompts."""
    rng = random.Random(seed)
    # English-like words (about 4 characters per token, as in real prompts), 5,000 distinct.
    stems = ("time year people way day man thing woman life child world school state family student group country "
             "problem hand part place case week company system program question work government number night point "
             "home water room mother area money story fact month lot right study book eye job word business issue "
             "side kind head house service friend father power hour game line end member law car city name").split()
    vocab = [stems[i % len(stems)] + ("s" if i % 3 == 0 else "") + ("" if i < len(stems) else str(i // len(stems))) for i in range(5000)]
    systems = [" ".join(rng.choices(vocab, k=500)) for _ in range(20)]
    rows = []
    for i in range(n):
        turns = [{"from": "system", "value": systems[i % 20]}] if i % 2 else []
        turns += [{"from": "human", "value": " ".join(rng.choices(vocab, k=125))}, {"from": "gpt", "value": "ok " * 20}]
        rows.append({"id": i, "conversations": turns})
    return rows


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f} prompts/s"


def params(section: str):
    """A section of the repository's params.yaml (the defaults), as a dict to override."""
    return load_section(section, REPO / "params.yaml")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000, help="synthetic prompts (default 200000)")
    ap.add_argument("--quick", action="store_true", help="20000 prompts: a run of a minute or so")
    ap.add_argument("--tokenizer", default=str(REPO.parent / "shared/fixtures/qwen3-tokenizer"))
    args = ap.parse_args()
    n = 20_000 if args.quick else args.n
    rows = synthetic_rows(n)
    print(f"{n} synthetic prompts, mean user text {sum(len(r['conversations'][-2]['value']) for r in rows) / n:,.0f} chars")

    skips = Skips(get_logger("bench"))
    convs = list(adapt_rows("bench", enumerate(rows), make_adapter("infinity_instruct", None, "drop"), skips))
    records = [cut_prompt(c, "first") for c in convs]

    t = time.process_time()
    ids = [prompt_id(r.messages, r.tools) for r in records]
    dropped = exact_duplicates(["bench"] * len(ids), ids, [r.row for r in records], ["bench"])
    exact_s = time.process_time() - t
    print(f"exact dedup:     {rate(n, exact_s):>18}  ({len(dropped)} dropped)   target >= 9,000/s/core")

    dedup = DedupParams.parse({**params("dedup"), "priority": []}, "dedup")
    hasher = MinHasher(dedup.near)
    texts = [user_text(r) for r in records]
    t = time.process_time()
    sigs = hasher.signatures([hasher.shingles(x, True) for x in texts])
    near_s = time.process_time() - t
    print(f"near signatures: {rate(n, near_s):>18}  ({sigs.shape[1]} perms)       target >= 2,500/s/core")

    from datasketch import MinHash

    sub = texts[: min(2000, n)]
    t = time.process_time()
    for x in sub:
        words = x.lower().split()
        m = MinHash(num_perm=128, seed=0)
        m.update_batch([" ".join(words[k : k + 5]).encode() for k in range(len(words) - 4)])
    ds_s = time.process_time() - t
    print(f"  datasketch:    {rate(len(sub), ds_s):>18}  numpy/datasketch = {(n / near_s) / (len(sub) / ds_s):.1f}x")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_raw(rows_to_table(rows), tmp / "raw/bench")
        write_target(TargetParams.parse({**params("target"), "path": args.tokenizer}, "target"), tmp / "target")
        dedup = DedupParams.parse({**params("dedup"), "priority": [], "near": {**params("dedup")["near"],
                                                                                "exact_numbers": []}}, "dedup")
        blend = BlendParams.parse({**params("blend"), "total": n // 2, "sources": {}}, "blend")
        spec = SourceSpec.parse({"path": "synthetic", "adapter": "infinity_instruct"}, "sources.bench")
        # Adapting (the conversations stage) and the prompt stage together: what one stage did before.
        t, cpu = time.perf_counter(), time.process_time()
        early_stages.conversations(tmp, "bench", spec, ConversationsParams.load("conversations", REPO / "params.yaml"))
        settings = PromptsSettings(["bench"], PromptsParams.load("prompts", REPO / "params.yaml"), dedup, blend, False)
        metrics = early_stages.prompts(tmp, settings).details
        stage_s, stage_cpu = time.perf_counter() - t, time.process_time() - cpu
    limit = 180 * n / 200_000
    print(f"whole stage:     {stage_s:>13.1f} s wall, {stage_cpu:.1f} s CPU ({metrics['train_rows']} train rows)   "
          f"target < {limit:.0f} s for {n} prompts")


if __name__ == "__main__":
    main()
