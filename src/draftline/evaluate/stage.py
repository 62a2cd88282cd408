"""Judging a drafter the way it will be used: speculative decoding of held-out prompts, verified by the target.

For every eval prompt, rendered exactly as the generate stage sent it to the target, the target decodes greedily
twice: alone, and verifying the drafter's blocks. The outputs must be identical (``lossless``); what the drafter
is worth is ``tau``, the tokens produced per target verification step, and the target forward passes it saves.
Training accuracy says little: a render or thinking-mode mismatch keeps it high while tau collapses.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftline.core.chat import render
from draftline.core.errors import MissingInput, Refusal
from draftline.core.files import write_csv
from draftline.core.logs import get_logger
from draftline.core.records import PromptRecord, TargetInfo, read_prompts
from draftline.core.runner import StageArgs, StageRun
from draftline.core.skips import Skips
from draftline.core.target import load_model, load_target, load_tokenizer
from draftline.core.threads import torch_threads
from draftline.drafter.decoding import DFlashProposer, Proposer, greedy_generate, speculative_generate
from draftline.drafter.model import DFlashDrafter, DrafterMismatch, lineage_of
from draftline.evaluate.params import EvalParams
from draftline.evaluate.report import (
    ACCEPTANCE_COLUMNS,
    PromptResult,
    acceptance_by_position,
    headline,
    summarize,
)

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class EvalArgs(StageArgs):
    """``stages/evaluate.py``'s paths (dvc.yaml passes them)."""

    checkpoint: Path  # the drafter's folder (the train stage's output)
    target: Path  # the target's target.json
    prompts: Path  # the eval prompts (eval.jsonl of the prompts stage)
    metrics: Path
    plot: Path  # acceptance by draft position


class NotLossless(Refusal, RuntimeError):
    """Speculative decoding changed an output and ``evaluate.require_lossless`` is set: the message names the
    prompts and how to tell a bug from bf16 numerics."""


def load_eval_prompts(path: str | os.PathLike, max_per_source: int, skips: Skips) -> list[PromptRecord]:
    """The first ``max_per_source`` valid records of each source, in file order (the prompt stage's order)."""
    taken: dict[str, int] = defaultdict(int)
    records = []
    for rec in read_prompts(path, skips):
        if taken[rec.source] < max_per_source:
            taken[rec.source] += 1
            records.append(rec)
    return records


def render_prompt(tokenizer: PreTrainedTokenizerBase, record: PromptRecord, enable_thinking: bool | None) -> list[int]:
    """The prompt's token ids as the target saw them in generation: the one render (:mod:`draftline.core.chat`).

    The text is tokenized without special tokens, as ``apply_chat_template(tokenize=True)`` and SGLang do; a
    different render here is the first suspect when tau is low.
    """
    text = render(tokenizer, record.messages, record.tools, enable_thinking=enable_thinking, generation_prompt=True)
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
    enable_thinking: bool | None,
    skips: Skips,
) -> tuple[list[PromptResult], dict[str, float]]:
    """Decode every record with the target alone and with the proposer; prompts that cannot be rendered are skipped.
    Returns the results and the wall seconds spent decoding each way (``baseline``, ``speculative``)."""
    results = []
    spent = {"baseline": 0.0, "speculative": 0.0}
    bar = tqdm(records, desc="evaluate", unit="prompt")
    for rec in bar:
        try:
            ids = render_prompt(tokenizer, rec, enable_thinking)
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
    # Wall time depends on the machine (and its load): the run file has it, never the metrics or the report.
    if spent["speculative"]:
        log.info("CPU wall clock: target-only %.1f s, speculative %.1f s: a %.2fx speed-up. What that means here: this "
                 "target is tiny, so one drafter forward costs about as much as one target forward and every step pays "
                 "both; beside a large target on a GPU the drafter is a small fraction of a target forward, and tau "
                 "(tokens per target forward) is the figure that carries over", spent["baseline"],
                 spent["speculative"], spent["baseline"] / spent["speculative"])
    return results, spent


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)


def check_lineage(checkpoint: Path, info: TargetInfo) -> dict[str, Any]:
    """The checkpoint's lineage (see :func:`draftline.drafter.model.lineage_of`), checked against the target."""
    from transformers import PretrainedConfig

    lineage = lineage_of(PretrainedConfig.from_json_file(str(checkpoint / "config.json")))
    if lineage["tokenizer_fingerprint"] != info.tokenizer_fingerprint:
        raise DrafterMismatch(
            f"the drafter in {checkpoint} was trained on data of another tokenizer (fingerprint "
            f"{lineage['tokenizer_fingerprint'][:12]}) than the target's ({info.tokenizer_fingerprint[:12]}): "
            "retrain it for this target"
        )
    return lineage


