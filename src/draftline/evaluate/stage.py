"""Judging a drafter the way it will be served: speculative decoding of held-out prompts and benchmark sets,
verified by the target, under every decoding setting of ``evaluate.sampling`` (greedy and sampled).

For every request, rendered exactly as the generate stage sent prompts to the target (in the training data's
thinking mode; with ``evaluate.thinking: both`` or data of mixed modes, and a target whose template has a thinking
mode, also in the other mode, as settings of their own: thinking on and off are reported apart, :func:`decoded_settings`), the target
verifies the drafter's blocks: greedy by argmax, sampled by rejection sampling (the output keeps the target's
distribution, :mod:`draftline.drafter.speculative`). Greedy settings also check every output against target-only
greedy decoding (``lossless``): each token must be the target's argmax given the tokens before it, read from one
forward of the target over the prompt and the output (``greedy_reference``: what the target alone emits, at one
forward instead of one per token; a third of the stage's time before). What the drafter is worth is its acceptance:
z-lab's figure (the one model cards quote) and the pooled tau, per set and per source (:mod:`draftline.evaluate.report`).
Training accuracy says little: a render or thinking-mode mismatch keeps it high while acceptance collapses.

Requests are decoded one at a time (:mod:`draftline.evaluate.decoder`), on ``evaluate.workers`` processes
(:mod:`draftline.evaluate.pool`).

Invariants: every random draw comes from a seed of (``evaluate.seed``, setting, request, turn), so a rerun on the
same machine writes the same bytes, for any number of workers; wall-clock times go to the run file only.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import xxhash
from tqdm import tqdm

from draftline.core import requests as core_requests
from draftline.core.chat import has_thinking
from draftline.core.errors import Refusal
from draftline.core.files import atomic_path, write_csv, write_jsonl
from draftline.core.logs import get_logger
from draftline.core.records import TargetInfo
from draftline.core.requests import Request
from draftline.core.runner import StageArgs, StageRun
from draftline.core.skips import Skips
from draftline.core.splits import TEST
from draftline.core.target_loader import load_target
from draftline.core.threads import torch_threads, workers_now
from draftline.drafter.speculative import Sampling
from draftline.evaluate.decoder import Decoder, build_decoder
from draftline.evaluate.params import EvalParams, SamplingParams
from draftline.evaluate.pool import decode_all
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
    step_record,
    summarize,
)

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
    return core_requests.load_requests(args.prompts, args.sets, p.sets, p.max_prompts_per_source, skips)


@dataclass(frozen=True)
class Setting:
    """One decoded setting: a sampling of ``evaluate.sampling`` and the thinking mode its prompts are rendered in."""

    sampling: SamplingParams
    thinking: bool | None


def decoded_settings(p: EvalParams, data_thinking: bool | None, template_thinks: bool) -> dict[str, Setting]:
    """``evaluate.sampling``'s settings in the training data's thinking mode, under their own names; with
    ``thinking: both``, or training data of mixed modes (``data_thinking`` None), and a template that has a thinking
    mode, each again in every other explicit mode, named ``<setting>@thinking_on`` or ``@thinking_off`` (a template
    without one: nothing to tell apart, decoded once)."""
    modes = [data_thinking]
    if (p.thinking == "both" or data_thinking is None) and template_thinks:
        modes += [m for m in (False, True) if m is not data_thinking]
    return {name if m is data_thinking else f"{name}@thinking_{'on' if m else 'off'}": Setting(s, m)
            for m in modes for name, s in p.sampling.items()}


def decode(decoder: Decoder, p: EvalParams, settings: dict[str, Setting], requests: list[Request],
           skips: Skips) -> dict[str, list[TurnResult]]:
    """Every request under every setting, on ``evaluate.workers`` processes; the turn results per setting, in
    request order (the same for any number of workers)."""
    jobs = [(name, Sampling(st.sampling.temperature, st.sampling.top_p, st.sampling.top_k), req, st.thinking)
            for name, st in settings.items() for req in requests]
    results: dict[str, list[TurnResult]] = {name: [] for name in settings}
    bar = tqdm(decode_all(jobs, decoder, workers_now(p.workers), skips), total=len(jobs), desc="evaluate", unit="request")
    for i, ((name, *_), turns) in enumerate(zip(jobs, bar), 1):
        results[name] += turns
        if i % 32 == 0 or i == len(jobs):  # the figure reads every turn so far: at every request, ~7 s of a run
            bar.set_postfix({setting: f"{figures(rs)['acceptance'] or 0:.2f}" for setting, rs in results.items() if rs})
    return results


def run_evaluate(p: EvalParams, args: EvalArgs, stage: StageRun) -> None:
    """The evaluate stage: for every decoded setting (:func:`decoded_settings`), every request decoded with the drafter
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
    decoder = build_decoder(info, args.checkpoint, p)
    block_size, thinking = decoder.proposer.block_size, decoder.enable_thinking
    template_thinks = has_thinking(decoder.tokenizer)
    settings = decoded_settings(p, thinking, template_thinks)
    log.info("evaluating %d requests (%s) under %s, block size %d, enable_thinking=%s (the training data's) on %s",
             len(requests), ", ".join(f"{k}: {v}" for k, v in Counter(r.set for r in requests).items()),
             ", ".join(settings), block_size, thinking, decoder.target.device)
    started = time.perf_counter()
    results = decode(decoder, p, settings, requests, stage.skips)
    if not any(results.values()):
        raise Refusal(f"every eval prompt was skipped ({stage.skips.as_dict()}): raise evaluate.max_prompt_tokens?")
    splits = summarize(results, block_size, p.intervals)
    stage.details.update(splits=splits, block_size=block_size, max_new_tokens=p.max_new_tokens,
                         enable_thinking=thinking, requests=request_counts(requests),
                         thinking={"template_has_thinking_mode": template_thinks,
                                   "settings": {name: thinking_label(st.thinking) for name, st in settings.items()}},
                         **identity(p, info, requests, decoder.target, settings, thinking))
    stage.headline.update(headline(stage.details))
    stage.run.update(decode_seconds=round(time.perf_counter() - started, 2))
    write_plots(args, results, splits, block_size)
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


