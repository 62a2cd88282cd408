"""Judging a drafter the way it will be served: speculative decoding of held-out prompts and benchmark sets,
verified by the target, under every decoding setting of ``evaluate.sampling`` (greedy and sampled).

For every request, rendered exactly as the generate stage sent prompts to the target (in the training data's
thinking mode), the target verifies the drafter's blocks: greedy by argmax, sampled by rejection sampling (the
output keeps the target's distribution, :mod:`draftline.drafter.decoding`). Greedy settings also check every
output against target-only greedy decoding (``lossless``): each token must be the target's argmax given the tokens
before it, read from one forward of the target over the prompt and the output (``greedy_reference``: what the
target alone emits, at one forward instead of one per token; a third of the stage's time before). What the drafter is worth is its acceptance: z-lab's
figure (the one model cards quote) and the pooled tau, per set and per source (:mod:`draftline.evaluate.report`).
Training accuracy says little: a render or thinking-mode mismatch keeps it high while acceptance collapses.

Invariants: every random draw comes from a seed of (``evaluate.seed``, setting, request, turn), so a rerun on the
same machine writes the same bytes; wall-clock times go to the run file only.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import xxhash
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftline.core.chat import render
from draftline.core.errors import MissingInput, Refusal
from draftline.core.files import atomic_path, write_csv, write_jsonl
from draftline.core.logs import get_logger
from draftline.core.records import TargetInfo, read_conversations, read_prompts
from draftline.core.runner import StageArgs, StageRun
from draftline.core.skips import Skips
from draftline.core.splits import TEST
from draftline.core.target import load_model, load_target, load_tokenizer
from draftline.core.threads import torch_threads
from draftline.drafter.config import lineage_of
from draftline.drafter.decoding import DFlashProposer, Proposer, Sampling, greedy_reference, speculative_generate
from draftline.drafter.fit import check_lineage, load_fitting, resolve_device, torch_dtype
from draftline.drafter.model import DFlashDrafter
from draftline.evaluate.params import EvalParams
from draftline.evaluate.report import (
    ACCEPTANCE_COLUMNS,
    HISTOGRAM_COLUMNS,
    INTERVAL_COLUMNS,
    TurnResult,
    acceptance_by_position,
    figures,
    headline,
    histogram_rows,
    interval_rows,
    selector_counts,
    step_record,
    summarize,
)
from draftline.evaluate.requests import Request, heldout_requests, set_requests

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class EvalArgs(StageArgs):
    """``stages/evaluate.py``'s paths (dvc.yaml passes them)."""

    checkpoint: Path  # the drafter's folder (the train stage's output)
    target: Path  # the target's target.json
    prompts: Path  # the held-out prompts (eval.jsonl of the prompts stage)
    sets: Path  # the benchmark sets' conversations: <sets>/<name>/conversations.jsonl for each evaluate.sets name
    metrics: Path
    positions: Path  # folder: the acceptance rate by draft position, one CSV per setting
    lengths: Path  # folder: the histogram of acceptance lengths, one CSV per setting
    intervals: Path  # folder: each set's and source's acceptance with its interval, per split, one CSV per setting
    steps: Path  # JSONL: every turn's drafted / accepted / produced counts per verification step


class NotLossless(Refusal, RuntimeError):
    """Speculative decoding changed a greedy output and ``evaluate.require_lossless`` is set: the message names the
    prompts and how to tell a bug from bf16 numerics."""


