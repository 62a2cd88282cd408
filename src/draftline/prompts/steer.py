"""Steering the blend by a previous round's acceptance (``blend.steer``): reading and checking the evaluation, the
weight factors, and what the report shows of them.

The rule: a weighted source ``s`` with acceptance ``a_s`` (z-lab's figure on its held-out prompts, under the
evaluation setting ``steer.setting`` in the ``dev`` split of the previous round's ``reports/eval.json``) gets weight
``w_s * (a_max / a_s) ** strength``, ``a_max`` the best source's acceptance. The source the drafter is best at keeps
its weight; one it accepts half as often gets ``2 ** strength`` times its weight. ``strength`` 0 turns it off, 1
is proportional to the lag. Whole sources are taken in full either way, and a source the evaluation did not measure
keeps its weight (factor 1). Weights are relative, so steering moves shares, never ``blend.total``.

Why the lag and not the absolute level: acceptance differs by kind of text at any drafter quality (tool calls are
easier to draft than prose), so only a source that lags the others says where more data helps most.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftline.core.errors import MissingInput, Refusal
from draftline.core.records import PromptRecord, TargetInfo
from draftline.core.splits import DEV, split_of
from draftline.prompts.blend import source_plan
from draftline.prompts.params import BlendParams, SteerParams


def read_evaluation(report: str | Path, tokenizer_fingerprint: str, model_fingerprint: str | None) -> dict[str, Any]:
    """The ``dev`` split of a previous round's evaluation (per setting), the only split a decision reads.

    Refused in one line: a missing or cut file, an evaluation of another target (its recorded tokenizer or model
    fingerprint, naming both: another model's acceptance says nothing of where this one's drafter lags), one that
    records none or has no ``dev`` split (written by an older draftline, or evaluated with ``blend.eval.dev: 0``):
    the ``test`` split is reported, never steered by. A target folder with no weights (``model_fingerprint`` None:
    the tokenizer alone, enough for this stage) is checked by its tokenizer only."""
    path = Path(report)
    if not path.is_file():
        raise MissingInput(f"blend.steer.eval: {path} does not exist; keep the previous round's reports/eval.json "
                           "under data/drafters/ (README \"Rounds\")")
    try:
        evaluation = json.loads(path.read_text())
        target, splits = evaluation.get("target"), evaluation.get("splits")
    except (json.JSONDecodeError, AttributeError) as e:
        raise Refusal(f"blend.steer.eval: {path} is not an evaluate report (reports/eval.json): {e}") from e
    theirs = target.get("tokenizer_fingerprint") if isinstance(target, dict) else None
    if theirs is None or not isinstance(splits, dict):
        raise Refusal(f"blend.steer.eval: {path} records no target or no splits (written by an older draftline): "
                      "evaluate that drafter again (dvc repro evaluate) and keep the new report")
    if theirs != tokenizer_fingerprint:
        raise Refusal(f"blend.steer.eval: {path} evaluated another target: target.tokenizer_fingerprint "
                      f"{theirs[:12]} vs this target's {tokenizer_fingerprint[:12]}")
    model = target.get("model_fingerprint")
    if model_fingerprint is not None and model != model_fingerprint:
        raise Refusal(f"blend.steer.eval: {path} evaluated another target model: target.model_fingerprint "
                      f"{str(model)[:12]} vs this target's {model_fingerprint[:12]}; steer by an evaluation of this "
                      "target's drafter")
    if not isinstance(splits.get(DEV), dict):
        raise Refusal(f"blend.steer.eval: {path} has splits {sorted(splits)}, no {DEV!r}: steering reads dev only "
                      "(test is reported, never read by a decision); evaluate with blend.eval.dev > 0")
    return splits[DEV]


def steer_factors(weights: Mapping[str, float], dev: Mapping[str, Any], setting: str, strength: float,
                  path: Path) -> dict[str, dict[str, Any]]:
    """Per weighted source: its acceptance on ``dev`` (None where unmeasured) and its weight factor under the rule
    above. Refused in one line: a setting without per-source figures, a malformed source figure, and an evaluation
    that measured none of the weighted sources (steering would silently be off)."""
    if not isinstance(dev.get(setting), dict) or not isinstance(dev[setting].get("per_source"), dict):
        raise Refusal(f"blend.steer.setting {setting!r} has no per-source figures in {path}'s dev split; it has "
                      f"{sorted(dev)}")
    acceptance = {s: source_acceptance(dev[setting]["per_source"], s, path) for s in weights}
    measured = [a for a in acceptance.values() if a]
    if not measured:
        raise Refusal(f"blend.steer.eval: {path} measured none of the weighted sources {sorted(weights)} (it has "
                      f"{sorted(dev[setting]['per_source'])}): steering would be off; evaluate a drafter of "
                      "these sources, or set blend.steer: null")
    best = max(measured)
    return {s: {"acceptance": a, "factor": round((best / a) ** strength, 6) if a else 1.0}
            for s, a in acceptance.items()}


def heldout_prompt(key: str) -> str | None:
    """The prompt id of an evaluation's ``per_request`` key (``heldout/<id>#<turn>``); None for a set's request."""
    return key.split("/", 1)[1].rsplit("#", 1)[0] if key.startswith("heldout/") else None


def check_prompt_set(dev: Mapping[str, Any], setting: str, dev_ids: set[str], path: Path) -> None:
    """The evaluation's held-out dev prompts must be this stage's: another prompt set (other samples, seed or
    ``blend.eval`` quotas) measured other prompts, and its per-source figures would steer by them. Refused in one
    line, naming both counts and a prompt of theirs that is not ours; so is one that does not say which prompts it
    measured (no per-request figures)."""
    requests = dev[setting].get("per_request")
    if not isinstance(requests, dict):
        raise Refusal(f"blend.steer.eval: {path} has no per-request figures in its dev split, so which prompts it "
                      "measured is unknown: evaluate that drafter again (dvc repro evaluate) and keep the new report")
    theirs = {i for key in requests if (i := heldout_prompt(key))}
    foreign = sorted(theirs - dev_ids)
    if foreign:
        raise Refusal(f"blend.steer.eval: {path} evaluated another prompt set: {len(foreign)} of its {len(theirs)} "
                      f"held-out dev prompts are not among this stage's {len(dev_ids)} (e.g. {foreign[0]}); "
                      "evaluate this round's prompts")


def source_acceptance(per_source: Mapping[str, Any], source: str, path: Path) -> float | None:
    """A source's acceptance in an evaluation's ``per_source`` (None where it was not measured)."""
    if source not in per_source:
        return None
    figure = per_source[source]
    if not isinstance(figure, dict):
        raise Refusal(f"blend.steer.eval: {path}: per_source.{source} is {figure!r}, not a source's figures")
    value = figure.get("acceptance")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
        raise Refusal(f"blend.steer.eval: {path}: per_source.{source}.acceptance is {value!r}, not a positive number")
    return value


@dataclass(frozen=True)
class Steering:
    """``blend.steer`` read: the previous round's dev figures and, per weighted source, its acceptance and factor."""

    dev: dict[str, Any]
    sources: dict[str, dict[str, Any]]

    def check_prompts(self, steer: SteerParams, eval_: list[PromptRecord]) -> None:
        dev_ids = {r.id for r in eval_ if split_of(r.id) == DEV}
        check_prompt_set(self.dev, steer.setting, dev_ids, Path(steer.eval))


