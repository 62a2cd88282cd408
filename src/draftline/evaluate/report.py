"""What an evaluation found, per decoding setting: both acceptance figures, per set and per source, losslessness,
the acceptance rate by draft position, the histogram of acceptance lengths, and every step of every turn.

Two figures of one run, both honest, different statistics:

* ``tau`` (pooled): tokens produced over verification steps, summed over every turn first. Long turns weigh more.
* ``acceptance`` (z-lab's figure, the one DFlash model cards and ``dflash benchmark`` quote): the mean over turns of
  each turn's mean tokens per verification step. Turns with no step (the first token already ended them) are left
  out; the prefill's first token is counted in neither figure.

Both are computed from ``produced`` (per step: the accepted drafts + the target's token, cut at a stop or at
``max_new_tokens``), which the per-step file holds, so another tool can recompute both.

Figures are per split (``dev``, ``test``: core/splits.py), never pooled over both. Every figure of a group of
turns (overall, a set, a source) carries its interval (``acceptance_ci``, ``tau_ci``): a seeded bootstrap over the
group's turns (``evaluate.intervals``), so the same report gives the same bounds. Each setting keeps every turn's
``produced`` sum and step count (``per_request``): two reports on the same prompts can be compared request by
request (``draftline compare``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from statistics import mean
from typing import Any

import numpy as np

from draftline.core.intervals import bootstrap, first, ratio
from draftline.core.requests import HELDOUT, tokens_digest
from draftline.core.splits import DEV, SPLITS, TEST, split_of
from draftline.drafter.speculative import Generation, SelectorStep
from draftline.evaluate.params import IntervalParams

ACCEPTANCE_COLUMNS = ["position", "steps", "accepted", "accept_rate", "conditional_rate"]
HISTOGRAM_COLUMNS = ["length", "steps", "share"]
INTERVAL_COLUMNS = ["group", "split", "acceptance", "low", "high", "turns"]


@dataclass
class TurnResult:
    setting: str
    set: str
    source: str
    id: str
    turn: int
    prompt_tokens: int
    speculative: Generation
    baseline: Generation | None  # target-only decoding (greedy settings only: the losslessness check)
    selector: dict[str, int] | None = None  # a DFlash 2 drafter's counts (greedy settings): :func:`selector_counts`

    @property
    def split(self) -> str:
        return split_of(self.id)

    @property
    def identical(self) -> bool | None:
        return None if self.baseline is None else self.baseline.tokens == self.speculative.tokens


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def figures(results: list[TurnResult]) -> dict[str, Any]:
    """``tau`` (pooled), ``acceptance`` (z-lab's), and how many turns and steps they come from."""
    steps = sum(r.speculative.steps for r in results)
    per_turn = [mean(r.speculative.produced) for r in results if r.speculative.steps]
    return {
        "tau": _r(sum(sum(r.speculative.produced) for r in results) / steps) if steps else None,
        "acceptance": _r(mean(per_turn)) if per_turn else None,
        "turns": len(results),
        "steps": steps,
    }


def figures_with_intervals(results: list[TurnResult], ci: IntervalParams) -> dict[str, Any]:
    """:func:`figures` and the ``ci.confidence`` bootstrap interval of each, over the turns with a step."""
    out = figures(results)
    turns = [r.speculative for r in results if r.speculative.steps]
    if turns:
        draw = (ci.resamples, ci.confidence, ci.seed)
        acceptance = bootstrap(np.array([[mean(t.produced)] for t in turns]), first, *draw)
        tau = bootstrap(np.array([[sum(t.produced), t.steps] for t in turns]), ratio, *draw)
        out |= {"acceptance_ci": [_r(acceptance.low), _r(acceptance.high)], "tau_ci": [_r(tau.low), _r(tau.high)]}
    return out


def request_key(r: TurnResult) -> str:
    """A turn's name in ``per_request``: unique over the sets (a set's ids may repeat another's)."""
    return f"{r.set}/{r.id}#{r.turn}"


def per_request(results: list[TurnResult]) -> dict[str, list]:
    """Every turn with a step: ``[source, tokens produced, verification steps]`` (its acceptance is their ratio)."""
    return {request_key(r): [r.source, sum(r.speculative.produced), r.speculative.steps]
            for r in sorted(results, key=request_key) if r.speculative.steps}


def _prefix(drafts: list, gold: list[int], hit) -> int:
    n = 0
    for d, g in zip(drafts, gold):
        if not hit(d, g):
            break
        n += 1
    return n


def selector_counts(steps: list[SelectorStep], sequence: list[int]) -> dict[str, int]:
    """What DFlash 2 trainers log, counted over one greedy turn. ``sequence`` is the prompt and the generated ids:
    greedy, the target's own tokens whatever was drafted, so each drafted position's gold token is known (up to the
    end of the turn). Per step: the tokens the selector's path, the unary argmax path and the top-K oracle (gold in
    the candidates) would each yield (accepted prefix + the target's token); per position: gold in the top-K
    (recall), the path's token equal to gold (selector accuracy)."""
    c: Counter[str] = Counter()
    for st in steps:
        gold = sequence[st.position : st.position + len(st.path)]
        if not gold:
            continue
        c["steps"] += 1
        c["positions"] += len(gold)
        c["in_top_k"] += sum(g in cand for g, cand in zip(gold, st.candidates))
        c["path_hits"] += sum(a == g for a, g in zip(st.path, gold))
        c["selector"] += _prefix(st.path, gold, int.__eq__) + 1
        c["unary"] += _prefix(st.unary, gold, int.__eq__) + 1
        c["oracle"] += _prefix(st.candidates, gold, lambda cand, g: g in cand) + 1
    return dict(c)


def selector_figures(results: list[TurnResult]) -> dict[str, Any] | None:
    """The selector's figures over the turns that have counts (None for a DFlash 1 drafter)."""
    c = sum((Counter(r.selector) for r in results if r.selector), Counter())
    if not c["steps"]:
        return None
    return {"top_k_recall": _r(c["in_top_k"] / c["positions"]), "selector_accuracy": _r(c["path_hits"] / c["positions"]),
            "tau_selector_path": _r(c["selector"] / c["steps"]), "tau_unary_path": _r(c["unary"] / c["steps"]),
            "tau_top_k_oracle": _r(c["oracle"] / c["steps"]), "steps": c["steps"]}


def _grouped(results: list[TurnResult], key) -> dict[str, list[TurnResult]]:
    groups: dict[str, list[TurnResult]] = defaultdict(list)
    for r in results:
        groups[key(r)].append(r)
    return dict(sorted(groups.items()))


def summarize_setting(results: list[TurnResult], block_size: int, ci: IntervalParams) -> dict[str, Any]:
    """One setting's report: both figures with their intervals overall, per set and per held-out source; the
    histogram of acceptance lengths (z-lab's, over every step); losslessness where a baseline was decoded; forwards
    saved; every turn's figures."""
    lengths = Counter(n for r in results for n in r.speculative.produced)
    total = sum(lengths.values())
    checked = [r for r in results if r.baseline is not None]
    with_drafter = sum(r.speculative.target_forwards for r in checked)
    without = sum(r.baseline.target_forwards for r in checked)
    return {
        **figures_with_intervals(results, ci),
        "per_set": {s: figures_with_intervals(rs, ci) for s, rs in _grouped(results, lambda r: r.set).items()},
        "per_source": {s: figures_with_intervals(rs, ci)
                       for s, rs in _grouped([r for r in results if r.set == HELDOUT], lambda r: r.source).items()},
        "histogram": [round(lengths[n] / total, 4) if total else 0.0 for n in range(block_size + 1)],
        "lossless": _r(sum(bool(r.identical) for r in checked) / len(checked)) if checked else None,
        "mismatched": sorted(f"{r.id}#{r.turn}" for r in checked if not r.identical),
        "target_forwards": {
            "with_drafter": with_drafter,
            "without_drafter": without,
            "saved_fraction": _r(1 - with_drafter / without) if without else None,
        },
        "generated_tokens": sum(len(r.speculative.tokens) for r in results),
        "selector": selector_figures(results),
        "stop_reasons": dict(sorted(Counter(r.speculative.stop_reason for r in results).items())),
        "per_request": per_request(results),
    }


def summarize(results: dict[str, list[TurnResult]], block_size: int, ci: IntervalParams) -> dict[str, Any]:
    """The report's ``splits``: per split that has requests (``dev``, ``test``), per setting, :func:`summarize_setting`
    of that split's turns. The splits are never pooled: a figure is a dev figure or a test figure."""
    return {split: {name: summarize_setting([r for r in rs if r.split == split], block_size, ci)
                    for name, rs in results.items()}
            for split in SPLITS if any(r.split == split for rs in results.values() for r in rs)}


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The figures compared between experiments, per setting, on ``test``: z-lab's acceptance on every set, the bounds
    of its interval on the held-out prompts, the pooled tau there, the lowest held-out source's acceptance (the
    drafter's weakest kind of prompt); ``dev``: each setting's held-out acceptance (what decisions read; its interval
    is in the report); and ``lossless`` (the lowest over every greedy setting and split)."""
    out: dict[str, Any] = {}
    for name, s in report["splits"].get(TEST, {}).items():
        per_source = [f["acceptance"] for f in s["per_source"].values() if f["acceptance"] is not None]
        low, high = s["per_set"].get(HELDOUT, {}).get("acceptance_ci", [None, None])
        out[name] = {
            "acceptance": {set_: f["acceptance"] for set_, f in s["per_set"].items()},
            "acceptance_low": low,
            "acceptance_high": high,
            "tau": s["per_set"].get(HELDOUT, {}).get("tau"),
            "acceptance_min_source": min(per_source) if per_source else None,
        }
    dev = {name: s["per_set"].get(HELDOUT, {}).get("acceptance") for name, s in report["splits"].get(DEV, {}).items()}
    if dev:
        out["dev"] = dev
    lossless = [s["lossless"] for split in report["splits"].values() for s in split.values() if s["lossless"] is not None]
    out["lossless"] = min(lossless) if lossless else None
    return out


def acceptance_by_position(results: list[TurnResult], block_size: int) -> list[dict[str, Any]]:
    """Per draft position k: how often the target accepted it (``accept_rate``), and how often when k-1 was.

    Position k is accepted when the first k drafts all are; a falling ``conditional_rate`` shows where in the
    block the drafter loses the thread.
    """
    pairs = [(a, d) for r in results for a, d in zip(r.speculative.accepted, r.speculative.drafted)]
    rows = []
    for k in range(1, block_size):
        steps = sum(1 for _, d in pairs if d >= k)
        reached = sum(1 for a, d in pairs if d >= k and a >= k - 1)
        accepted = sum(1 for a, _ in pairs if a >= k)
        rows.append({
            "position": k,
            "steps": steps,
            "accepted": accepted,
            "accept_rate": round(accepted / steps, 4) if steps else 0.0,
            "conditional_rate": round(accepted / reached, 4) if reached else 0.0,
        })
    return rows


def histogram_rows(histogram: list[float], results: list[TurnResult]) -> list[dict[str, Any]]:
    """The histogram of acceptance lengths as plot rows (length 0 never happens: a step emits at least one)."""
    counts = Counter(n for r in results for n in r.speculative.produced)
    return [{"length": n, "steps": counts[n], "share": share} for n, share in enumerate(histogram) if n > 0]


def interval_rows(splits: dict[str, dict], setting: str) -> list[dict[str, Any]]:
    """The acceptance plot's rows for one setting: every set and held-out source, in each split, with the bounds of
    its interval (the plot draws them as error bars)."""
    rows = []
    for split, settings in splits.items():
        s = settings.get(setting)
        if s is None:
            continue
        groups = {**{f"set {k}": v for k, v in s["per_set"].items()}, **{k: v for k, v in s["per_source"].items()}}
        for group, f in groups.items():
            if f["acceptance"] is not None:
                low, high = f["acceptance_ci"]
                rows.append({"group": group, "split": split, "acceptance": f["acceptance"], "low": low, "high": high,
                             "turns": f["turns"]})
    return rows


def step_record(r: TurnResult) -> dict[str, Any]:
    """One line of the per-step file: a turn's drafted, accepted and produced counts per verification step, and a
    digest of its output ids (:func:`tokens_digest`: a server's output compared with evaluate's: the serve stage)."""
    return {"setting": r.setting, "split": r.split, "set": r.set, "source": r.source, "id": r.id, "turn": r.turn,
            "prompt_tokens": r.prompt_tokens, "drafted": r.speculative.drafted, "accepted": r.speculative.accepted,
            "produced": r.speculative.produced, "stop_reason": r.speculative.stop_reason,
            "tokens_xxh64": tokens_digest(r.speculative.tokens)}

