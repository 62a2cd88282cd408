"""Two evaluations of the same prompts, request by request: which drafter is better, and how sure that is.

``draftline compare A B``: A and B are eval reports (a file), git revisions or DVC experiment names (the evaluate
stage's report as committed there: it is in git, ``cache: false``). On one split (``--split``: ``test``, the
reported one, by default; ``dev`` for a decision, which never reads test), per decoding setting both have, overall
(every request), per set and per held-out source: A's and B's z-lab acceptance, A minus B with its paired bootstrap
interval over the requests both decoded, the same for the pooled tau, and a verdict on the acceptance: ``better``
(the interval above 0), ``worse`` (below 0) or ``cannot tell``; a group of fewer than :data:`MIN_N` requests
(``--min-n``) gets ``too few`` whatever its interval.

Invariants:

* two reports are compared only when they decoded the same prompts for the same target the same way: a difference in
  the target's fingerprints, the prompts' fingerprint (every request as decoded), ``max_new_tokens``,
  ``max_prompt_tokens``, the dtype and kind of device the models computed in, the thinking mode, a shared setting's
  sampling or the intervals' draws is refused, naming the field and both values;
* a verdict needs at least ``min_n`` (:data:`MIN_N` unless told) paired requests in its group; below that it is
  ``too few``, n shown;
* a report without per-request figures (written before they existed) is refused, saying to re-run evaluate;
* the draws are the reports' own ``evaluate.intervals`` (seeded): the same two reports print the same bytes, and a
  report compared with itself is ``cannot tell`` in every group of :data:`MIN_N` or more, with the interval [0, 0].
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from draftline.core.errors import Refusal
from draftline.core.intervals import Interval, bootstrap, paired_bootstrap, ratio_difference
from draftline.core.requests import HELDOUT
from draftline.core.splits import TEST

# What must be equal for a request-by-request comparison to mean anything (dotted keys of the report).
# The dtype and the kind of device change the logits, hence which drafts verification accepts (bf16 flips near-ties
# that float32 keeps); max_prompt_tokens changes which turns were decoded at all.
SAME = ("target.model_fingerprint", "target.tokenizer_fingerprint", "prompts.fingerprint", "max_new_tokens",
        "max_prompt_tokens", "dtype", "device", "enable_thinking", "intervals")
# The fewest paired requests a verdict is given on. On n requests the percentile bootstrap's interval is the plug-in
# spread (narrow by sqrt((n - 1) / n)) at about the normal's quantiles where Student's t quantiles apply (1.96 vs 2.26
# at n = 10, 12.7 at n = 2), and one request gives a point: "better" at any confidence. Under ~10 requests its
# coverage falls well short of the stated 95%, so such a group (a source with a handful of turns) gets no verdict.
MIN_N = 10


class NotComparable(Refusal):
    """The two evaluations did not decode the same prompts for the same target the same way."""


@dataclass(frozen=True)
class Evaluation:
    name: str  # what the user typed: a file, a revision or an experiment
    report: dict[str, Any]
    split: str  # the split compared: test (reported) or dev (what a decision may read)

    @property
    def settings(self) -> dict[str, Any]:
        return self.report["splits"][self.split]


@dataclass(frozen=True)
class Row:
    """One group's comparison: A's and B's acceptance, their paired differences, the verdict."""

    group: str
    a: float
    b: float
    acceptance: Interval
    tau: Interval
    min_n: int = MIN_N  # the fewest requests a verdict is given on

    @property
    def verdict(self) -> str:
        if self.acceptance.n < self.min_n:
            return "too few"
        return "better" if self.acceptance.low > 0 else "worse" if self.acceptance.high < 0 else "cannot tell"


def report_path(root: Path, rev: str) -> str:
    """The evaluate stage's report, as ``dvc.yaml`` at ``rev`` names it (``${paths.reports}/eval.json``)."""
    pipeline = yaml.safe_load(git_show(root, rev, "dvc.yaml"))
    paths = next(v["paths"] for v in pipeline.get("vars", []) if isinstance(v, dict) and "paths" in v)
    return f"{paths['reports']}/eval.json"


def git_show(root: Path, rev: str, path: str) -> str:
    p = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=root, capture_output=True, text=True)
    if p.returncode != 0:
        raise NotComparable(f"{path} is not in git at {rev}: {p.stderr.strip()}")
    return p.stdout


def resolve(root: Path, name: str) -> str:
    """A git revision or a DVC experiment name, as a commit (DVC's own resolution: experiments live in git refs)."""
    from dvc.scm import SCM, RevError, resolve_rev

    try:
        return resolve_rev(SCM(str(root)), name)
    except RevError as e:
        raise NotComparable(f"{name!r} is neither a file, a git revision nor a DVC experiment of {root}: {e}") from e


