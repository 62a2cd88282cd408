"""``params.yaml: serve`` and the evaluate settings the stage must share with the evaluate stage (its requests, their
seeds, lengths and sampling, and how intervals are drawn), loaded together as :class:`ServeSettings`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from draftline.core.params import Params, ParamsError, load_value

NGRAM_MODES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
ARMS = ("target", "drafter", *NGRAM_MODES)


@dataclass(frozen=True)
class ServeParams(Params):
    """``params.yaml: serve`` (documented there and in docs/serve.md)."""

    # null: off (the stage writes its files empty); llama.cpp runs here, sglang and vllm need a GPU machine.
    engine: Literal["llama.cpp", "sglang", "vllm"] | None
    arms: list[str]
    split: Literal["dev", "test"]
    max_requests: int | None
    threads: int
    slots: int
    context: int
    exact: bool
    sampled: bool
    # llama.cpp: drafts a step (--spec-draft-n-max) below the drafter's block - 1, a block of draft_max + 1 for both
    # the drafter and the target's verification; null: the whole block, as trained and as evaluate decodes
    draft_max: int | None
    gguf_type: Literal["f32", "f16", "bf16", "q8_0"]
    port: int
    health_timeout_s: float

    def validate(self, where: str) -> None:
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or "target" not in self.arms:
            raise ParamsError(f"params.yaml: {where}.arms must hold target and any of {list(ARMS)}; got {self.arms}")
        if self.engine not in (None, "llama.cpp") and set(self.arms) - {"target", "drafter"}:
            raise ParamsError(f"params.yaml: {where}.arms: the ngram-* modes are llama.cpp's; {self.engine} serves "
                              "target and drafter")
        if self.draft_max is not None and (self.draft_max < 1 or self.engine not in (None, "llama.cpp")):
            raise ParamsError(f"params.yaml: {where}.draft_max must be null or >= 1, and is llama.cpp's")
        if self.threads < 1 or self.slots < 1 or self.context < 16:
            raise ParamsError(f"params.yaml: {where}: threads and slots must be >= 1, context >= 16")


@dataclass(frozen=True)
class Judged:
    """What the served requests share with evaluate's, read from ``params.yaml: evaluate`` (dvc.yaml lists it)."""

    sets: list[str]
    max_prompts_per_source: int | None
    max_prompt_tokens: int
    max_new_tokens: int
    seed: int
    sampled: dict[str, Any] | None  # evaluate.sampling.sampled: the setting of the sampled run
    resamples: int
    confidence: float
    interval_seed: int

    @classmethod
    def load(cls) -> "Judged":
        intervals = load_value("evaluate.intervals", dict[str, Any])
        sampling = load_value("evaluate.sampling", dict[str, dict[str, Any]])
        return cls(list(load_value("evaluate.sets", dict[str, Any])),
                   load_value("evaluate.max_prompts_per_source", int | None),
                   load_value("evaluate.max_prompt_tokens", int), load_value("evaluate.max_new_tokens", int),
                   load_value("evaluate.seed", int), sampling.get("sampled"), int(intervals["resamples"]),
                   float(intervals["confidence"]), int(intervals["seed"]))


@dataclass(frozen=True)
class ServeSettings:
    serve: ServeParams
    judged: Judged


def load(_args: object = None) -> ServeSettings:
    return ServeSettings(ServeParams.load("serve"), Judged.load())
