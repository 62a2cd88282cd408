"""Steering the blend by a previous round's acceptance (``blend.steer``) and keeping the base's prompts out of it.

The rule: a weighted source ``s`` with acceptance ``a_s`` (z-lab's figure on its held-out prompts, under the
evaluation setting ``steer.setting`` of the previous round's ``reports/eval.json``) gets weight
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


def steer_factors(weights: Mapping[str, float], report: str | Path, setting: str, strength: float,
                  tokenizer_fingerprint: str) -> dict[str, dict[str, Any]]:
    """Per weighted source: its acceptance (None where unmeasured) and its weight factor under the rule above.

    Refused in one line: an evaluation of another target (its recorded tokenizer fingerprint, naming both), one that
    records none (written by an older draftline), a malformed source figure, and one that measured none of the
    weighted sources (steering would silently be off)."""
    path = Path(report)
    if not path.is_file():
        raise MissingInput(f"blend.steer.eval: {path} does not exist; keep the previous round's reports/eval.json "
                           "under data/drafters/ (README \"Rounds\")")
    try:
        evaluation = json.loads(path.read_text())
        settings = evaluation.get("settings", {})
    except (json.JSONDecodeError, AttributeError) as e:
        raise Refusal(f"blend.steer.eval: {path} is not an evaluate report (reports/eval.json): {e}") from e
    target = evaluation.get("target")
    theirs = target.get("tokenizer_fingerprint") if isinstance(target, dict) else None
    if theirs is None:
        raise Refusal(f"blend.steer.eval: {path} records no target (written by an older draftline): evaluate that "
                      "drafter again (dvc repro evaluate) and keep the new report")
    if theirs != tokenizer_fingerprint:
        raise Refusal(f"blend.steer.eval: {path} evaluated another target: target.tokenizer_fingerprint "
                      f"{theirs[:12]} vs this target's {tokenizer_fingerprint[:12]}")
    if setting not in settings or not isinstance(settings[setting].get("per_source"), dict):
        raise Refusal(f"blend.steer.setting {setting!r} has no per-source figures in {path}; it has {sorted(settings)}")
    acceptance = {s: source_acceptance(settings[setting]["per_source"], s, path) for s in weights}
    measured = [a for a in acceptance.values() if a]
    if not measured:
        raise Refusal(f"blend.steer.eval: {path} measured none of the weighted sources {sorted(weights)} (it has "
                      f"{sorted(settings[setting]['per_source'])}): steering would be off; evaluate a drafter of "
                      "these sources, or set blend.steer: null")
    best = max(measured)
    return {s: {"acceptance": a, "factor": round((best / a) ** strength, 6) if a else 1.0}
            for s, a in acceptance.items()}


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
