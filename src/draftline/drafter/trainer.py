"""Training the DFlash drafter online on the frozen target: one process, or DDP under torchrun.

``train.gpus`` picks the launcher (:func:`main`): 0 or 1 trains in this process; N > 1 re-executes the same
command under ``torchrun --nproc_per_node N``, and every rank trains on its shard of the batches (NCCL on
GPUs, gloo on CPU). Rank 0 alone writes the checkpoint, metrics, plots and resumable states.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import datasets
import numpy as np
import torch
import torch.distributed as dist
import xxhash
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from draftline.drafter.checkpoint import (
    CACHE_ROOT,
    folder_digest,
    load_latest,
    run_key,
    save_state,
)
from draftline.drafter.data import BatchPlan, collate
from draftline.drafter.memory import Preflight, Shapes, preflight
from draftline.drafter.model import DFlashDrafter, build_target_layer_ids, make_config
from draftline.drafter.objective import dflash_loss
from draftline.files import write_csv, write_json
from draftline.logs import get_logger
from draftline.params import check_keys
from draftline.records import TargetInfo
from draftline.skips import Skips
from draftline.target import load_model, load_target

log = get_logger(__name__)

Loader = Callable[[Path], tuple[datasets.Dataset, np.ndarray]]


@dataclass
class TrainConfig:
    """The ``train`` section of params.yaml (every key is documented there and in docs/train.md)."""

    drafter_layers: int = 1
    target_layers: int | list[int] = 5
    block_size: int = 8
    gamma: float = 4.0
    anchors_per_seq: int = 64
    max_length: int = 2048
    max_tokens_per_batch: int = 4096
    epochs: float = 6.0
    max_steps: int = 300
    lr: float = 2e-3
    min_lr_ratio: float = 0.0
    warmup_ratio: float = 0.04
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    bf16: bool = True
    seed: int = 0
    gpus: int = 0
    memory_limit_gb: float = 8.0
    save_every: int = 50
    log_every: int = 10
    strict: bool = False

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "TrainConfig":
        check_keys(params, cls, "train")
        return cls(**params)


@dataclass(frozen=True)
class Paths:
    """Where the train stage reads and writes (the defaults are the pipeline's; tests point them elsewhere)."""

    merged: Path = Path("data/merged")
    target_dir: Path = Path("data/target")
    checkpoint: Path = Path("data/checkpoints")
    metrics: Path = Path("metrics/train.json")
    plot: Path = Path("plots/train_loss.csv")
    cache_root: Path = CACHE_ROOT


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0


def main(params: dict[str, Any], paths: Paths = Paths(), load: Loader | None = None) -> None:
    """The stage entry point: train here, or re-execute this command under torchrun when ``gpus > 1``."""
    cfg = TrainConfig.from_params(params)
    if cfg.gpus > 1 and "LOCAL_RANK" not in os.environ:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg.gpus}", *sys.argv]
        log.info("train.gpus=%d: relaunching under torchrun: %s", cfg.gpus, " ".join(cmd))
        subprocess.run(cmd, check=True)
        return
    train(cfg, paths, load)


def _setup_dist(cfg: TrainConfig) -> Dist:
    if "LOCAL_RANK" not in os.environ:
        return Dist(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    local = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)
    return Dist(dist.get_rank(), dist.get_world_size(), device)


def load_frozen_target(info: TargetInfo, device: torch.device, bf16: bool) -> torch.nn.Module:
    """The frozen target, in bf16 on an accelerator that supports it (fp32 on CPU: bf16 matmuls are slow there)."""
    dtype = torch.bfloat16 if bf16 and device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    return load_model(info, dtype=dtype, device=device).requires_grad_(False)


def step_generator(seed: int, step: int, rank: int) -> torch.Generator:
    """The anchor RNG of one step on one rank: a function of (seed, step, rank), so resuming restores it exactly."""
    key = xxhash.xxh64_intdigest(f"{seed}/{step}/{rank}".encode()) & ((1 << 63) - 1)
    return torch.Generator().manual_seed(key)


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine decay to ``min_ratio``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _shapes(target: torch.nn.Module, drafter: DFlashDrafter, act_bytes: int) -> Shapes:
    c = drafter.config
    tc = target.config.get_text_config()
    return Shapes(
        target_param_bytes=sum(p.numel() * p.element_size() for p in target.parameters()),
        drafter_params=sum(p.numel() for p in drafter.parameters()),
        target_layers=tc.num_hidden_layers,
        hidden=c.hidden_size,
        intermediate=max(c.intermediate_size, getattr(tc, "intermediate_size", 0) or 0),
        heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        vocab=c.vocab_size,
        drafter_layers=c.num_hidden_layers,
        features=len(drafter.target_layer_ids),
        block_size=drafter.block_size,
        act_bytes=act_bytes,
    )