def load_requests(p: EvalParams, args: EvalArgs, skips: Skips) -> list[Request]:
    """The held-out prompts (capped per source), then every set's requests, in evaluate.sets order."""
    if not args.prompts.is_file():
        raise MissingInput(f"{args.prompts} does not exist: run the prompts stage first (dvc repro prompts)")
    requests = heldout_requests(read_prompts(args.prompts, skips), p.max_prompts_per_source)
    for name in p.sets:
        path = args.sets / name / "conversations.jsonl"
        if not path.is_file():
            raise MissingInput(f"{path} does not exist: run its stages first (dvc repro set_conversations@{name})")
        requests += set_requests(name, read_conversations(path, skips), skips)
    return requests


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: list, tools: list | None,
                  enable_thinking: bool | None) -> list[int]:
    """The prompt's token ids as the target saw them in generation: the one render (:mod:`draftline.core.chat`).

    The text is tokenized without special tokens, as ``apply_chat_template(tokenize=True)`` and SGLang do; a
    different render here is the first suspect when tau is low.
    """
    text = render(tokenizer, messages, tools, enable_thinking=enable_thinking, generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def stop_token_ids(info: TargetInfo) -> set[int]:
    """Decoding ends at the end-of-turn token (a chat reply's end) or at eos."""
    return {info.eos_token_id, info.end_of_turn_token_id}


def turn_seed(seed: int, setting: str, request: Request, turn: int) -> int:
    """Each turn's own seed: its draws do not depend on which turns ran before it or in which order."""
    return xxhash.xxh64_intdigest(f"{seed}/{setting}/{request.set}/{request.id}/{turn}".encode()) & (2**63 - 1)


@dataclass
class Decoder:
    """What decodes every turn of one run: the models, the drafter's proposer, and how."""

    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    proposer: Proposer
    stop_ids: set[int]
    params: EvalParams
    enable_thinking: bool | None

    def request(self, setting: str, sampling: Sampling, req: Request, skips: Skips) -> list[TurnResult]:
        """Every turn of ``req``, each next user turn after the target's own reply; a turn that cannot be rendered
        or is too long is a counted skip and ends the request (its later turns would lack their context)."""
        messages, results = list(req.prefix), []
        for turn, user in enumerate(req.turns):
            messages.append(user)
            try:
                ids = render_prompt(self.tokenizer, messages, req.tools, self.enable_thinking)
            except Exception as e:  # a template error names one bad prompt; the rest still count
                skips.add("chat template failed", f"{req.id}#{turn}", f"{type(e).__name__}: {e}")
                break
            if len(ids) > self.params.max_prompt_tokens:
                skips.add("prompt longer than max_prompt_tokens", f"{req.id}#{turn}", f"{len(ids)} tokens")
                break
            seed = turn_seed(self.params.seed, setting, req, turn)
            spec = speculative_generate(self.target, self.proposer, ids, self.params.max_new_tokens, self.stop_ids,
                                        sampling, seed)
            base = None
            if sampling.greedy:  # sampled outputs are checked by distribution (tests), not byte for byte
                base = greedy_reference(self.target, ids, spec.tokens, self.stop_ids)
                if base.tokens != spec.tokens:
                    at = next((i for i, (a, b) in enumerate(zip(base.tokens, spec.tokens)) if a != b), None)
                    log.error("%s turn %d: speculative output differs from target-only greedy at token %s",
                              req.id, turn, at)
            selector = None
            if sampling.greedy and getattr(self.proposer, "steps", None):
                selector = selector_counts(self.proposer.steps, ids + spec.tokens)
            results.append(TurnResult(setting, req.set, req.source, req.id, turn, len(ids), spec, base, selector))
            messages.append({"role": "assistant",
                             "content": self.tokenizer.decode(spec.tokens, skip_special_tokens=True)})
        return results


def evaluate_setting(decoder: Decoder, setting: str, sampling: Sampling, requests: list[Request],
                     skips: Skips) -> list[TurnResult]:
    results: list[TurnResult] = []
    bar = tqdm(requests, desc=f"evaluate {setting}", unit="request")
    for req in bar:
        results += decoder.request(setting, sampling, req, skips)
        bar.set_postfix(acceptance=f"{figures(results)['acceptance'] or 0:.2f}")
    return results


def load_models(
    info: TargetInfo, checkpoint: str | os.PathLike, params: EvalParams
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, DFlashDrafter]:
    """The target (from its folder, in place) and the drafter bound to it, on one device in one dtype.

    A drafter whose training data was made with another tokenizer than the target's is refused: its ids would
    mean other tokens."""
    check_lineage(checkpoint, info)  # before the target loads: a foreign drafter is refused at once
    target = load_model(info, dtype=torch_dtype(params.dtype), device=resolve_device(params.device))
    return target, load_tokenizer(info), load_fitting(checkpoint, info, target)


def run_evaluate(p: EvalParams, args: EvalArgs, stage: StageRun) -> None:
    """The evaluate stage: for every setting of ``evaluate.sampling``, every request decoded with the drafter
    (and greedy, checked against the target alone); the plots, the per-step file, and ``stage`` filled (headline per setting: z-lab's
    acceptance per set, the held-out tau, the weakest source; the report every figure; the run file the wall clock).

    Refuses (after writing the plots; the log has the figures) when a greedy output differs from target-only decoding
    and ``require_lossless`` is set: that is a bug in verification, or, in bf16, numerics flipping a near-tie.
    """
    info = load_target(args.target)
    stage.skips.strict = p.strict
    requests = load_requests(p, args, stage.skips)
    if not requests:
        raise Refusal(f"{args.prompts} and evaluate.sets hold no usable prompts (skipped: {stage.skips.as_dict()}): "
                      "re-run the prompts stage")
    # Batch-1 decoding of a small model is latency-bound: on a busy CPU, extra OpenMP threads only spin
    # (measured: 2 threads 15x slower than 1 on a loaded 2-core box).
    with torch_threads(p.threads):
        _evaluate(p, info, args, requests, stage)


def _evaluate(p: EvalParams, info: TargetInfo, args: EvalArgs, requests: list[Request], stage: StageRun) -> None:
    target, tokenizer, drafter = load_models(info, args.checkpoint, p)
    # The prompts are rendered in the thinking mode the training data was generated in (null: the template's own).
    thinking = lineage_of(drafter.config)["enable_thinking"]
    log.info("evaluating %d requests (%s) under %s, block size %d, enable_thinking=%s (the training data's) on %s",
             len(requests), ", ".join(f"{k}: {v}" for k, v in Counter(r.set for r in requests).items()),
             ", ".join(p.sampling), drafter.block_size, thinking, target.device)
    decoder = Decoder(target, tokenizer, DFlashProposer(drafter), stop_token_ids(info), p, thinking)
    results: dict[str, list[TurnResult]] = {}
    started = time.perf_counter()
    for name, s in p.sampling.items():
        results[name] = evaluate_setting(decoder, name, Sampling(s.temperature, s.top_p, s.top_k), requests,
                                         stage.skips)
    if not any(results.values()):
        raise Refusal(f"every eval prompt was skipped ({stage.skips.as_dict()}): raise evaluate.max_prompt_tokens?")
    splits = summarize(results, drafter.block_size, p.intervals)
    stage.details.update(splits=splits, block_size=drafter.block_size, max_new_tokens=p.max_new_tokens,
                         enable_thinking=thinking, requests=request_counts(requests), **identity(p, info, requests))
    stage.headline.update(headline(stage.details))
    stage.run.update(decode_seconds=round(time.perf_counter() - started, 2))
    write_plots(args, results, splits, drafter.block_size)
    for split, settings in splits.items():
        for name, s in settings.items():
            log.info("%s %s: acceptance %s (z-lab's figure), pooled tau %s; per set %s; lossless %s", split, name,
                     s["acceptance"], s["tau"], {k: v["acceptance"] for k, v in s["per_set"].items()}, s["lossless"])
    lossless = stage.headline["lossless"]
    if p.require_lossless and lossless is not None and lossless < 1.0:
        mismatched = [m for settings in splits.values() for s in settings.values() for m in s["mismatched"]]
        raise NotLossless(
            f"speculative decoding changed the greedy output of {len(mismatched)} turn(s) {mismatched[:5]}: greedy "
            "verification must be lossless. In float32 this is a bug; in bf16/fp16 it can be numerics (set "
            "evaluate.dtype: float32 to tell them apart)"
        )


def request_counts(requests: list[Request]) -> dict[str, dict[str, int]]:
    """Requests per split and set."""
    return {split: dict(sorted(Counter(r.set for r in requests if r.split == split).items()))
            for split in sorted({r.split for r in requests})}


def identity(p: EvalParams, info: TargetInfo, requests: list[Request]) -> dict[str, Any]:
    """What makes two evaluations comparable request by request (``draftline compare`` refuses a mismatch by name):
    the target, the prompts (a hash of every request as decoded) and each setting's sampling, and how the
    intervals were drawn."""
    prompts = xxhash.xxh64()
    for r in requests:
        prompts.update(json.dumps([r.set, r.source, r.id, r.prefix, r.turns, r.tools], sort_keys=True).encode())
        prompts.update(b"\n")
    return {"target": {"model_fingerprint": info.model_fingerprint, "tokenizer_fingerprint": info.tokenizer_fingerprint},
            "prompts": {"fingerprint": prompts.hexdigest(), "requests": len(requests)},
            "sampling": {name: asdict(s) for name, s in p.sampling.items()}, "intervals": asdict(p.intervals)}


def write_plots(args: EvalArgs, results: dict[str, list[TurnResult]], splits: dict[str, dict],
                block_size: int) -> None:
    """One CSV per setting in each plot folder (positions and lengths over the reported split, ``test``; the
    intervals of both splits), and the per-step file (every split); each written whole or not at all."""
    test = {name: [r for r in rs if r.split == TEST] for name, rs in results.items()}
    with atomic_path(args.positions) as tmp:
        tmp.mkdir()
        for name, rs in test.items():
            write_csv(tmp / f"{name}.csv", acceptance_by_position(rs, block_size), ACCEPTANCE_COLUMNS)
    with atomic_path(args.lengths) as tmp:
        tmp.mkdir()
        for name, rs in test.items():
            histogram = splits.get(TEST, {}).get(name, {}).get("histogram", [])
            write_csv(tmp / f"{name}.csv", histogram_rows(histogram, rs), HISTOGRAM_COLUMNS)
    with atomic_path(args.intervals) as tmp:
        tmp.mkdir()
        for name in results:
            write_csv(tmp / f"{name}.csv", interval_rows(splits, name), INTERVAL_COLUMNS)
    write_jsonl(args.steps, (step_record(r) for rs in results.values() for r in rs))
