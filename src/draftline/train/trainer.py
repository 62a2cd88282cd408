"""Training the DFlash drafter online on the frozen target: one process, or one rank of DDP under torchrun.

Read top to bottom: :func:`train` sets up the ranks, :func:`prepare` plans the batches from the training set,
:func:`build` makes the target, the drafter and the optimiser, :func:`cache_features` computes the target's
features of every row once when they fit in memory, :func:`check_memory` refuses a run whose worst batch would not
fit, :func:`resume` restores the newest state of the same inputs, :func:`fit` runs the steps, and
:func:`finish` writes the checkpoint and the loss curve and fills the stage's headline, report and run figures
(the stage runner writes them). Rank 0 alone writes files. The checkpoint's config carries the data's lineage
(tokenizer fingerprint, chat template, thinking mode, mask token), so evaluation and serving read them from the
drafter instead of from params. The learning rate of a step is :func:`draftline.core.schedule.lr_at` of that step,
set before the optimiser steps: no scheduler state, so a resumed run sets exactly the rates an uninterrupted one does.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import torch.distributed as dist
import xxhash
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from draftline.core.dataset import DatasetMeta, dataset_digest, load_training_set
from draftline.core.errors import Refusal
from draftline.core.files import write_csv
from draftline.core.fingerprint import code_digest
from draftline.core.logs import get_logger
from draftline.core.params import ParamsError
from draftline.core.records import TargetInfo
from draftline.core.runner import StageRun
from draftline.core.schedule import adamw, lr_at
from draftline.core.scratch import scratch_dir
from draftline.core.skips import Skips
from draftline.core.target_loader import load_model, load_target
from draftline.core.threads import torch_threads
from draftline.drafter.checkpoint import CONFIG_FILE
from draftline.drafter.config import DrafterMismatch, build_target_layer_ids, make_config
from draftline.drafter.model import DFlashDrafter
from draftline.train.args import TrainArgs
from draftline.train.data import Batch, BatchPlan, collate, pack_rows, pack_shapes
from draftline.train.features import FeatureCache, cache_bytes
from draftline.train.greedy import pack_chains, refuse_sliding_window
from draftline.train.memory import GB, Preflight, Shapes, preflight
from draftline.train.objective import SelectorObjective, dflash_loss, pack_features
from draftline.train.params import NOT_IN_KEY, TrainParams
from draftline.train.state import load_latest, save_state, state_key
from draftline.train.warm_start import warm_start

log = get_logger(__name__)


class TrainInputError(Refusal, ValueError):
    """The training set and the target cannot be used together (or the target's own files say something this stage
    cannot use): the message names the stage to re-run."""


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0


@dataclass
class Run:
    """Everything one training run holds, built once by :func:`prepare` and :func:`build`."""

    cfg: TrainParams
    d: Dist
    info: TargetInfo
    meta: DatasetMeta
    dataset: datasets.Dataset
    plan: BatchPlan
    steps_total: int
    warmup: int  # steps of linear warmup (draftline.core.schedule.lr_at)
    skips: Skips
    target: torch.nn.Module | None = None
    drafter: DFlashDrafter | None = None
    optimizer: torch.optim.Optimizer | None = None
    autocast: bool = False
    features: FeatureCache | None = None
    started_from: dict[str, Any] | None = None  # train.init_from's drafter, as warm_start loaded it

    def selector_weight(self, step: int) -> float:
        """The selector loss's weight at ``step``: ``selector_loss_weight``, ramped linearly from 0 over the first
        ``selector_warmup_ratio`` of the steps (0 for DFlash 1)."""
        if self.cfg.architecture != "dflash2":
            return 0.0
        d2 = self.cfg.dflash2
        ramp = math.ceil(d2.selector_warmup_ratio * self.steps_total)
        return d2.selector_loss_weight * (1.0 if ramp == 0 else min(1.0, (step + 1) / ramp))

    def selector_objective(self, step: int) -> SelectorObjective:
        d2 = self.cfg.dflash2
        return SelectorObjective(self.selector_weight(step), d2.selector_labels, d2.selector_argmax_share,
                                 d2.gold_outside_top_k, d2.selector_trains_drafter)

    def loss(self, model, rows: np.ndarray, batch: Batch, generator, step: int = 0):
        with torch.autocast(self.d.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            chains = None
            if self.features is not None:
                features, final = self.features.pack(rows)
                chains = self.features.pack_chains(rows) if self.chain_depth else None
            else:
                features, final = pack_features(self.target, batch, self.drafter.target_layer_ids, self.needs_final)
                if self.chain_depth:
                    chains = pack_chains(self.target, batch.input_ids, batch.loss_mask, batch.row_of, self.chain_depth)
            return dflash_loss(model, features, batch, anchors_per_seq=self.cfg.anchors_per_seq, gamma=self.cfg.gamma,
                               generator=generator, anchors_per_token=self.cfg.anchor_sampling == "per_token",
                               labels=asdict(self.cfg.labels), target_final=final,
                               selector=self.selector_objective(step), argmax_path=self.cfg.argmax_path,
                               target_chains=chains)

    @property
    def chain_depth(self) -> int:
        """Tokens of the target's greedy continuation kept after every token (``argmax_path: greedy``), else 0."""
        return self.cfg.block_size - 1 if self.cfg.argmax_path == "greedy" else 0

    @property
    def needs_final(self) -> bool:
        """Whether a label is the target's own (``labels`` or DFlash 2's ``selector_labels`` other than data): then
        the target's last hidden state is kept beside its features."""
        selector = self.cfg.architecture == "dflash2" and self.cfg.dflash2.selector_labels != "data"
        return self.cfg.labels.from_target or selector

    @property
    def feature_bytes(self) -> int:
        """Bytes of the feature cache (0 when features are computed online)."""
        return 0 if self.features is None else self.features.bytes

    def batch(self, rows: np.ndarray):
        return collate(self.dataset, rows, self.cfg.max_length).to(self.d.device)