def train(cfg: TrainConfig, paths: Paths = Paths(), load: Loader | None = None) -> dict[str, Any]:
    """Train to the end (resuming from the newest state of the same inputs) and write the outputs.

    ``load(path) -> (dataset, order)`` opens the merged data; by default the merge stage's own reader.
    """
    if load is None:
        from draftline.merge import load_training_set as load

    d = _setup_dist(cfg)
    try:
        return _train(cfg, paths, d, load)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _train(cfg: TrainConfig, paths: Paths, d: Dist, load: Loader) -> dict[str, Any]:
    info = load_target(paths.target_dir)
    dataset, order = load(paths.merged)
    skips = Skips(log, strict=cfg.strict)
    plan = BatchPlan(
        dataset, order, max_length=cfg.max_length, max_tokens_per_batch=cfg.max_tokens_per_batch,
        seed=cfg.seed, world_size=d.world, skips=skips,
    )
    steps_total = cfg.max_steps if cfg.max_steps > 0 else max(1, math.ceil(cfg.epochs * plan.steps_per_epoch))

    target = load_frozen_target(info, d.device, cfg.bf16)
    n_target = target.config.get_text_config().num_hidden_layers
    layer_ids = (
        list(cfg.target_layers) if isinstance(cfg.target_layers, list)
        else build_target_layer_ids(n_target, cfg.target_layers)
    )
    config = make_config(
        target.config, num_layers=cfg.drafter_layers, block_size=cfg.block_size,
        mask_token_id=info.mask_token_id, target_layer_ids=layer_ids,
    )
    torch.manual_seed(cfg.seed)
    drafter = DFlashDrafter(config).bind(target).to(d.device)
    if not 0 <= info.mask_token_id < drafter.shared.embed.weight.shape[0]:
        raise ValueError(f"mask_token_id {info.mask_token_id} is not a row of the target's embedding")
    autocast = d.device.type == "cuda" and cfg.bf16 and torch.cuda.is_bf16_supported()

    optimizer = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    warmup = max(1, math.ceil(cfg.warmup_ratio * steps_total))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, steps_total, warmup, cfg.min_lr_ratio)
    )

    def run_loss(model, batch, generator):
        with torch.autocast(d.device.type, dtype=torch.bfloat16, enabled=autocast):
            return dflash_loss(model, target, batch, anchors_per_seq=cfg.anchors_per_seq, gamma=cfg.gamma,
                               generator=generator)

    def measure(index: int) -> int:
        batch = collate(dataset, plan.batches[index], cfg.max_length, info.pad_token_id or 0).to(d.device)
        torch.cuda.reset_peak_memory_stats(d.device)
        run_loss(drafter, batch, torch.Generator().manual_seed(cfg.seed)).loss.backward()
        drafter.zero_grad(set_to_none=True)
        # Adam's two moments are allocated at the first real step: add them.
        return torch.cuda.max_memory_allocated(d.device) + 8 * sum(p.numel() for p in drafter.parameters())

    act_bytes = 2 if autocast else 4
    check: Preflight = preflight(
        _shapes(target, drafter, act_bytes), plan.padded_shapes(), anchors_per_seq=cfg.anchors_per_seq,
        limit_gb=cfg.memory_limit_gb, budget=cfg.max_tokens_per_batch, rows=plan.rows,
        lengths=plan.stats.lengths, anchors=plan.stats.anchors,
        measure=measure if d.device.type == "cuda" else None,
    )
    if d.main:
        log.info("memory preflight passed: %s", check.as_dict())

    key = run_key(asdict(cfg), folder_digest(paths.merged), info.to_dict())
    scratch = paths.cache_root / key
    state = load_latest(scratch)
    B = cfg.block_size
    # Per-step rows since the last history line: [loss, tokens, correct per position, counted per position].
    window = np.zeros((0, 2 * B + 2))
    start, history, tokens_seen, seconds = 0, [], 0, 0.0
    if state is not None:
        drafter.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start, history, window = state["step"], state["history"], state["window"]
        tokens_seen, seconds = state["tokens"], state["seconds"]
        if d.main:
            log.info("resuming from step %d of %d (%s)", start, steps_total, scratch)

    model = DistributedDataParallel(drafter) if d.world > 1 else drafter
    model.train()
    bar = tqdm(total=steps_total, initial=start, desc="train", disable=not d.main, dynamic_ncols=True)
    t0, tokens_at_t0 = time.perf_counter() - seconds, tokens_seen
    for step in range(start, steps_total):
        batch = collate(dataset, plan.batch_rows(step, d.rank), cfg.max_length, info.pad_token_id or 0).to(d.device)
        stats = run_loss(model, batch, step_generator(cfg.seed, step, d.rank))
        optimizer.zero_grad(set_to_none=True)
        stats.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()

        row = torch.cat([
            torch.tensor([stats.loss.item(), float(batch.num_tokens)]), stats.correct.cpu(), stats.counted.cpu(),
        ])
        if d.world > 1:
            dist.all_reduce(row)
            row[0] /= d.world
        tokens_seen += int(row[1])
        window = np.vstack([window, row.numpy()])
        if d.main:
            elapsed = time.perf_counter() - t0
            rate = (tokens_seen - tokens_at_t0) / max(elapsed - seconds, 1e-9)
            bar.set_postfix(loss=f"{row[0]:.3f}", tok_s=f"{rate:.0f}")
            bar.update(1)
        done = step + 1
        if done % cfg.log_every == 0 or done == steps_total:
            history.append(_history_row(done, plan.steps_per_epoch, lr, float(grad_norm), window, B))
            window = np.zeros((0, 2 * B + 2))
        if d.main and (done % cfg.save_every == 0 or done == steps_total):
            save_state(scratch, done, {
                "model": drafter.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "history": history, "window": window, "tokens": tokens_seen,
                "seconds": time.perf_counter() - t0,
            })
    bar.close()
    seconds_total = time.perf_counter() - t0

    metrics = _metrics(cfg, plan, check, history, steps_total, tokens_seen, seconds_total, skips, drafter, layer_ids)
    if d.main:
        drafter.save_pretrained(paths.checkpoint)
        write_csv(paths.plot, history, columns=list(history[0]))
        write_json(paths.metrics, metrics)
        log.info("trained %d steps in %.1fs; final loss %.4f", steps_total, seconds_total, metrics["final_loss"])
    return metrics


