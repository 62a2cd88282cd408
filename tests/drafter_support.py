"""Helpers for the drafter tests: a tiny random Qwen3 target, a small merged-style dataset, and a driver.

Run as a script (``python tests/drafter_support.py WORKDIR PARAMS_JSON``) it trains in WORKDIR exactly as the
train stage does (the stage runner's ``execute`` with :func:`args`), reading the dataset this module wrote: the
resume and DDP tests kill and relaunch it as a real process (and under torchrun when ``gpus > 1``). Its
resumable states go where ``$DRAFTLINE_CACHE`` says (the tests set it).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
from pathlib import Path

import numpy as np
import torch

VOCAB, HIDDEN, LAYERS = 256, 64, 6
MASK_ID = VOCAB - 1


def lineage(info=None, enable_thinking: bool | None = False) -> dict:
    """A drafter config's ``draftline`` lineage: the data of ``info``'s target (or a stand-in for model tests)."""
    if info is None:
        return {"tokenizer_fingerprint": "test", "chat_template_sha256": "test", "enable_thinking": enable_thinking,
                "mask_token_id": MASK_ID}
    return {"tokenizer_fingerprint": info.tokenizer_fingerprint, "chat_template_sha256": info.chat_template_sha256,
            "enable_thinking": enable_thinking, "mask_token_id": info.mask_token_id}


def make_target(root: Path, initializer_range: float = 0.2) -> Path:
    """Save a tiny random Qwen3ForCausalLM and its target.json under ``root``; return target.json's path. A small
    ``initializer_range`` gives a target whose greedy replies are repetitive: easy for a drafter to learn."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from draftline.core.records import TargetInfo

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128, max_position_embeddings=512,
        initializer_range=initializer_range,
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


def untrained_drafter(target_json: Path, folder: Path, block_size: int, tapped: int) -> Path:
    """Save an untrained 1-layer DFlash drafter for the target of ``target_json`` (``tapped`` target layers, spread as
    z-lab spreads them) in ``folder``: acceptance near 1, for tests of what decoding with a drafter keeps."""
    from draftline.core.target_loader import load_model, load_target
    from draftline.drafter.config import build_target_layer_ids, make_config
    from draftline.drafter.model import DFlashDrafter

    info = load_target(target_json)
    target = load_model(info)
    cfg = make_config(target.config, num_layers=1, block_size=block_size, mask_token_id=info.mask_token_id,
                      target_layer_ids=build_target_layer_ids(target.config.num_hidden_layers, tapped),
                      lineage=lineage(info))
    torch.manual_seed(0)
    DFlashDrafter(cfg).save_pretrained(folder)
    return folder


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


def greedy_rows(target, prompts: list[list[int]], new_tokens: int = 20):
    """Rows whose replies are ``target``'s own greedy continuation of ``prompts`` (the replies supervised)."""
    import datasets

    ids, masks = [], []
    for prompt in prompts:
        out = target.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False)
        ids.append(out[0].tolist())
        masks.append([False] * len(prompt) + [True] * (out.shape[1] - len(prompt)))
    return datasets.Dataset.from_dict({"input_ids": ids, "loss_mask": masks})


def make_merged(root: Path, rows: dict[str, list]) -> Path:
    """Write rows as a draftline training set (shards, draftline.json, order.npy), as the merge stage does."""
    from draftline.core import dataset as fmt

    merged = root / "data" / "merged"
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows["input_ids"]])])
    table = fmt.build_table(rows["id"], rows["source"], offsets, np.concatenate(rows["input_ids"]),
                            np.concatenate(rows["loss_mask"]))
    meta = fmt.DatasetMeta(tokenizer_fingerprint="test", chat_template_sha256="test", enable_thinking=False,
                           max_len=max(len(r) for r in rows["input_ids"]), mask_token_id=MASK_ID,
                           end_of_turn_token_id=VOCAB - 2)
    fmt.write_dataset(merged, [table], meta)
    np.save(merged / fmt.ORDER_FILE, np.random.default_rng(1).permutation(len(rows["id"])))
    return merged


def args(root: Path, **overrides):
    """The train stage's paths under ``root``, laid out as dvc.yaml lays them out in a project."""
    from draftline.train.args import TrainArgs

    paths = dict(
        merged=root / "data" / "merged", target=root / "data" / "target" / "target.json",
        out=root / "data" / "checkpoints", metrics=root / "metrics" / "train.json",
        report=root / "reports" / "train.json", plot=root / "plots" / "train_loss.csv", drafters=root / "data" / "drafters",
    )
    return TrainArgs(**{**paths, **overrides})


def cache(root: Path) -> Path:
    """Where the tests keep a project's resumable states (``$DRAFTLINE_CACHE``)."""
    return root / ".draftline" / "cache"


def train(cfg, args_):
    """Run the train stage in this process as the runner does; returns its :class:`StageRun`."""
    from draftline.core.runner import execute
    from draftline.train.stage import run_train

    return execute("train", run_train, cfg, args_)


def small_params(**overrides) -> dict:
    """Every key of params.yaml's train section, at sizes for the tiny target (a dict: tests override keys)."""
    params = dict(
        architecture="dflash", init_from=None, sliding_window=None, max_window_layers=0,
        dflash2=dict(conv_kernel_size=3, conv_group_size=16, selector_rank=8, selector_top_k=4,
                     selector_loss_weight=1.0, selector_warmup_ratio=0.1, selector_labels="data",
                     selector_argmax_share=0.0, gold_outside_top_k="drop", selector_trains_drafter=False),
        drafter_layers=1, target_layers=3, block_size=8, gamma=4.0, labels={"data": 1.0, "target_argmax": 0.0, "target_distribution": 0.0}, argmax_path="data", anchors_per_seq=8, anchor_sampling="per_row", max_length=64,
        max_tokens_per_batch=256, memory_limit_gb=4.0, feature_cache_gb=1.0, epochs=1.0, max_steps=0, lr=3e-3, min_lr_ratio=0.0,
        warmup_ratio=0.1, weight_decay=0.0, adam_betas=[0.9, 0.95], grad_clip=1.0, skip_nonfinite=0, bf16=True, seed=0, threads=1, gpus=0, save_every=5, log_every=1,
        strict=False, max_skip_share=0.01,
    )
    params.update(overrides)
    return params


def train_params(**overrides):
    from draftline.train.params import TrainParams

    return TrainParams.parse(small_params(**overrides), "train")


if __name__ == "__main__":
    from draftline.train.params import TrainParams

    workdir, params = Path(sys.argv[1]), json.loads(sys.argv[2])
    torch.set_num_threads(1)
    train(TrainParams.parse(params, "train"), args(workdir))


# The z-lab release whose loader and decoding loop the referee tests pin (scripts/install.sh installs it, no deps).
ZLAB_DFLASH = "0.1.0"


def zlab_dflash():
    """z-lab's ``dflash.model``, the referee: never skipped (a missing or other version fails, naming the fix)."""
    try:
        version = importlib.metadata.version("dflash")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"z-lab's dflash is not installed: run scripts/install.sh (pip install --no-deps "
                           f"dflash=={ZLAB_DFLASH})") from None
    if version != ZLAB_DFLASH:
        raise RuntimeError(f"dflash {version} is installed; the referee tests pin {ZLAB_DFLASH}: "
                           f"pip install --no-deps dflash=={ZLAB_DFLASH}")
    return importlib.import_module("dflash.model")