class NonFiniteError(Refusal, FloatingPointError):
    """A step whose loss or gradient is NaN or inf, past ``train.skip_nonfinite``: the message names the step and
    the batch's rows and what to change, and the last good state is saved before it is raised."""


@dataclass
class Progress:
    """Where a run stands: the step to do next, the history lines, the steps since the last one, tokens, time,
    and the batches skipped for a non-finite loss or gradient."""

    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    window: np.ndarray | None = None
    tokens: int = 0
    seconds: float = 0.0
    nonfinite: int = 0

    def state(self) -> dict[str, Any]:
        """What a resumable state keeps of it: plain types and tensors only (states load with weights_only)."""
        return {"history": self.history, "window": torch.from_numpy(self.window), "tokens": self.tokens,
                "seconds": self.seconds, "nonfinite": self.nonfinite}


def _setup_dist() -> Dist:
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


def train(cfg: TrainParams, args: TrainArgs, stage: StageRun) -> None:
    """Train to the end (resuming from the newest state of the same inputs), write the checkpoint and the loss
    curve, and fill ``stage``. The resumable states live in the scratch root of :mod:`draftline.core.scratch`
    (``$DRAFTLINE_CACHE``, else the repository's ``.draftline/cache``)."""
    d = _setup_dist()
    try:
        with torch_threads(cfg.threads):
            stage.skips.strict = cfg.strict
            run = prepare(cfg, args.merged, args.target, d, stage.skips)
            build(run)
            cache_features(run)
            check = check_memory(run)
            inputs = dataset_digest(args.merged) + (f"+init:{drafter_digest(cfg.init_from)}" if cfg.init_from else "")
            key = state_key(asdict(cfg), NOT_IN_KEY, inputs, run.info.to_dict(),
                            code_digest("draftline.core", "draftline.drafter", "draftline.train"))
            folder = scratch_dir("train", key)
            progress = resume(run, folder)
            resumed_at = progress.step
            fit(run, progress, folder)
            finish(run, progress, check, args, stage)
            stage.run.update(resumed_at_step=resumed_at, states=str(folder))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def prepare(cfg: TrainParams, merged: Path, target: Path, d: Dist, skips: Skips) -> Run:
    """The target's description (``target``: its target.json), the training set and its batch plan (rows unable
    to train counted in ``skips``); the number of steps."""
    info = load_target(target)
    if cfg.argmax_path == "greedy" and info.model_fingerprint is not None:  # before the data and the model load
        from transformers import AutoConfig

        refuse_sliding_window(AutoConfig.from_pretrained(info.path, local_files_only=True))
    dataset, order, meta = load_training_set(merged)
    if meta.tokenizer_fingerprint != info.tokenizer_fingerprint:
        raise TrainInputError(f"{merged} was made with another tokenizer than {target} describes: "
                              "re-run tokenize and merge for this target")
    plan = BatchPlan(
        dataset, order, max_length=cfg.max_length, max_tokens_per_batch=cfg.max_tokens_per_batch,
        seed=cfg.seed, world_size=d.world, skips=skips,
    )
    skips.check_share(len(order), cfg.max_skip_share, "train.max_skip_share", {
        "no two consecutive supervised tokens": f"raise train.max_length ({cfg.max_length}) if the cut falls before "
                                                "the rows' replies, else check the tokenize stage's loss masks"})
    steps = cfg.max_steps if cfg.max_steps > 0 else max(1, plan.total_steps(cfg.epochs))
    warmup = max(1, math.ceil(cfg.warmup_ratio * steps))
    return Run(cfg, d, info, meta, dataset, plan, steps, warmup, skips)