def _history_row(step: int, steps_per_epoch: int, lr: float, grad_norm: float, window: np.ndarray, B: int) -> dict:
    """One line of plots/train_loss.csv: means over the steps since the previous line."""
    correct, counted = window[:, 2 : 2 + B].sum(0), window[:, 2 + B :].sum(0)
    return {
        "step": step,
        "epoch": round(step / steps_per_epoch, 4),
        "loss": round(float(window[:, 0].mean()), 6),
        "accuracy_pos1": round(float(correct[1] / max(counted[1], 1)), 6),
        "lr": float(f"{lr:.6g}"),
        "grad_norm": round(grad_norm, 6),
    }


def _metrics(cfg, plan, check, history, steps, tokens, seconds, skips, drafter, layer_ids) -> dict[str, Any]:
    tail = history[-max(1, len(history) // 10):]
    return {
        "steps": steps,
        "epochs": round(steps / plan.steps_per_epoch, 4),
        "rows": int(len(plan.rows)),
        "rows_skipped": skips.as_dict(),
        "loss_tokens_cut": plan.stats.cut_loss_tokens,
        "first_loss": history[0]["loss"],
        "final_loss": round(float(np.mean([h["loss"] for h in tail])), 6),
        "final_accuracy_pos1": round(float(np.mean([h["accuracy_pos1"] for h in tail])), 6),
        "train_tokens": tokens,
        "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
        "train_seconds": round(seconds, 2),
        "drafter_params": sum(p.numel() for p in drafter.parameters()),
        "target_layer_ids": layer_ids,
        "block_size": cfg.block_size,
        "preflight": check.as_dict(),
    }
