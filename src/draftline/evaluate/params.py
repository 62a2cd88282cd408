"""``params.yaml: evaluate``: how many prompts, how long, on which device in which dtype, and how strictly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftline.core.params import Params


@dataclass(frozen=True)
class EvalParams(Params):
    """``params.yaml: evaluate`` (see docs/evaluate.md). The thinking mode is not a param: it is the training
    data's, read from the drafter's lineage."""

    max_new_tokens: int
    max_prompts_per_source: int
    max_prompt_tokens: int
    device: str
    dtype: Literal["float32", "bfloat16", "float16", "auto"]
    require_lossless: bool
    strict: bool
    threads: int


def load(_args: object = None) -> EvalParams:
    """``params.yaml: evaluate`` (the stage's paths do not change its params)."""
    return EvalParams.load("evaluate")