def load_models(
    info: TargetInfo, checkpoint: str | os.PathLike, params: EvalParams
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, DFlashDrafter]:
    """The target (from its folder, in place) and the drafter bound to it, on one device in one dtype.

    A drafter whose training data was made with another tokenizer than the target's is refused: its ids would
    mean other tokens."""
    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.json").is_file():
        raise MissingInput(f"no drafter in {checkpoint} (config.json missing): run the train stage first")
    check_lineage(checkpoint, info)
    device = resolve_device(params.device)
    target = load_model(info, dtype="auto" if params.dtype == "auto" else _DTYPES[params.dtype], device=device)
    tokenizer = load_tokenizer(info)
    drafter = DFlashDrafter.from_pretrained(checkpoint, target).to(target.dtype)
    n_target = target.config.get_text_config().num_hidden_layers
    if int(getattr(drafter.config, "num_target_layers", n_target)) != n_target:
        raise DrafterMismatch(
            f"the drafter in {checkpoint} was trained on a {drafter.config.num_target_layers}-layer target, "
            f"but {info.path} has {n_target} layers: retrain it for this target"
        )
    if drafter.mask_token_id != info.mask_token_id:
        log.warning("the drafter's mask token %d is not target.json's %d: was it trained for another target?",
                    drafter.mask_token_id, info.mask_token_id)
    return target, tokenizer, drafter


def run_evaluate(p: EvalParams, args: EvalArgs, stage: StageRun) -> None:
    """The evaluate stage: the acceptance-by-position plot, and ``stage`` filled (headline ``tau``, ``tau_min``,
    ``lossless``; the report every figure; the run file the wall clock of both decodings).

    Refuses (after writing the plot; the log has tau and lossless) when an output differs from target-only greedy
    decoding and ``require_lossless`` is set: that is a bug in verification, or, in bf16, numerics flipping a near-tie.
    """
    info = load_target(args.target)
    stage.skips.strict = p.strict
    if not args.prompts.is_file():
        raise MissingInput(f"{args.prompts} does not exist: run the prompts stage first (dvc repro prompts)")
    records = load_eval_prompts(args.prompts, p.max_prompts_per_source, stage.skips)
    if not records:
        raise Refusal(f"{args.prompts} holds no usable eval prompts (skipped: {stage.skips.as_dict()}): "
                      "re-run the prompts stage")
    # Batch-1 decoding of a small model is latency-bound: on a busy CPU, extra OpenMP threads only spin
    # (measured: 2 threads 15x slower than 1 on a loaded 2-core box).
    with torch_threads(p.threads):
        _evaluate(p, info, args, records, stage)


def _evaluate(p: EvalParams, info: TargetInfo, args: EvalArgs, records: list[PromptRecord], stage: StageRun) -> None:
    target, tokenizer, drafter = load_models(info, args.checkpoint, p)
    # The prompts are rendered in the thinking mode the training data was generated in (null: the template's own).
    thinking = lineage_of(drafter.config)["enable_thinking"]
    log.info("evaluating %d prompts, block size %d, enable_thinking=%s (the training data's) on %s",
             len(records), drafter.block_size, thinking, target.device)
    results, spent = evaluate_prompts(
        target, tokenizer, DFlashProposer(drafter), records, stop_token_ids(info), p, thinking, stage.skips
    )
    if not results:
        raise Refusal(f"every eval prompt was skipped ({stage.skips.as_dict()}): raise evaluate.max_prompt_tokens?")
    details = summarize(results, drafter.block_size, p.max_new_tokens, thinking)
    stage.details.update(details)
    stage.headline.update(headline(details))
    stage.run.update(baseline_seconds=round(spent["baseline"], 2), speculative_seconds=round(spent["speculative"], 2),
                     speedup=round(spent["baseline"] / spent["speculative"], 3) if spent["speculative"] else None)
    write_csv(args.plot, acceptance_by_position(results, drafter.block_size), ACCEPTANCE_COLUMNS)
    log.info("tau %.3f (lowest source %.3f) over %d steps, lossless %.3f, target forwards saved %.1f%%",
             details["tau"] or 0.0, stage.headline["tau_min"] or 0.0, details["verification_steps"],
             details["lossless"], 100 * (details["target_forwards"]["saved_fraction"] or 0))
    if p.require_lossless and details["lossless"] < 1.0:
        raise NotLossless(
            f"speculative decoding changed the output of {len(details['mismatched_prompts'])} prompt(s) "
            f"{details['mismatched_prompts'][:5]}: greedy verification must be lossless. In float32 this is a bug; "
            "in bf16/fp16 it can be numerics (set evaluate.dtype: float32 to tell them apart)"
        )
