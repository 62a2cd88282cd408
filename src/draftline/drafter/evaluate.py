"""Judging a drafter the way it will be used: speculative decoding of held-out prompts, verified by the target.

For every eval prompt, rendered exactly as the generate stage sent it to the target, the target decodes greedily
twice: alone, and verifying the drafter's blocks. The outputs must be identical (``lossless``); what the drafter
is worth is ``tau``, the tokens produced per target verification step, and the target forward passes it saves.
Training accuracy says little: a render or thinking-mode mismatch keeps it high while tau collapses.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftline.drafter.model import DFlashDrafter
from draftline.drafter.speculative import (
    DFlashProposer,
    Generation,
    Proposer,
    greedy_generate,
    speculative_generate,
)
from draftline.files import iter_jsonl, write_csv, write_json
from draftline.generate.local import render_prompt as render_chat_prompt
from draftline.logs import get_logger
from draftline.params import check_keys
from draftline.records import PromptRecord, TargetInfo
from draftline.skips import Skips
from draftline.target import load_model, load_target, load_tokenizer

log = get_logger(__name__)

ACCEPTANCE_COLUMNS = ["position", "steps", "accepted", "accept_rate", "conditional_rate"]


@dataclass
class EvalParams:
    """The ``evaluate`` section of params.yaml (see docs/evaluate.md), plus ``generate.enable_thinking``."""

    max_new_tokens: int = 128
    max_prompts_per_source: int = 16
    max_prompt_tokens: int = 2048
    device: str = "auto"
    dtype: str = "float32"
    require_lossless: bool = True
    strict: bool = False
    threads: int = 1
    enable_thinking: bool = False

    @classmethod
    def from_params(cls, evaluate: dict[str, Any], generate: dict[str, Any]) -> "EvalParams":
        """``evaluate`` section, and the thinking mode the prompts were generated in (never a default: a mismatch
        would silently lower tau)."""
        check_keys(evaluate, cls, "evaluate", exclude=("enable_thinking",))
        if "enable_thinking" not in generate:
            raise ValueError("params.yaml: generate.enable_thinking is missing; evaluate renders prompts in that mode")
        return cls(**evaluate, enable_thinking=bool(generate["enable_thinking"]))


@dataclass
class PromptResult:
    id: str
    source: str
    prompt_tokens: int
    baseline: Generation
    speculative: Generation

    @property
    def identical(self) -> bool:
        return self.baseline.tokens == self.speculative.tokens


def load_eval_prompts(path: str | os.PathLike, max_per_source: int, skips: Skips) -> list[PromptRecord]:
    """The first ``max_per_source`` valid records of each source, in file order (the prompt stage's order)."""
    taken: dict[str, int] = defaultdict(int)
    records = []
    for lineno, value, error in iter_jsonl(path):
        where = f"{path}:{lineno}"
        if error:
            skips.add("invalid JSON", where, error)
            continue
        if not isinstance(value, dict) or not isinstance(value.get("messages"), list) or not value["messages"]:
            skips.add("no messages", where)
            continue
        try:
            rec = PromptRecord.from_dict(value)
        except TypeError as e:
            skips.add("not a PromptRecord", where, str(e))
            continue
        if taken[rec.source] < max_per_source:
            taken[rec.source] += 1
            records.append(rec)
    return records


def render_prompt(tokenizer: PreTrainedTokenizerBase, record: PromptRecord, enable_thinking: bool) -> list[int]:
    """The prompt's token ids as the target saw them in generation: the generate stage's own render function.

    The text is tokenized without special tokens, as ``apply_chat_template(tokenize=True)`` and SGLang do; a
    different render here is the first suspect when tau is low.
    """
    text = render_chat_prompt(tokenizer, record.messages, record.tools, enable_thinking)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def stop_token_ids(info: TargetInfo) -> set[int]:
    """Decoding ends at the end-of-turn token (a chat reply's end) or at eos."""
    return {info.eos_token_id, info.end_of_turn_token_id}


def evaluate_prompts(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    proposer: Proposer,
    records: list[PromptRecord],
    stop_ids: set[int],
    params: EvalParams,
    skips: Skips,
) -> list[PromptResult]:
    """Decode every record with the target alone and with the proposer; prompts that cannot be rendered are skipped."""
    results = []
    spent = {"baseline": 0.0, "speculative": 0.0}
    bar = tqdm(records, desc="evaluate", unit="prompt")
    for rec in bar:
        try:
            ids = render_prompt(tokenizer, rec, params.enable_thinking)
        except Exception as e:  # a template error names one bad prompt; the rest still count
            skips.add("chat template failed", rec.id, f"{type(e).__name__}: {e}")
            continue
        if len(ids) > params.max_prompt_tokens:
            skips.add("prompt longer than max_prompt_tokens", rec.id, f"{len(ids)} tokens")
            continue
        t0 = time.perf_counter()
        base = greedy_generate(target, ids, params.max_new_tokens, stop_ids)
        t1 = time.perf_counter()
        spec = speculative_generate(target, proposer, ids, params.max_new_tokens, stop_ids)
        spent["baseline"] += t1 - t0
        spent["speculative"] += time.perf_counter() - t1
        results.append(PromptResult(rec.id, rec.source, len(ids), base, spec))
        if not results[-1].identical:
            at = next((i for i, (a, b) in enumerate(zip(base.tokens, spec.tokens)) if a != b), None)
            log.error("prompt %s: speculative output differs from target-only greedy at token %s", rec.id, at)
        steps = sum(r.speculative.steps for r in results)
        bar.set_postfix(tau=f"{sum(sum(r.speculative.produced) for r in results) / max(steps, 1):.2f}")
    # Wall time depends on the machine, so it is logged, never written to the metrics.
    if spent["speculative"]:
        log.info("wall time: target-only %.1fs, speculative %.1fs (speed-up %.2fx)",
                 spent["baseline"], spent["speculative"], spent["baseline"] / spent["speculative"])
    return results


def _tau(results: list[PromptResult]) -> float | None:
    steps = sum(r.speculative.steps for r in results)
    return round(sum(sum(r.speculative.produced) for r in results) / steps, 4) if steps else None


def summarize(results: list[PromptResult], block_size: int, skips: Skips, params: EvalParams) -> dict[str, Any]:
    """``metrics/eval.json``: tau pooled over all verification steps, per source, losslessness and forwards saved."""
    by_source: dict[str, list[PromptResult]] = defaultdict(list)
    for r in results:
        by_source[r.source].append(r)
    with_drafter = sum(r.speculative.target_forwards for r in results)
    without = sum(r.baseline.target_forwards for r in results)
    steps = sum(r.speculative.steps for r in results)
    return {
        "n_prompts": len(results),
        "n_prompts_per_source": {s: len(rs) for s, rs in sorted(by_source.items())},
        "tau": _tau(results),
        "tau_per_source": {s: _tau(rs) for s, rs in sorted(by_source.items())},
        "lossless": round(sum(r.identical for r in results) / len(results), 4) if results else None,
        "mismatched_prompts": sorted(r.id for r in results if not r.identical),
        "target_forwards": {
            "with_drafter": with_drafter,
            "without_drafter": without,
            "saved_fraction": round(1 - with_drafter / without, 4) if without else None,
        },
        "verification_steps": steps,
        "mean_accepted_drafts": round(sum(sum(r.speculative.accepted) for r in results) / steps, 4) if steps else None,
        "generated_tokens": sum(len(r.speculative.tokens) for r in results),
        "stop_reasons": dict(sorted(Counter(r.speculative.stop_reason for r in results).items())),
        "block_size": block_size,
        "max_new_tokens": params.max_new_tokens,
        "enable_thinking": params.enable_thinking,
        "skipped": skips.as_dict(),
    }


def acceptance_by_position(results: list[PromptResult], block_size: int) -> list[dict[str, Any]]:
    """Per draft position k: how often the target accepted it (``accept_rate``), and how often when k-1 was.

    Position k is accepted when the first k drafts all match; a falling ``conditional_rate`` shows where in the
    block the drafter loses the thread.
    """
    pairs = [(a, d) for r in results for a, d in zip(r.speculative.accepted, r.speculative.drafted)]
    rows = []
    for k in range(1, block_size):
        steps = sum(1 for _, d in pairs if d >= k)
        reached = sum(1 for a, d in pairs if d >= k and a >= k - 1)
        accepted = sum(1 for a, _ in pairs if a >= k)
        rows.append({
            "position": k,
            "steps": steps,
            "accepted": accepted,
            "accept_rate": round(accepted / steps, 4) if steps else 0.0,
            "conditional_rate": round(accepted / reached, 4) if reached else 0.0,
        })
    return rows


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)


