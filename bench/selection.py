"""What ``blend.select: {by: drafter}`` costs, and whether its score predicts acceptance (issue 35, items 3 and 5).

On a finished project (default: this repository after ``dvc repro``), with the drafter its evaluate stage judged
(``data/checkpoints``) and that evaluation (``reports/eval.json``):

1. **Does the proxy predict?** Every held-out ``dev`` prompt (``data/prompts/eval.jsonl``) is scored exactly as the
   prompt stage scores candidates (:func:`draftline.prompts.select.drafter_scorer`, the project's ``blend.select``
   settings), and each source's Spearman rank correlation between the score and the acceptance the evaluate stage
   measured on the same prompt is printed, per setting (greedy, sampled). The test split is never read.
2. **What it costs.** ``--candidates`` train prompts (``data/prompts/train.jsonl``, in file order) are scored with an
   empty cache (a temporary ``$DRAFTLINE_CACHE``) on one core: seconds per 1,000 candidates and tokens per candidate.
   From the tokens, the FLOPs of one scoring pass of a ``--target-params`` target (2 x parameters per token: one
   forward; the drafter's share is under 1% and left out) and the GPU hours to score ``--pool`` candidates at
   ``--gpu-flops`` sustained, beside the reference run's generation (15.6 hours on 8 GPUs).

    python bench/selection.py                                     # this repository, after dvc repro
    python bench/selection.py --project /tmp/clone --candidates 2000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REFERENCE_PROMPTS = 193_000  # the reference run: 193K prompts, 523M generated tokens, 15.6 h on 8 GPUs
REFERENCE_GPU_HOURS = 15.6 * 8


def load(project: Path):
    """The project's blend.select settings (by: drafter, on its own checkpoint) and its target, tokenizer, prompts."""
    from draftline.core.logs import get_logger
    from draftline.core.params import load_value
    from draftline.core.records import read_prompts
    from draftline.core.skips import Skips
    from draftline.core.target import load_target, load_tokenizer
    from draftline.prompts.params import BlendParams

    blend = BlendParams.load("blend", project / "params.yaml")
    select = blend.select.__class__(**{**blend.select.__dict__, "by": "drafter",
                                      "drafter": str(project / "data/checkpoints")})
    info = load_target(project / "data/target/target.json")
    skips = Skips(get_logger("bench.select"), strict=False)
    prompts = {name: list(read_prompts(project / "data/prompts" / f"{name}.jsonl", skips)) for name in ("eval", "train")}
    return select, info, load_tokenizer(info), load_value("generate.enable_thinking", bool, project / "params.yaml"), prompts


def rho(x: dict) -> str:
    if x["spearman"] is None:
        return f"- (n={x['n']})"
    return f"{x['spearman']:+.2f} [{x['ci'][0]:+.2f}, {x['ci'][1]:+.2f}] (n={x['n']})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", type=Path, default=REPO)
    ap.add_argument("--candidates", type=int, default=1000, help="train prompts scored for the cost figure")
    ap.add_argument("--target-params", type=float, default=27e9, help="the projected target's parameters")
    ap.add_argument("--pool", type=int, default=2 * REFERENCE_PROMPTS, help="candidates scored in the projection")
    ap.add_argument("--gpu-flops", type=float, default=400e12,
                    help="sustained FLOP/s of one GPU in a batched prefill (H100 bf16 at ~40%% of 989 TFLOP/s)")
    args = ap.parse_args()
    os.environ["DRAFTLINE_CACHE"] = tempfile.mkdtemp(prefix="select-bench-")
    from draftline.core.splits import DEV, split_of
    from draftline.prompts.select import correlation, drafter_scorer, request_acceptance
    from draftline.prompts.steer import read_evaluation

    select, info, tokenizer, thinking, prompts = load(args.project)
    dev = [r for r in prompts["eval"] if split_of(r.id) == DEV]
    stats: dict = {}
    score, _ = drafter_scorer(select, info, tokenizer, thinking, stats)
    scores = score(dev)
    evaluation = read_evaluation(args.project / "reports/eval.json", info.tokenizer_fingerprint)
    sources = {r.id: r.source for r in dev}
    print(f"Spearman rank correlation, teacher-forced score vs measured acceptance, dev split ({len(dev)} prompts, "
          f"{sum(s is not None for s in scores.values())} with an answer to score):")
    for setting, figures in evaluation.items():
        c = correlation(scores, sources, request_acceptance(figures["per_request"]))
        cells = ", ".join(f"{s} {rho(x)}" for s, x in c["per_source"].items())
        print(f"  {setting}: all {rho(c['all'])}; {cells}")
    train = prompts["train"][: args.candidates]
    cost: dict = {}
    started = time.perf_counter()
    drafter_scorer(select, info, tokenizer, thinking, cost)[0](train)  # a fresh scorer: the model load is timed too
    seconds = time.perf_counter() - started
    per_candidate = cost["scored_tokens"] / max(cost["scored"], 1)
    flops = 2 * args.target_params * per_candidate * args.pool
    hours = flops / args.gpu_flops / 3600
    print(f"cost: {cost['scored']} of {len(train)} candidates scored (the rest have no answer) in {seconds:.1f} s on "
          f"one core ({1000 * seconds / max(cost['scored'], 1):.1f} s per 1,000; scoring alone "
          f"{cost['score_seconds']:.1f} s), {per_candidate:.0f} tokens per candidate")
    print(f"projection: {args.pool:,} candidates x {per_candidate:.0f} tokens x 2 x {args.target_params:.3g} "
          f"parameters = {flops:.3g} FLOPs = {hours:.1f} GPU hours at {args.gpu_flops:.3g} FLOP/s, beside the "
          f"reference generation's {REFERENCE_GPU_HOURS:.0f} GPU hours ({hours / REFERENCE_GPU_HOURS:.1%})")


if __name__ == "__main__":
    main()
