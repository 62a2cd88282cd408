"""The served figures, each with its interval: what the serve stage reports for every arm, and its headline.

- ``tokens_per_s``: output tokens over the wall seconds of the run, prompt processing included, one request in
  flight; ``decode_tokens_per_s``: the engine's own figure after each first token (llama.cpp's
  ``predicted_per_second``, pooled); ``tokens_per_s_busy``: with ``slots`` requests in flight.
- ``speed_up`` and ``decode_speed_up``: an arm's figure over the target alone's, with a 95% (evaluate's confidence)
  bootstrap interval over turns, a turn's tokens and seconds in both arms resampled together (paired).
- ``greedy`` and ``sampled``: z-lab's acceptance (the mean over turns of tokens per step, the prefill's token not
  counted, as evaluate) and the pooled tau, with their intervals (evaluate's resamples and seed).
- ``lossless``: the share of greedy turns whose ids with speculation equal the target's alone.
- ``evaluate`` (the drafter): greedy turns whose ids equal evaluate's (its per-step file's digests) and, of those,
  whose steps do; both acceptances over those turns.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean
from typing import Any

import numpy as np

from draftline.core.intervals import Interval, bootstrap, first, ratio
from draftline.core.requests import tokens_digest
from draftline.serve.measure import Run, Turn
from draftline.serve.params import Judged

PLOT_COLUMNS = ["arm", "tokens_per_s", "low", "high"]


def _interval(i: Interval) -> list[float]:
    return [round(i.estimate, 3), round(i.low, 3), round(i.high, 3)]


def acceptance(turns: list[Turn], j: Judged) -> dict[str, Any] | None:
    """z-lab's acceptance and the pooled tau over the turns with a step, each with its interval."""
    stepped = [t for t in turns if t.steps]
    if not stepped:
        return None
    z = bootstrap(np.array([(len(t.tokens) - 1) / t.steps for t in stepped])[:, None], first, j.resamples,
                  j.confidence, j.interval_seed)
    tau = bootstrap(np.array([(len(t.tokens) - 1, t.steps) for t in stepped], dtype=float), ratio, j.resamples,
                    j.confidence, j.interval_seed)
    return {"acceptance": _interval(z), "tau": _interval(tau), "turns": len(stepped)}


def speed_up(arm: list[Turn], base: list[Turn], j: Judged) -> dict[str, list[float]]:
    """``arm``'s tokens/s over ``base``'s, end to end and in decoding alone, paired by turn."""
    pairs = {t.key: t for t in base}
    both = [(a, pairs[a.key]) for a in arm if a.key in pairs]
    out = {}
    for name, rows in (("speed_up", [(len(a.tokens), a.seconds, len(b.tokens), b.seconds) for a, b in both]),
                       ("decode_speed_up", [(len(a.tokens) - 1, a.decode_s, len(b.tokens) - 1, b.decode_s)
                                            for a, b in both if a.decode_s and b.decode_s])):
        if rows:
            ci = bootstrap(np.array(rows, dtype=float), lambda m: (m[:, 0] / m[:, 1]) / (m[:, 2] / m[:, 3]),
                           j.resamples, j.confidence, j.interval_seed)
            out[name] = _interval(ci)
    return out


def decode_rate(turns: list[Turn]) -> float | None:
    timed = [t for t in turns if t.decode_s]
    return round(sum(len(t.tokens) - 1 for t in timed) / sum(t.decode_s for t in timed), 1) if timed else None


def lossless(arm: list[Turn], base: list[Turn]) -> float:
    alone = {t.key: t.tokens for t in base}
    return round(sum(t.tokens == alone.get(t.key) for t in arm) / max(1, len(arm)), 4)


def against_evaluate(turns: list[Turn], steps_file: Path) -> dict[str, Any]:
    """The drafter's greedy turns against evaluate's: equal ids (its digests), and of those equal steps."""
    ours = {}
    for line in steps_file.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r["setting"] == "greedy":
            ours[f"{r['id']}#{r['turn']}"] = (r["tokens_xxh64"], len(r["produced"]), sum(r["produced"]))
    shared = [t for t in turns if t.key in ours]
    same = [t for t in shared if tokens_digest(t.tokens) == ours[t.key][0]]
    stepped = [t for t in same if t.steps and ours[t.key][1]]
    differ = [t.key for t in shared if tokens_digest(t.tokens) != ours[t.key][0] or t.steps != ours[t.key][1]]
    return {"turns": len(shared), "same_tokens": len(same), "same_steps": sum(t.steps == ours[t.key][1] for t in same),
            "differ": differ[:20],
            "acceptance_engine": round(mean((len(t.tokens) - 1) / t.steps for t in stepped), 4) if stepped else None,
            "acceptance_evaluate": round(mean(ours[t.key][2] / ours[t.key][1] for t in stepped), 4) if stepped else None}


def arm_row(arm: str, runs: dict[str, Run | None], base: dict[str, Run | None] | None, j: Judged,
            steps_file: Path) -> dict[str, Any]:
    greedy, busy = runs["greedy"], runs["busy"]
    tokens = sum(len(t.tokens) for t in greedy.turns)
    row: dict[str, Any] = {"tokens": tokens, "tokens_per_s": round(tokens / greedy.wall_s, 1),
                           "decode_tokens_per_s": decode_rate(greedy.turns),
                           "tokens_per_s_busy": round(sum(len(t.tokens) for t in busy.turns) / busy.wall_s, 1)}
    if base is not None and arm != "target":
        row.update(speed_up(greedy.turns, base["greedy"].turns, j), lossless=lossless(greedy.turns, base["greedy"].turns))
        base_busy = sum(len(t.tokens) for t in base["busy"].turns) / base["busy"].wall_s
        row["speed_up_busy"] = round(row["tokens_per_s_busy"] / base_busy, 3)
    row["greedy"] = acceptance(greedy.turns, j) if arm != "target" else None
    row["sampled"] = acceptance(runs["sampled"].turns, j) if runs["sampled"] else None
    if arm == "drafter" and steps_file.is_file():
        row["evaluate"] = against_evaluate(greedy.turns, steps_file)
    return row


def headline(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The drafter's speed-up (end to end, decoding), tokens/s, acceptance greedy and sampled, losslessness, and the
    best training-free mode's speed-up: what ``dvc metrics show`` gives."""
    d = arms.get("drafter")
    if d is None:
        return {}
    out = {"speed_up": d.get("speed_up", [None])[0], "decode_speed_up": d.get("decode_speed_up", [None])[0],
           "tokens_per_s": d["tokens_per_s"], "lossless": d.get("lossless"),
           "served_acceptance": (d["greedy"] or {}).get("acceptance", [None])[0],
           "served_acceptance_sampled": (d["sampled"] or {}).get("acceptance", [None])[0]}
    ngram = [r["speed_up"][0] for a, r in arms.items() if a.startswith("ngram") and "speed_up" in r]
    if ngram:
        out["best_ngram_speed_up"] = max(ngram)
    return out


def plot_rows(arms: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Tokens/s per arm (one request in flight), with the speed-up's interval scaled to tokens/s as error bars."""
    base = arms.get("target", {}).get("tokens_per_s")
    rows = []
    for arm, r in arms.items():
        low, high = (r["speed_up"][1] * base, r["speed_up"][2] * base) if base and "speed_up" in r else (None, None)
        rows.append({"arm": arm, "tokens_per_s": r["tokens_per_s"], "low": low and round(low, 1),
                     "high": high and round(high, 1)})
    return rows