def load_models(
    info: TargetInfo, checkpoint: str | os.PathLike, params: EvalParams
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, DFlashDrafter]:
    """The target (from its folder, in place) and the drafter bound to it, on one device in one dtype."""
    if params.dtype != "auto" and params.dtype not in _DTYPES:
        raise ValueError(f"evaluate.dtype must be auto or one of {sorted(_DTYPES)}, got {params.dtype!r}")
    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.json").is_file():
        raise FileNotFoundError(f"no drafter in {checkpoint} (config.json missing): run the train stage first")
    device = resolve_device(params.device)
    target = load_model(info, dtype="auto" if params.dtype == "auto" else _DTYPES[params.dtype], device=device)
    tokenizer = load_tokenizer(info)
    drafter = DFlashDrafter.from_pretrained(checkpoint, target).to(target.dtype)
    n_target = target.config.get_text_config().num_hidden_layers
    if int(getattr(drafter.config, "num_target_layers", n_target)) != n_target:
        raise ValueError(
            f"the drafter in {checkpoint} was trained on a {drafter.config.num_target_layers}-layer target, "
            f"but {info.path} has {n_target} layers: retrain it for this target"
        )
    if drafter.mask_token_id != info.mask_token_id:
        log.warning("the drafter's mask token %d is not target.json's %d: was it trained for another target?",
                    drafter.mask_token_id, info.mask_token_id)
    return target, tokenizer, drafter


