"""Helpers for the drafter tests: a tiny random Qwen3 target, a small merged-style dataset, and a driver.

Run as a script (``python tests/drafter_support.py WORKDIR PARAMS_JSON``) it trains in WORKDIR exactly as the
train stage does, reading the dataset this module wrote: the resume and DDP tests kill and relaunch it as a
real process (and under torchrun when ``gpus > 1``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import datasets
import numpy as np
import torch

VOCAB, HIDDEN, LAYERS = 256, 64, 6
MASK_ID = VOCAB - 1


def make_target(root: Path) -> Path:
    """Save a tiny random Qwen3ForCausalLM and its target.json under ``root``; return target.json's path."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from draftline.records import TargetInfo

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128, max_position_embeddings=512, initializer_range=0.2,
    )
    model_dir = root / "target-model"
    Qwen3ForCausalLM(config).save_pretrained(model_dir)
    info = TargetInfo(
        path=str(model_dir), tokenizer_fingerprint="test", chat_template_sha256="test", eos_token="<eos>",
        eos_token_id=VOCAB - 2, pad_token_id=0, end_of_turn_token="<eos>", end_of_turn_token_id=VOCAB - 2,
        think_start_token=None, think_end_token=None, mask_token_id=MASK_ID, vocab_size=VOCAB,
        num_hidden_layers=LAYERS, hidden_size=HIDDEN, model_fingerprint="test",
    )
    path = root / "data" / "target" / "target.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info.to_dict()))
    return path


def make_rows(n: int, seed: int = 0, min_len: int = 12, max_len: int = 48, max_step: int = 1) -> dict[str, list]:
    """Rows of a learnable language: a prompt of random tokens, then an answer counting up by a per-row step."""
    rng = np.random.default_rng(seed)
    rows = {"id": [], "source": [], "input_ids": [], "loss_mask": [], "num_tokens": [], "num_loss_tokens": []}
    for i in range(n):
        length = int(rng.integers(min_len, max_len + 1))
        prompt = int(rng.integers(3, 8))
        step = int(rng.integers(1, max_step + 1))
        ids = list(rng.integers(1, 200, size=prompt))
        start = int(rng.integers(1, 200))
        ids += [1 + (start + step * k) % 200 for k in range(length - prompt)]
        mask = [False] * prompt + [True] * (length - prompt)
        rows["id"].append(f"r{i}")
        rows["source"].append("synthetic")
        rows["input_ids"].append([int(x) for x in ids])
        rows["loss_mask"].append(mask)
        rows["num_tokens"].append(length)
        rows["num_loss_tokens"].append(sum(mask))
    return rows


def make_merged(root: Path, rows: dict[str, list]) -> Path:
    """Write rows as a dataset folder plus the row order (the merge stage's output, as far as training needs)."""
    merged = root / "data" / "merged"
    datasets.Dataset.from_dict(rows).save_to_disk(str(merged / "dataset"))
    np.save(merged / "order.npy", np.random.default_rng(1).permutation(len(rows["id"])))
    return merged


def load(path: Path) -> tuple[datasets.Dataset, np.ndarray]:
    return datasets.load_from_disk(str(Path(path) / "dataset")), np.load(Path(path) / "order.npy")


def paths(root: Path):
    from draftline.drafter.trainer import Paths

    return Paths(
        merged=root / "data" / "merged", target_dir=root / "data" / "target",
        checkpoint=root / "data" / "checkpoints", metrics=root / "metrics" / "train.json",
        plot=root / "plots" / "train_loss.csv", cache_root=root / ".draftline" / "cache" / "train",
    )


def small_params(**overrides) -> dict:
    params = dict(
        drafter_layers=1, target_layers=3, block_size=8, gamma=4.0, anchors_per_seq=8, max_length=64,
        max_tokens_per_batch=256, epochs=1.0, max_steps=0, lr=3e-3, warmup_ratio=0.1, save_every=5,
        log_every=1, memory_limit_gb=4.0,
    )
    params.update(overrides)
    return params


if __name__ == "__main__":
    from draftline.drafter.trainer import main

    workdir, params = Path(sys.argv[1]), json.loads(sys.argv[2])
    torch.set_num_threads(1)
    main(params, paths(workdir), load=load)
