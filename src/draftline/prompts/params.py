"""The prompt stage's params: ``prompts``, ``dedup`` and ``blend`` of params.yaml, the names of ``sources`` (their
order is the row order and the dedup tie-break), ``generate.enable_thinking`` (token costs render prompts as
generation will), ``merge.base`` (whose recorded mix ``blend.target_mix`` and ``blend.max_domain_share`` count),
``decontaminate`` and the names of ``evaluate.sets`` (whose prompts it checks against), loaded together as
:class:`PromptsSettings`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from draftline.core.classify import DOMAINS
from draftline.core.contamination import DecontaminateParams
from draftline.core.params import Params, ParamsError, load_section, load_value, optional

# samples: rows; tokens: prompt + reference-answer tokens under the target tokenizer.
Unit = Literal["samples", "tokens"]

@dataclass(frozen=True)
class PromptsParams(Params):
    """``params.yaml: prompts``."""

    turns: Literal["first", "all"]
    strict: bool
    # Prompts offering tools under a target template that cannot render them (prompts/template.py): refuse (the
    # stage stops, naming their sources) or drop (left out, counted as skips tools_unsupported).
    tools_unsupported: Literal["refuse", "drop"]


@dataclass(frozen=True)
class NearParams(Params):
    """``params.yaml: dedup.near``."""

    enabled: bool
    threshold: float
    num_perm: int
    ngram: int
    seed: int
    exact_numbers: list[str]

    def validate(self, where: str) -> None:
        if not 0.0 < self.threshold <= 1.0 or self.num_perm < 1 or self.ngram < 1:
            raise ParamsError(f"params.yaml: {where}: threshold must be in (0, 1], num_perm and ngram >= 1")


@dataclass(frozen=True)
class DedupParams(Params):
    """``params.yaml: dedup``."""

    priority: list[str]
    near: NearParams


@dataclass(frozen=True)
class BlendSource(Params):
    """``blend.sources.<name>``: ``whole: true`` (taken in full) or ``weight: w`` (its share of the rest)."""

    whole: bool | None = optional()
    weight: float | None = optional()

    def validate(self, where: str) -> None:
        if self.whole and self.weight is not None:
            raise ParamsError(f"params.yaml: {where}: give 'whole: true' or 'weight', not both")
        if self.weight is not None and (self.weight < 0 or not math.isfinite(self.weight)):
            raise ParamsError(f"params.yaml: {where}.weight must be >= 0, not {self.weight}")


@dataclass(frozen=True)
class SteerParams(Params):
    """``blend.steer``: a previous round's evaluation report, the setting whose acceptance steers, and how hard."""

    eval: str
    setting: str
    strength: float

    def validate(self, where: str) -> None:
        if self.strength < 0 or not math.isfinite(self.strength):
            raise ParamsError(f"params.yaml: {where}.strength must be >= 0, not {self.strength}")


@dataclass(frozen=True)
class HeldOutParams(Params):
    """``blend.eval``: prompts per source held out for the evaluate stage, per split (core/splits.py)."""

    dev: int
    test: int

    def validate(self, where: str) -> None:
        if self.dev < 0 or self.test < 0:
            raise ParamsError(f"params.yaml: {where}: dev and test must be >= 0, not {self.dev}, {self.test}")


@dataclass(frozen=True)
class BlendParams(Params):
    """``params.yaml: blend``."""

    total: int
    unit: Unit
    seed: int
    eval: HeldOutParams
    sources: dict[str, BlendSource]
    # Shares per domain of the merged set (base + new) to aim at, or None (the source weights alone decide).
    target_mix: dict[str, float] | None
    # The most any domain may hold of the merged set (a share), or None: off.
    max_domain_share: float | None
    # Source weights scaled by how far each source's acceptance lags the best one's (prompts/steer.py), or None.
    steer: SteerParams | None

    def validate(self, where: str) -> None:
        for key in ("total", "seed"):
            if getattr(self, key) < 0:
                raise ParamsError(f"params.yaml: {where}.{key} must be a non-negative integer, not {getattr(self, key)}")
        if self.target_mix is not None:
            unknown = sorted(set(self.target_mix) - set(DOMAINS))
            if unknown:
                raise ParamsError(f"params.yaml: {where}.target_mix names {unknown}; the domains are {list(DOMAINS)}")
            if any(v < 0 or not math.isfinite(v) for v in self.target_mix.values()):
                raise ParamsError(f"params.yaml: {where}.target_mix shares must be >= 0, not {self.target_mix}")
            if abs(sum(self.target_mix.values()) - 1.0) > 1e-6:
                raise ParamsError(f"params.yaml: {where}.target_mix shares must sum to 1, not "
                                  f"{sum(self.target_mix.values()):.4f} ({self.target_mix})")
        if self.max_domain_share is not None and not 0.0 < self.max_domain_share <= 1.0:
            raise ParamsError(f"params.yaml: {where}.max_domain_share must be in (0, 1] or null, not {self.max_domain_share}")

    def requested_mix(self) -> dict[str, float] | None:
        """``target_mix`` with every domain present (an unnamed domain: 0)."""
        return None if self.target_mix is None else {d: float(self.target_mix.get(d, 0.0)) for d in DOMAINS}



@dataclass(frozen=True)
class PromptsSettings:
    """Everything the prompt stage reads from params.yaml (dvc.yaml lists the same keys under its ``params``)."""

    sources: list[str]
    prompts: PromptsParams
    dedup: DedupParams
    blend: BlendParams
    enable_thinking: bool
    # ``merge.base``: the set the new rows will be merged onto; its recorded mix counts towards the merged set's.
    base: str | None = None
    # ``decontaminate`` (None: no check) and the names of ``evaluate.sets``, whose prompts it checks against.
    decontaminate: DecontaminateParams | None = None
    sets: list[str] = field(default_factory=list)


def load(_args: object = None) -> PromptsSettings:
    return PromptsSettings(list(load_section("sources")), PromptsParams.load("prompts"), DedupParams.load("dedup"),
                           BlendParams.load("blend"), load_value("generate.enable_thinking", bool),
                           load_value("merge.base", str | None), DecontaminateParams.load("decontaminate"),
                           list(load_value("evaluate.sets", dict[str, Any]) or {}))