def run_evaluate(
    params: EvalParams,
    target_dir: str | os.PathLike,
    checkpoint: str | os.PathLike,
    prompts_path: str | os.PathLike,
    metrics_path: str | os.PathLike,
    plot_path: str | os.PathLike,
) -> dict[str, Any]:
    """The evaluate stage: write ``metrics/eval.json`` and the acceptance-by-position plot; return the metrics.

    Fails (after writing both, so they can be read) when an output differs from target-only greedy decoding and
    ``require_lossless`` is set: that is a bug in verification, or, in bf16, numerics flipping a near-tie.
    """
    info = load_target(target_dir)
    skips = Skips(log, strict=params.strict)
    records = load_eval_prompts(prompts_path, params.max_prompts_per_source, skips)
    if not records:
        raise ValueError(f"{prompts_path} holds no usable eval prompts (skipped: {skips.as_dict()})")
    # Batch-1 decoding of a small model is latency-bound: on a busy CPU, extra OpenMP threads only spin
    # (measured: 2 threads 15x slower than 1 on a loaded 2-core box).
    threads = torch.get_num_threads()
    if params.threads > 0:
        torch.set_num_threads(params.threads)
    try:
        return _evaluate(params, info, checkpoint, records, skips, metrics_path, plot_path)
    finally:
        torch.set_num_threads(threads)


def _evaluate(
    params: EvalParams,
    info: TargetInfo,
    checkpoint: str | os.PathLike,
    records: list[PromptRecord],
    skips: Skips,
    metrics_path: str | os.PathLike,
    plot_path: str | os.PathLike,
) -> dict[str, Any]:
    target, tokenizer, drafter = load_models(info, checkpoint, params)
    log.info("evaluating %d prompts, block size %d, enable_thinking=%s on %s",
             len(records), drafter.block_size, params.enable_thinking, target.device)
    results = evaluate_prompts(
        target, tokenizer, DFlashProposer(drafter), records, stop_token_ids(info), params, skips
    )
    if not results:
        raise ValueError(f"every eval prompt was skipped ({skips.as_dict()}); raise evaluate.max_prompt_tokens?")
    metrics = summarize(results, drafter.block_size, skips, params)
    write_csv(plot_path, acceptance_by_position(results, drafter.block_size), ACCEPTANCE_COLUMNS)
    write_json(metrics_path, metrics)
    log.info("tau %.3f over %d steps, lossless %.3f, target forwards saved %.1f%%", metrics["tau"] or 0.0,
             metrics["verification_steps"], metrics["lossless"], 100 * (metrics["target_forwards"]["saved_fraction"] or 0))
    if params.require_lossless and metrics["lossless"] < 1.0:
        raise RuntimeError(
            f"speculative decoding changed the output of {len(metrics['mismatched_prompts'])} prompt(s) "
            f"{metrics['mismatched_prompts'][:5]}: greedy verification must be lossless. In float32 this is a bug; "
            "in bf16/fp16 it can be numerics (set evaluate.dtype: float32 to tell them apart)"
        )
    return metrics