def lineage(meta: DatasetMeta) -> dict[str, Any]:
    """What the data was made with, copied into the drafter's config (``draftline`` key)."""
    return {"tokenizer_fingerprint": meta.tokenizer_fingerprint, "chat_template_sha256": meta.chat_template_sha256,
            "enable_thinking": meta.enable_thinking, "mask_token_id": meta.mask_token_id}


def build(run: Run) -> None:
    """The frozen target (bf16 on a GPU that supports it, fp32 on CPU), the drafter bound to it, the optimiser."""
    cfg, d = run.cfg, run.d
    run.autocast = d.device.type == "cuda" and cfg.bf16 and torch.cuda.is_bf16_supported()
    dtype = torch.bfloat16 if run.autocast else torch.float32
    run.target = load_model(run.info, dtype=dtype, device=d.device).requires_grad_(False)
    n_target = run.target.config.get_text_config().num_hidden_layers
    try:
        layer_ids = (list(cfg.target_layers) if isinstance(cfg.target_layers, list)
                     else build_target_layer_ids(n_target, cfg.target_layers))
        config = make_config(run.target.config, num_layers=cfg.drafter_layers, block_size=cfg.block_size,
                             mask_token_id=run.meta.mask_token_id, target_layer_ids=layer_ids,
                             lineage=lineage(run.meta), architecture=cfg.architecture,
                             dflash2=asdict(cfg.dflash2), sliding_window=cfg.sliding_window,
                             max_window_layers=cfg.max_window_layers)
    except DrafterMismatch as e:
        raise ParamsError(f"params.yaml: train.target_layers ({cfg.target_layers}) does not fit this target: "
                          f"{e}") from None
    if cfg.architecture == "dflash2" and config.hidden_size % cfg.dflash2.conv_group_size:
        raise ParamsError(f"params.yaml: train.dflash2.conv_group_size ({cfg.dflash2.conv_group_size}) must divide the "
                          f"target's hidden size ({config.hidden_size})")
    torch.manual_seed(cfg.seed)
    run.drafter = DFlashDrafter(config)
    if cfg.init_from is not None:
        if not (Path(cfg.init_from) / CONFIG_FILE).is_file():
            raise ParamsError(f"params.yaml: train.init_from ({cfg.init_from}) is not a drafter checkpoint folder (no "
                              f"{CONFIG_FILE}): point it at one under data/drafters/, or null to start from scratch")
        try:
            run.started_from = warm_start(run.drafter, cfg.init_from)
        except DrafterMismatch as e:
            raise ParamsError(f"params.yaml: train.init_from ({cfg.init_from}) does not fit this run: {e}") from None
    run.drafter = run.drafter.bind(run.target).to(d.device)
    if not 0 <= run.meta.mask_token_id < run.drafter.shared.embed.weight.shape[0]:
        raise TrainInputError(f"the training set's mask_token_id {run.meta.mask_token_id} is not a row of the "
                              "target's embedding: re-run tokenize and merge for this target")
    run.optimizer = adamw(run.drafter.parameters(), cfg.lr, cfg.adam_betas, cfg.weight_decay)