def load(name: str, root: Path, split: str = TEST) -> Evaluation:
    """One split of an evaluation from a report file, or from the report committed at a revision or experiment."""
    path = Path(name)
    if path.is_file():
        text = path.read_text(encoding="utf-8")
    else:
        rev = resolve(root, name)
        text = git_show(root, rev, report_path(root, rev))
    try:
        report = json.loads(text)
    except json.JSONDecodeError as e:
        raise NotComparable(f"{name}: not an eval report (invalid JSON: {e})") from e
    splits = report.get("splits") if isinstance(report, dict) else None
    settings = splits.get(split) if isinstance(splits, dict) else None
    if (not isinstance(settings, dict) or not settings or "prompts" not in report or "intervals" not in report
            or any(not isinstance(s, dict) or "per_request" not in s for s in settings.values())):
        has = sorted(splits) if isinstance(splits, dict) else "none"
        raise NotComparable(f"{name}: the eval report has no per-request figures of the {split} split (its splits: "
                            f"{has}; a report written by an older draftline has none): re-run the evaluate stage "
                            "there (dvc repro evaluate)")
    return Evaluation(name, report, split)


def _get(report: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        report = report.get(key, {}) if isinstance(report, dict) else {}
    return report if report != {} else None


def check_comparable(a: Evaluation, b: Evaluation) -> list[str]:
    """The settings both have (refusing a mismatch of :data:`SAME` or of a shared setting's sampling)."""
    fields = [*SAME, *(f"sampling.{s}" for s in sorted(set(a.settings) & set(b.settings)))]
    for field in fields:
        va, vb = _get(a.report, field), _get(b.report, field)
        if va != vb:
            raise NotComparable(f"{a.name} and {b.name} differ in {field}: {va!r} vs {vb!r}; compare evaluations "
                                "of the same prompts, target and settings")
    shared = [s for s in a.settings if s in b.settings]
    if not shared:
        raise NotComparable(f"{a.name} and {b.name} share no decoding setting: {sorted(a.settings)} vs "
                            f"{sorted(b.settings)}")
    return shared


def groups(requests: dict[str, list]) -> dict[str, list[str]]:
    """Request keys per group: ``overall``, each set (``set:<name>``), then each held-out source
    (``source:<name>``)."""
    sets: dict[str, list[str]] = {}
    sources: dict[str, list[str]] = {}
    for key in sorted(requests):
        set_name = key.split("/", 1)[0]
        sets.setdefault(f"set:{set_name}", []).append(key)
        if set_name == HELDOUT:
            sources.setdefault(f"source:{requests[key][0]}", []).append(key)
    return {"overall": sorted(requests), **dict(sorted(sets.items())), **dict(sorted(sources.items()))}


def compare_setting(a: dict[str, Any], b: dict[str, Any], draws: dict[str, Any], min_n: int = MIN_N) -> list[Row]:
    """Every group's :class:`Row` for one setting, over the requests both reports decoded."""
    ra, rb = a["per_request"], b["per_request"]
    shared = {k: ra[k] for k in ra if k in rb}
    if not shared:
        raise NotComparable("the two evaluations share no request with a verification step")
    draw = (draws["resamples"], draws["confidence"], draws["seed"])
    rows = []
    for group, keys in groups(shared).items():
        x = np.array([[ra[k][1], ra[k][2], rb[k][1], rb[k][2]] for k in keys], dtype=np.float64)
        acc_a, acc_b = x[:, 0] / x[:, 1], x[:, 2] / x[:, 3]
        rows.append(Row(group, float(acc_a.mean()), float(acc_b.mean()),
                        paired_bootstrap(acc_a, acc_b, *draw), bootstrap(x, ratio_difference, *draw), min_n))
    return rows


def compare(a: Evaluation, b: Evaluation, min_n: int = MIN_N) -> dict[str, list[Row]]:
    """A minus B, per shared setting (refused by :func:`check_comparable` when they are not comparable); a group of
    fewer than ``min_n`` requests gets no verdict."""
    if min_n < 1:
        raise NotComparable(f"--min-n must be at least 1, got {min_n}")
    settings = check_comparable(a, b)
    draws = a.report["intervals"]
    return {s: compare_setting(a.settings[s], b.settings[s], draws, min_n) for s in settings}


def table(a: Evaluation, b: Evaluation, result: dict[str, list[Row]]) -> str:
    """The comparison as text: one block per setting, one line per group."""
    draws = a.report["intervals"]
    lines = [f"A = {a.name}, B = {b.name}: A minus B on the {a.split} split, paired over the same requests, "
             f"{draws['confidence']:.0%} bootstrap intervals ({draws['resamples']} resamples, seed {draws['seed']})"]
    for setting, rows in result.items():
        lines += ["", f"{setting}:", f"  {'group':<28} {'n':>4} {'A':>6} {'B':>6}  {'acceptance A-B':<26}"
                  f"{'pooled tau A-B':<26} verdict"]
        for r in rows:
            lines.append(f"  {r.group:<28} {r.acceptance.n:>4} {r.a:>6.3f} {r.b:>6.3f}  {fmt(r.acceptance):<26}"
                         f"{fmt(r.tau):<26} {r.verdict}")
    return "\n".join(lines)


def fmt(iv: Interval) -> str:
    return f"{iv.estimate:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"


def as_json(result: dict[str, list[Row]]) -> dict[str, Any]:
    return {s: {r.group: {"a": r.a, "b": r.b, "acceptance": r.acceptance.as_dict(), "tau": r.tau.as_dict(),
                          "verdict": r.verdict} for r in rows} for s, rows in result.items()}
