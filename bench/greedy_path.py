"""How many of the target's argmax labels lie on its greedy path from their anchor (``train.argmax_path``).

Block position k of anchor a learns, as ``labels.target_argmax``, the target's argmax at a + k - 1 given the data
before it. The data was sampled (generate's temperature), so past the first block token the data drew off the
target's greedy choice, that argmax answers a prefix a greedy walk from the anchor never drafts from. This bench
counts, on a project's merged set, for every anchor a block could have (every candidate, not a random draw) and
every block position: the share of supervised tokens that are the target's greedy choice, and the share of argmax
labels on the greedy path (:func:`draftline.train.greedy.greedy_path`, the definition training uses), per source.

It reads ``data/merged`` and ``data/target`` of the project it runs in, and ``params.yaml: train`` (block size,
gamma, max_length); the target runs on the CPU, one row at a time, in float32. Nothing is written.

    python bench/greedy_path.py                      # every row of the embedded default: ~5 min beside other work
    python bench/greedy_path.py --rows 300 --seed 0  # a seeded sample of rows
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
import torch
from datasets import load_from_disk

from draftline.core.params import load_section
from draftline.core.target_loader import load_model, load_target
from draftline.train.anchors import anchor_candidates, count_candidates
from draftline.train.greedy import greedy_path
from draftline.train.masks import block_targets, position_weights


@torch.no_grad()
def row_counts(target, ids: list[int], mask: list[int], block: int, gamma: float) -> tuple[np.ndarray, ...]:
    """Per block position k: argmax labels in all, those on the greedy path; and (greedy tokens, supervised)."""
    input_ids = torch.tensor(ids)[None]
    loss_mask = torch.tensor(mask)[None]
    anchors = anchor_candidates(loss_mask).nonzero()[:, 1][None]
    keep = torch.ones_like(anchors, dtype=torch.bool)
    tokens, weights = block_targets(input_ids, loss_mask, anchors, keep, block, gamma)
    used = weights.flatten() > 0
    choice = target(input_ids=input_ids).logits[0].argmax(-1)  # the target's pick for position t + 1
    at = (anchors[:, :, None] + torch.arange(block) - 1).clamp(min=0).flatten()[used]
    greedy = tokens.flatten()[used] == choice[at]
    on = greedy_path(tokens.shape, used, greedy)
    k = torch.arange(block).repeat(tokens.numel() // block)[used]
    labels = torch.bincount(k, minlength=block).numpy()
    on_path = torch.bincount(k, weights=on.double(), minlength=block).numpy()
    supervised = loss_mask[0, 1:].bool()
    picks = (input_ids[0, 1:] == choice[:-1]) & supervised
    return labels, on_path, np.array([int(picks.sum()), int(supervised.sum())])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=0, help="a seeded sample of this many rows (0: every row)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    train = load_section("train")
    block, gamma, cut = int(train["block_size"]), float(train["gamma"]), int(train["max_length"])
    target = load_model(load_target("data/target/target.json"), dtype=torch.float32, device="cpu")
    ds = load_from_disk("data/merged")
    rows = np.arange(len(ds))
    if args.rows:
        rows = np.sort(np.random.default_rng(args.seed).choice(len(ds), min(args.rows, len(ds)), replace=False))
    totals: dict[str, list[np.ndarray]] = defaultdict(lambda: [np.zeros(block), np.zeros(block), np.zeros(2)])
    for r in rows:
        row = ds[int(r)]
        ids, mask = row["input_ids"][:cut], row["loss_mask"][:cut]
        if count_candidates(np.array(mask)) == 0:  # training skips such rows too
            continue
        for name in (row["source"], "all"):
            for total, part in zip(totals[name], row_counts(target, ids, mask, block, gamma)):
                total += part
    w = position_weights(block, gamma).numpy()
    heads = " | ".join(f"k={k}" for k in range(1, block))
    print(f"{len(rows)} rows; block {block}, gamma {gamma}\n")
    print(f"| source | supervised tokens the target's greedy choice | on the greedy path: {heads} | weighted |")
    print("|---|---|" + "---|" * block)
    for name in sorted(totals, key=lambda n: (n == "all", n)):
        labels, on_path, (picks, supervised) = totals[name]
        shares = on_path[1:] / np.maximum(labels[1:], 1)
        weighted = (on_path * w).sum() / max((labels * w).sum(), 1e-9)
        print(f"| {name} | {picks / max(supervised, 1):.3f} | " + " | ".join(f"{s:.2f}" for s in shares)
              + f" | {weighted:.3f} |")


if __name__ == "__main__":
    main()