def cache_features(run: Run) -> None:
    """The target's features of every row, computed once, when they fit ``train.feature_cache_gb`` (else online)."""
    cfg, d = run.cfg, run.d
    dtype = next(run.target.parameters()).dtype
    hidden = run.target.config.get_text_config().hidden_size
    width, final_width = len(run.drafter.target_layer_ids) * hidden, hidden if run.needs_final else 0
    size = cache_bytes(run.plan, width, dtype.itemsize, final_width, run.chain_depth)
    if size > cfg.feature_cache_gb * GB:
        if d.main:
            log.info("target features computed online at every step: every row's would take %.2f GB, over "
                     "train.feature_cache_gb=%s", size / GB, cfg.feature_cache_gb)
        return

    def features_of(row: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        with torch.autocast(d.device.type, dtype=torch.bfloat16, enabled=run.autocast):
            return pack_features(run.target, run.batch(np.array([row])), run.drafter.target_layer_ids,
                                 run.needs_final)

    def chains_of(row: int) -> torch.Tensor:
        batch = run.batch(np.array([row]))
        with torch.autocast(d.device.type, dtype=torch.bfloat16, enabled=run.autocast):
            return pack_chains(run.target, batch.input_ids, batch.loss_mask, batch.row_of, run.chain_depth)

    run.features = FeatureCache.fill(run.plan, features_of, width, final_width, dtype, d.device, show=d.main,
                                     chains_of=chains_of if run.chain_depth else None, chain_depth=run.chain_depth)


def step_generator(seed: int, step: int, rank: int) -> torch.Generator:
    """The anchor RNG of one step on one rank: a function of (seed, step, rank), so resuming restores it exactly."""
    key = xxhash.xxh64_intdigest(f"{seed}/{step}/{rank}".encode()) & ((1 << 63) - 1)
    return torch.Generator().manual_seed(key)


def _shapes(target: torch.nn.Module, drafter: DFlashDrafter, act_bytes: int, cached: int) -> Shapes:
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
        resident_bytes=cached,
    )