def thinking_label(thinking: bool | None) -> str:
    """How the report names a setting's thinking mode (None: the template's own, for data of mixed modes)."""
    return "template default" if thinking is None else "on" if thinking else "off"


def identity(p: EvalParams, info: TargetInfo, requests: list[Request], target: Any, settings: dict[str, Setting],
             data_thinking: bool | None) -> dict[str, Any]:
    """What makes two evaluations comparable request by request (``draftline compare`` refuses a mismatch by name):
    the target, the prompts (a hash of every request as decoded, and ``max_prompt_tokens``, which decides which were
    decoded), the dtype and kind of device the loaded ``target`` computes in (as resolved: ``auto`` is what it
    became), each setting's sampling (and the thinking mode of one not in the training data's), and how the
    intervals were drawn. The device's kind (``cpu``, ``cuda``), not its index: the index names a card, not how it
    computes."""
    prompts = xxhash.xxh64()
    for r in requests:
        prompts.update(json.dumps([r.set, r.source, r.id, r.prefix, r.turns, r.tools], sort_keys=True).encode())
        prompts.update(b"\n")
    return {"target": {"model_fingerprint": info.model_fingerprint, "tokenizer_fingerprint": info.tokenizer_fingerprint},
            "prompts": {"fingerprint": prompts.hexdigest(), "requests": len(requests)},
            "max_prompt_tokens": p.max_prompt_tokens, "dtype": str(target.dtype).removeprefix("torch."),
            "device": target.device.type,
            "sampling": {name: asdict(st.sampling) if st.thinking is data_thinking
                         else {**asdict(st.sampling), "enable_thinking": st.thinking} for name, st in settings.items()},
            "intervals": asdict(p.intervals)}


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
