"""Steering the blend by a previous round's acceptance (``blend.steer``) and keeping the base's prompts out of it.

The rule: a weighted source ``s`` with acceptance ``a_s`` (z-lab's figure on its held-out prompts, under the
evaluation setting ``steer.setting`` in the ``dev`` split of the previous round's ``reports/eval.json``) gets weight
``w_s * (a_max / a_s) ** strength``, ``a_max`` the best source's acceptance. The source the drafter is best at keeps
its weight; one it accepts half as often gets ``2 ** strength`` times its weight. ``strength`` 0 turns it off, 1
is proportional to the lag. Whole sources are taken in full either way, and a source the evaluation did not measure
keeps its weight (factor 1). Weights are relative, so steering moves shares, never ``blend.total``.

Why the lag and not the absolute level: acceptance differs by kind of text at any drafter quality (tool calls are
easier to draft than prose), so only a source that lags the others says where more data helps most.

The base (``merge.base``): its rows' prompt ids are excluded from the train pool after the eval split, so that
the eval prompts are those of every round (the split does not depend on the base) and no new prompt repeats one
the base already holds (the merge would drop it: a wasted generation).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from draftline.core.dataset import mapped_shards, verified_shard_files
from draftline.core.errors import MissingInput, Refusal
from draftline.core.splits import DEV


def read_evaluation(report: str | Path, tokenizer_fingerprint: str) -> dict[str, Any]:
    """The ``dev`` split of a previous round's evaluation (per setting), the only split a decision reads.

    Refused in one line: a missing or cut file, an evaluation of another target (its recorded tokenizer
    fingerprint, naming both), one that records none or has no ``dev`` split (written by an older draftline, or
    evaluated with ``blend.eval.dev: 0``): the ``test`` split is reported, never steered by."""
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
    if not isinstance(splits.get(DEV), dict):
        raise Refusal(f"blend.steer.eval: {path} has splits {sorted(splits)}, no {DEV!r}: steering reads dev only "
                      "(test is reported, never read by a decision); evaluate with blend.eval.dev > 0")
    return splits[DEV]


def steer_factors(weights: Mapping[str, float], dev: Mapping[str, Any], setting: str, strength: float,
                  path: Path) -> dict[str, dict[str, Any]]:
    """Per weighted source: its acceptance on ``dev`` (None where unmeasured) and its weight factor under the rule
    above. Refused in one line: a setting without per-source figures, a malformed source figure, and an evaluation
    that measured none of the weighted sources (steering would silently be off)."""
    if setting not in dev or not isinstance(dev[setting].get("per_source"), dict):
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


def check_prompt_set(dev: Mapping[str, Any], setting: str, dev_ids: set[str], path: Path) -> None:
    """The evaluation's held-out dev prompts must be this stage's: another prompt set (other samples, seed or
    ``blend.eval`` quotas) measured other prompts, and its per-source figures would steer by them. Refused in one
    line, naming both counts and a prompt of theirs that is not ours."""
    theirs = {key.split("/", 1)[1].rsplit("#", 1)[0] for key in dev[setting].get("per_request", {})
              if key.startswith("heldout/")}
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


def base_prompt_ids(base: str | None) -> frozenset[str]:
    """The prompt ids of ``merge.base``'s rows (a row's id is its prompt's); empty without a base, or for a base in
    another trainer's layout (no ids: the merge still drops its prompts by content)."""
    if base is None or not (Path(base) / "draftline.json").is_file():
        return frozenset()
    _, files = verified_shard_files(base)  # a damaged base is refused here, as by every reader of a dataset
    return frozenset(i for t in mapped_shards(base, files) for i in t.column("id").to_pylist())