def check_memory(run: Run) -> Preflight:
    """Refuse to start when the worst pack's peak memory exceeds ``memory_limit_gb`` (measured on a GPU)."""
    cfg, d, plan = run.cfg, run.d, run.plan

    def measure(index: int) -> int:
        rows = plan.batch_rows(index // d.world, index % d.world)
        torch.cuda.reset_peak_memory_stats(d.device)
        run.loss(run.drafter, rows, run.batch(rows), torch.Generator().manual_seed(cfg.seed)).loss.backward()
        run.drafter.zero_grad(set_to_none=True)
        # Adam's two moments are allocated at the first real step: add them.
        return torch.cuda.max_memory_allocated(d.device) + 8 * sum(p.numel() for p in run.drafter.parameters())

    def packs_at(budget: int) -> list[tuple[int, int, int]]:
        shuffled = plan.packs(0)  # any epoch's rows: the packing at another budget, of the same order
        return pack_shapes(pack_rows(np.concatenate(shuffled), plan.stats.lengths, budget), plan.stats,
                           cfg.anchors_per_seq)

    check = preflight(
        _shapes(run.target, run.drafter, 2 if run.autocast else 4, run.feature_bytes),
        plan.pack_shapes(run.steps_total, cfg.anchors_per_seq), limit_gb=cfg.memory_limit_gb,
        budget=cfg.max_tokens_per_batch, packs_at=packs_at, measure=measure if d.device.type == "cuda" else None,
    )
    if d.main:
        log.info("memory preflight passed: %s", check.as_dict())
    return check


def resume(run: Run, folder: Path) -> Progress:
    """The newest state in ``folder`` loaded into the run, or a fresh start."""
    progress = Progress(window=np.zeros((0, window_width(run.cfg.block_size))))
    state = load_latest(folder)
    if state is None:
        return progress
    run.drafter.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    progress = Progress(state["step"], state["history"], state["window"].numpy(), state["tokens"], state["seconds"],
                        state["nonfinite"])
    if run.d.main:
        log.info("resuming from step %d of %d (%s)", progress.step, run.steps_total, folder)
    return progress


def fit(run: Run, progress: Progress, folder: Path) -> None:
    """Train from ``progress.step`` to the end, logging every ``log_every`` and saving every ``save_every`` steps."""
    cfg, d, B = run.cfg, run.d, run.cfg.block_size
    model = DistributedDataParallel(run.drafter) if d.world > 1 else run.drafter
    model.train()
    bar = tqdm(total=run.steps_total, initial=progress.step, desc="train", disable=not d.main, dynamic_ncols=True)
    t0, tokens_at_t0, seconds_at_t0 = time.perf_counter() - progress.seconds, progress.tokens, progress.seconds
    for step in range(progress.step, run.steps_total):
        row, lr, grad_norm = train_step(run, model, step)
        if not (math.isfinite(float(row[0])) and math.isfinite(grad_norm)):
            skip_nonfinite(run, progress, folder, step, float(row[0]), grad_norm)
        else:
            progress.tokens += int(row[1])
            progress.window = np.vstack([progress.window, row.numpy()])
        if d.main:
            rate = (progress.tokens - tokens_at_t0) / max(time.perf_counter() - t0 - seconds_at_t0, 1e-9)
            bar.set_postfix(loss=f"{row[0]:.3f}", tok_s=f"{rate:.0f}")
            bar.update(1)
        progress.step = done = step + 1
        progress.seconds = time.perf_counter() - t0
        if (done % cfg.log_every == 0 or done == run.steps_total) and len(progress.window):
            progress.history.append(_history_row(done, run.plan.epochs_at(done), lr, grad_norm, progress.window, B))
            progress.window = np.zeros((0, window_width(B)))
        if d.main and (done % cfg.save_every == 0 or done == run.steps_total):
            save(run, folder, done, progress)
    bar.close()


def save(run: Run, folder: Path, step: int, progress: Progress) -> None:
    save_state(folder, step, {"model": run.drafter.state_dict(), "optimizer": run.optimizer.state_dict(),
                              **progress.state()})


def train_step(run: Run, model: torch.nn.Module, step: int) -> tuple[torch.Tensor, float, float]:
    """One optimiser step; returns ``[loss, tokens, correct per position, counted per position]`` (summed over
    ranks, loss averaged), the learning rate used (``lr_at`` of this step) and the gradient norm before clipping.
    A non-finite loss or gradient norm (on any rank: the sums carry it) leaves the weights as they were: no optimiser
    step is taken."""
    lr = lr_at(step, run.cfg.lr, run.steps_total, run.warmup, run.cfg.min_lr_ratio)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    rows = run.plan.batch_rows(step, run.d.rank)
    batch = run.batch(rows)
    stats = run.loss(model, rows, batch, step_generator(run.cfg.seed, step, run.d.rank), step)
    run.optimizer.zero_grad(set_to_none=True)
    stats.loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(run.drafter.parameters(), run.cfg.grad_clip)
    row = torch.cat([torch.tensor([stats.loss.item(), float(batch.num_tokens), float(grad_norm)]),
                     stats.correct.cpu(), stats.counted.cpu(), stats.selector.cpu()])
    if run.d.world > 1:
        dist.all_reduce(row)
        row[0] /= run.d.world
        row[2] /= run.d.world
        row[3 + 2 * run.cfg.block_size] /= run.d.world  # the selector loss: a mean, like the loss
    if math.isfinite(float(row[0])) and math.isfinite(float(row[2])):
        run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    grad_norm = float(row[2])
    return torch.cat([row[:2], row[3:]]), lr, grad_norm


def skip_nonfinite(run: Run, progress: Progress, folder: Path, step: int, loss: float, grad_norm: float) -> None:
    """Count a batch whose loss or gradient is not finite; past ``train.skip_nonfinite`` save the last good state
    (the weights before this step) and raise :class:`NonFiniteError` naming the step and the batch's rows."""
    progress.nonfinite += 1
    rows = [int(r) for r in run.plan.batch_rows(step, run.d.rank)]
    ids = run.dataset.select_columns(["id"])[rows]["id"]
    log.warning("step %d: loss %s, grad norm %s on rows %s (ids %s)", step + 1, loss, grad_norm, rows[:8], ids[:8])
    if progress.nonfinite <= run.cfg.skip_nonfinite:
        return
    if run.d.main:
        save(run, folder, step, progress)
    raise NonFiniteError(
        f"step {step + 1}: loss {loss} / gradient norm {grad_norm} is not finite on the batch of rows {rows[:16]} "
        f"(ids {ids[:16]}); the last good state (step {step}) is saved in {folder}. A NaN target (check its weights) "
        f"or a row the target cannot encode; set train.skip_nonfinite to skip up to that many such batches"
    )


def window_width(B: int) -> int:
    """Columns of a step's row: loss, tokens, B correct, B counted, 4 selector figures (see ``train_step``)."""
    return 2 * B + 6


def _history_row(step: int, epochs: float, lr: float, grad_norm: float, window: np.ndarray, B: int) -> dict:
    """One line of the loss curve (the stage's ``--plot``): means over the steps since the previous line; DFlash 2
    adds its selector's loss, top-K recall (the gold among the candidates) and accuracy (the selector picks it)."""
    correct, counted = window[:, 2 : 2 + B].sum(0), window[:, 2 + B : 2 + 2 * B].sum(0)
    selector = window[:, 2 + 2 * B :]
    extra = {}
    if selector[:, 3].sum() > 0:
        extra = {"selector_loss": round(float(selector[:, 0].mean()), 6),
                 "topk_recall": round(float(selector[:, 1].sum() / selector[:, 3].sum()), 6),
                 "selector_accuracy": round(float(selector[:, 2].sum() / selector[:, 3].sum()), 6)}
    return {
        "step": step,
        "epoch": round(epochs, 4),
        "loss": round(float(window[:, 0].mean()), 6),
        "accuracy_pos1": round(float(correct[1] / max(counted[1], 1)), 6),
        "lr": float(f"{lr:.6g}"),
        "grad_norm": round(grad_norm, 6),
        **extra,
    }


def drafter_digest(folder: str | Path) -> str:
    """A digest of a starting drafter's files (train.init_from), so a changed drafter never resumes another's states."""
    h = xxhash.xxh64()
    for f in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def checkpoint_dtype(info: TargetInfo) -> torch.dtype:
    """The dtype the target's checkpoint stores its weights in (config.json ``dtype``, or 4.5x's ``torch_dtype``)."""
    config = json.loads((Path(info.path) / "config.json").read_text(encoding="utf-8"))
    name = config.get("dtype") or config.get("torch_dtype") or (config.get("text_config") or {}).get("dtype")
    dtype = getattr(torch, str(name), None) if name else torch.float32
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TrainInputError(f"{info.path}/config.json names dtype {name!r}, which is not a torch float dtype: "
                              "point target.path at a checkpoint of float weights")
    return dtype


def finish(run: Run, progress: Progress, check: Preflight, args: TrainArgs, stage: StageRun) -> None:
    """Fill ``stage`` (every rank: their figures are the same); on rank 0 also write the checkpoint and the loss curve.

    Headline: ``steps``, ``rows``, ``final_loss`` and ``accuracy_pos1`` (means over the last tenth of the history).
    Report: those and every other deterministic figure. Run file: the speed and time, which vary between runs."""
    cfg, plan, history = run.cfg, run.plan, progress.history
    tail = history[-max(1, len(history) // 10):]
    stage.headline.update(
        steps=run.steps_total,
        rows=int(len(plan.rows)),
        final_loss=round(float(np.mean([h["loss"] for h in tail])), 6),
        accuracy_pos1=round(float(np.mean([h["accuracy_pos1"] for h in tail])), 6),
    )
    stage.details.update(
        **stage.headline,
        epochs=round(plan.epochs_at(run.steps_total), 4),
        loss_tokens_kept=plan.stats.kept_loss_tokens,
        loss_tokens_cut=plan.stats.cut_loss_tokens,
        first_loss=history[0]["loss"],
        train_tokens=progress.tokens,
        nonfinite_batches_skipped=progress.nonfinite,
        drafter_params=sum(p.numel() for p in run.drafter.parameters()),
        target_layer_ids=list(run.drafter.target_layer_ids),
        block_size=cfg.block_size,
        architecture=cfg.architecture,
        init_from=run.started_from,
        preflight=check.as_dict(),
        target_features="cached" if run.features is not None else "online",
        feature_cache_gb=round(run.feature_bytes / GB, 4),
    )
    if "selector_accuracy" in history[-1]:
        stage.details.update({k: round(float(np.mean([h[k] for h in tail])), 6)
                              for k in ("selector_loss", "topk_recall", "selector_accuracy")})
    stage.run.update(
        tokens_per_s=round(progress.tokens / max(progress.seconds, 1e-9), 1),
        train_seconds=round(progress.seconds, 2),
    )
    if run.d.main:
        # Saved in the target's dtype (fp32 master weights stay in the resumable states): servers and z-lab's
        # loader run a drafter beside a bf16 target in bf16, and SGLang's --dtype auto reads it from config.json.
        run.drafter.save_pretrained(args.out, dtype=checkpoint_dtype(run.info))
        write_csv(args.plot, history, columns=list(history[0]))
        log.info("trained %d steps in %.1fs; final loss %.4f", run.steps_total, progress.seconds,
                 stage.headline["final_loss"])