def steering(blend: BlendParams, order: Sequence[str], target: TargetInfo) -> Steering | None:
    """``blend.steer``'s acceptance and weight factor per weighted source (:mod:`draftline.prompts.steer`)."""
    if blend.steer is None:
        return None
    plan = source_plan(order, blend.sources)
    weights = {name: x["weight"] for name, x in plan.items() if not x["whole"] and x["weight"] > 0}
    dev = read_evaluation(blend.steer.eval, target.tokenizer_fingerprint, target.model_fingerprint)
    factors = steer_factors(weights, dev, blend.steer.setting, blend.steer.strength, Path(blend.steer.eval))
    return Steering(dev, {name: {"weight": weights[name], **factors[name]} for name in weights})


def steer_shares(steer: SteerParams, steering: Steering, details: dict[str, Any]) -> dict[str, Any]:
    """What steered (the evaluation, its split, the setting) and per steered source: its acceptance and factor, and
    its share of the weighted sources' rows as requested (the weights), steered (the weights x factors) and
    achieved (the rows chosen)."""
    sources = steering.sources
    steered = {s: x["weight"] * x["factor"] for s, x in sources.items()}
    rows = {s: details["sources"][s]["achieved_rows"] for s in sources}
    w, sw, n = sum(x["weight"] for x in sources.values()), sum(steered.values()), sum(rows.values())
    return {"eval": steer.eval, "split": DEV, "setting": steer.setting, "strength": steer.strength, "sources": {
        s: {"acceptance": x["acceptance"], "factor": x["factor"], "requested": round(x["weight"] / w, 4),
            "steered": round(steered[s] / sw, 4), "achieved": round(rows[s] / n, 4) if n else 0.0}
        for s, x in sources.items()}}


def format_steer(steer: dict[str, Any]) -> str:
    lines = [f"blend.steer ({steer['eval']}, {steer['split']} split, {steer['setting']}): shares of the weighted "
             "sources' rows",
             f"{'source':<20} {'acceptance':>10} {'factor':>7} {'requested':>9} {'steered':>8} {'achieved':>8}"]
    for s, x in steer["sources"].items():
        a = "-" if x["acceptance"] is None else f"{x['acceptance']:.2f}"
        lines.append(f"{s:<20} {a:>10} {x['factor']:>7.2f} {x['requested']:>9.1%} {x['steered']:>8.1%} "
                     f"{x['achieved']:>8.1%}")
    return "\n".join(lines)
