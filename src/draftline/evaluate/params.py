"""``params.yaml: evaluate``: which settings, which prompt sets, how long, on which device in which dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftline.core.params import Params, ParamsError
from draftline.core.requests import HELDOUT
from draftline.core.source_spec import SourceSpec
from draftline.core.threads import check_workers


@dataclass(frozen=True)
class SamplingParams(Params):
    """One decoding setting: ``temperature: 0`` is greedy; ``top_k: 0`` and ``top_p: 1.0`` are off."""

    temperature: float
    top_p: float
    top_k: int

    def validate(self, where: str) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ParamsError(f"params.yaml: {where}: temperature must be >= 0, top_p in (0, 1], top_k >= 0")


@dataclass(frozen=True)
class IntervalParams(Params):
    """How every figure's interval is drawn: a percentile bootstrap over requests, seeded (the same report, the
    same bounds)."""

    resamples: int
    confidence: float
    seed: int

    def validate(self, where: str) -> None:
        if self.resamples < 1000 or not 0.5 <= self.confidence < 1:
            raise ParamsError(f"params.yaml: {where}: resamples must be >= 1000 (fewer move the bounds from run to "
                              f"run of the seed) and confidence in [0.5, 1), got {self.resamples}, {self.confidence}")


@dataclass(frozen=True)
class EvalParams(Params):
    """``params.yaml: evaluate`` (see docs/evaluate.md). The thinking mode of the plain settings is not a param: it
    is the training data's, read from the drafter's lineage; ``thinking: both`` (or data of mixed modes) adds the
    other mode apart."""

    sampling: dict[str, SamplingParams]
    seed: int
    thinking: Literal["both", "data"]
    intervals: IntervalParams
    sets: dict[str, SourceSpec]
    max_new_tokens: int
    max_prompts_per_source: int | None
    max_prompt_tokens: int
    device: str
    dtype: Literal["float32", "bfloat16", "float16", "auto"]
    require_lossless: bool
    strict: bool
    threads: int
    workers: int | Literal["auto"]

    def validate(self, where: str) -> None:
        if not self.sampling:
            raise ParamsError(f"params.yaml: {where}.sampling needs at least one setting, e.g. greedy: "
                              "{temperature: 0.0, top_p: 1.0, top_k: 0}")
        if self.threads < 0:
            raise ParamsError(f"params.yaml: {where}.threads must be >= 0 (0: one per core)")
        check_workers(self.threads, self.workers, where)
        if HELDOUT in self.sets:
            raise ParamsError(f"params.yaml: {where}.sets: {HELDOUT!r} names the training sources' held-out prompts; "
                              "call the set something else")


def load(_args: object = None) -> EvalParams:
    """``params.yaml: evaluate`` (the stage's paths do not change its params)."""
    return EvalParams.load("evaluate")
