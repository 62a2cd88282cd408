"""Picking rows within each source by a previous round's drafter (``blend.select: {by: drafter}``).

The blend first runs as always (hash rank), which says how many rows each weighted source gives. The first
``pool`` x that many of the source's hash rank are its candidates; each is scored by the drafter
(:mod:`draftline.prompts.score`), and the candidates are put first in the order ``rule`` gives, the rest after them
in hash rank; the blend then runs again on that order. So the amounts per source (and per domain with
``blend.target_mix``) are decided exactly as without a drafter, and only which rows fill them changes.

Rules: ``hardest`` takes the lowest scores first (ties by hash rank); ``sample`` draws without replacement with
weight block size - score (the tokens a verification step loses), by an exponential race keyed by the hash of
the id (Efraimidis-Spirakis), so it is deterministic and a source's easy prompts still get some rows; ``mix``
takes alternately the hardest candidate left and the next one in hash rank (half the rows by difficulty, half as
without a drafter).

Invariants: the held-out dev / test prompts are set aside by hash before any of this, so the ruler never depends on
the drafter; whole sources are taken in full and never scored; a candidate without a usable answer takes its
source's median score (counted as ``unscored``), and a source with no score at all keeps its hash rank.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from draftline.core.errors import Refusal
from draftline.core.fingerprint import code_digest, folder_digest
from draftline.core.logs import get_logger
from draftline.core.records import PromptRecord, TargetInfo
from draftline.core.scratch import scratch_dir
from draftline.prompts.blend import Pool, Selection, hash_rank
from draftline.prompts.params import BlendParams, SelectParams
from draftline.prompts.score import ScoreCache, candidate_key, score_windows, window
from draftline.prompts.steer import heldout_prompt

log = get_logger("draftline.prompts.select")


def candidate_count(pool: Pool, taken: int, factor: float) -> int:
    """How many of a source's rows (in hash rank) are scored: ``factor`` per row taken, at most all of them."""
    return min(len(pool.ids), math.ceil(factor * taken))


def order_by_rule(ids: Sequence[str], scores: dict[str, float], rule: str, seed: int, block_size: int) -> list[str]:
    """``ids`` (candidates, in hash rank) in the order ``rule`` takes them (module docstring)."""
    hardest = [i for _, _, i in sorted((scores[i], n, i) for n, i in enumerate(ids))]
    if rule == "hardest":
        return hardest
    if rule == "mix":
        return alternate(hardest, ids)

    def race(i: str) -> float:  # Exp(weight) race: the smallest key is drawn first
        u = (hash_rank(seed, f"select:{i}") + 0.5) / 2**64
        return -math.log(u) / max(block_size - scores[i], 1e-3)

    return sorted(ids, key=lambda i: (race(i), i))


def alternate(first: Sequence[str], second: Sequence[str]) -> list[str]:
    """The ids of ``first`` (``second`` holds the same ids), taken alternately from each order, each time its next id
    not yet taken."""
    taken: dict[str, None] = {}
    orders = [iter(first), iter(second)]
    while len(taken) < len(first):
        for order in orders:
            nxt = next((i for i in order if i not in taken), None)
            if nxt is not None:
                taken[nxt] = None
    return list(taken)


def reorder(pool: Pool, front: list[str]) -> Pool:
    """``pool`` with ``front`` first (in that order), then its other rows in their order."""
    cost = dict(zip(pool.ids, pool.costs))
    chosen = set(front)
    ids = front + [i for i in pool.ids if i not in chosen]
    return replace(pool, ids=ids, costs=[cost[i] for i in ids])


def fill_unscored(ids: Sequence[str], scores: dict[str, float | None]) -> tuple[dict[str, float], int]:
    """Scores for ``ids`` with the source's median where there is none; and how many had none."""
    known = [s for i in ids if (s := scores.get(i)) is not None]
    if not known:
        return {}, len(ids)
    median = statistics.median(known)
    return {i: s if (s := scores.get(i)) is not None else median for i in ids}, len(ids) - len(known)


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Count, mean and deciles 1 / 5 / 9 of some scores (the report's score distribution)."""
    if not values:
        return {"count": 0}
    q = statistics.quantiles(values, n=10) if len(values) > 1 else [values[0]] * 9
    return {"count": len(values), "mean": round(statistics.fmean(values), 4), "p10": round(q[0], 4),
            "p50": round(q[4], 4), "p90": round(q[8], 4)}


@dataclass
class DrafterChoice:
    """``blend.select: {by: drafter}``: scores candidates and reorders each weighted source's pool (module
    docstring). ``score`` maps records to their scores (None: no usable answer); the stage builds it with the
    drafter and the target (:func:`drafter_scorer`), tests with any proposer."""

    params: SelectParams
    seed: int
    block_size: int
    score: Callable[[Sequence[PromptRecord]], dict[str, float | None]]
    report: dict[str, Any] = field(default_factory=dict)

    def reorder(self, pools: Sequence[Pool], selection: Selection, records: dict[str, PromptRecord]) -> list[Pool]:
        """Each weighted pool with its candidates first, in the rule's order (whole and weight-0 pools as they are)."""
        candidates = {p.name: p.ids[: candidate_count(p, len(selection.train_ids[p.name]), self.params.pool)]
                      for p in pools if not p.whole and p.weight > 0}
        scores = self.score([records[i] for ids in candidates.values() for i in ids])
        out = []
        for p in pools:
            if p.name not in candidates:
                out.append(p)
                continue
            ids = candidates[p.name]
            filled, unscored = fill_unscored(ids, scores)
            front = order_by_rule(ids, filled, self.params.rule, self.seed, self.block_size) if filled else ids
            out.append(reorder(p, front))
            self.report[p.name] = {"candidates": len(ids), "unscored": unscored,
                                   "pool": summary([filled[i] for i in ids]) if filled else {"count": 0},
                                   "filled": filled}
        return out

    def correlate(self, dev: dict[str, Any], records: Sequence[PromptRecord]) -> dict[str, Any]:
        """Per evaluation setting, how the scores of the dev ``records`` rank against the acceptance ``dev`` (an
        evaluation's dev split of this drafter) measured on them (:func:`correlation`)."""
        scores = self.score(records)
        sources = {r.id: r.source for r in records}
        return {setting: correlation(scores, sources, request_acceptance(x.get("per_request", {})))
                for setting, x in dev.items() if isinstance(x, dict)}

    def describe(self, selection: Selection) -> dict[str, Any]:
        """Per scored source: candidates, unscored, and the score distribution of the pool and of the rows chosen."""
        out: dict[str, Any] = {"by": "drafter", "drafter": self.params.drafter, "rule": self.params.rule,
                               "pool": self.params.pool, "sources": {}}
        for name, x in self.report.items():
            chosen = [x["filled"][i] for i in selection.train_ids[name] if i in x["filled"]]
            out["sources"][name] = {"candidates": x["candidates"], "unscored": x["unscored"], "pool": x["pool"],
                                    "chosen": summary(chosen)}
        return out


def score_key(params: SelectParams, info: TargetInfo, enable_thinking: bool | None, device: str) -> dict[str, Any]:
    """Everything that decides a score: the drafter's bytes, the target's weights and tokenizer, the proxy's settings,
    where and in what dtype it ran, and the scoring code."""
    return {"drafter": folder_digest(params.drafter), "target_model": info.model_fingerprint,
            "tokenizer": info.tokenizer_fingerprint, "anchors": params.anchors, "max_tokens": params.max_tokens,
            "enable_thinking": enable_thinking, "dtype": params.dtype, "device": device,
            "code": code_digest("draftline.prompts", "draftline.drafter")}


def drafter_scorer(params: SelectParams, info: TargetInfo, tokenizer: Any, enable_thinking: bool | None,
                   stats: dict[str, Any]) -> tuple[Callable[[Sequence[PromptRecord]], dict[str, float | None]], int]:
    """The scoring function of ``blend.select.drafter`` against the target (loaded once, on first use), and the
    drafter's block size. The drafter is checked against the target before anything loads (a foreign one is refused
    in one line); ``stats`` gets the counts and seconds the run file reports."""
    from draftline.core.target import load_model
    from draftline.core.threads import torch_threads
    from draftline.drafter.checkpoint import read_config
    from draftline.drafter.decoding import DFlashProposer
    from draftline.drafter.fit import check_lineage, load_fitting, resolve_device, torch_dtype

    check_lineage(params.drafter, info)
    device = resolve_device(params.device)
    cache = ScoreCache(scratch_dir("prompts-scores", score_key(params, info, enable_thinking, device.type)))
    loaded: dict[str, Any] = {}

    def score(records: Sequence[PromptRecord]) -> dict[str, float | None]:
        started = time.perf_counter()
        with torch_threads(params.threads):
            if not loaded:
                target = load_model(info, dtype=torch_dtype(params.dtype), device=device)
                loaded.update(target=target, proposer=DFlashProposer(load_fitting(params.drafter, info, target)))
            windows = [w for r in records if (w := window(r, tokenizer, enable_thinking, params.max_tokens))]
            computed = cache.computed
            scores = score_windows(loaded["target"], loaded["proposer"], windows, params.anchors,
                                   params.batch_tokens, cache)
        stats["scored"] = stats.get("scored", 0) + len(windows)
        stats["scored_tokens"] = stats.get("scored_tokens", 0) + sum(len(w.ids) for w in windows)
        stats["from_cache"] = stats.get("from_cache", 0) + len(windows) - (cache.computed - computed)
        stats["damaged_cache_files"] = cache.damaged
        stats["score_seconds"] = stats.get("score_seconds", 0.0) + time.perf_counter() - started
        return {r.id: scores.get(candidate_key(r)) for r in records}

    return score, int(read_config(params.drafter).block_size)


def request_acceptance(per_request: dict[str, Any]) -> dict[str, float]:
    """Each held-out prompt's acceptance in an evaluation's ``per_request`` (``heldout/<id>#<turn>``: [source,
    tokens produced, steps]): its turns' tokens over their steps."""
    produced: dict[str, list[float]] = {}
    for key, figure in per_request.items():
        if (i := heldout_prompt(key)) is None:
            continue
        if not (isinstance(figure, list) and len(figure) == 3 and all(isinstance(x, int | float) for x in figure[1:])):
            raise Refusal(f"blend.select.eval: per_request[{key!r}] is {figure!r}, not [source, tokens, steps]: "
                          "evaluate that drafter again (dvc repro evaluate) and keep the new report")
        t = produced.setdefault(i, [0.0, 0.0])
        t[0], t[1] = t[0] + figure[1], t[1] + figure[2]
    return {i: t / s for i, (t, s) in produced.items() if s}


def correlation(scores: dict[str, float | None], sources: dict[str, str], measured: dict[str, float]) -> dict[str, Any]:
    """Spearman's rank correlation between score and measured acceptance, per source and over all prompts that have
    both (``sources``: a prompt id's source), with a 95% interval (Fisher's z with Fieller's variance 1.06 / (n - 3),
    the usual one for Spearman's rho; from 5 prompts)."""
    from scipy.stats import spearmanr

    both = [i for i in sorted(measured) if scores.get(i) is not None and i in sources]

    def rho(ids: list[str]) -> dict[str, Any]:
        if len(ids) < 5:
            return {"n": len(ids), "spearman": None}
        r = spearmanr([scores[i] for i in ids], [measured[i] for i in ids]).statistic
        if math.isnan(r):
            return {"n": len(ids), "spearman": None}
        z, half = math.atanh(max(min(r, 0.999999), -0.999999)), 1.96 * math.sqrt(1.06 / (len(ids) - 3))
        return {"n": len(ids), "spearman": round(float(r), 4),
                "ci": [round(math.tanh(z - half), 4), round(math.tanh(z + half), 4)]}

    per_source = {s: rho([i for i in both if sources[i] == s]) for s in sorted({sources[i] for i in both})}
    return {"all": rho(both), "per_source": per_source}


def drafter_choice(blend: BlendParams, info: TargetInfo, tokenizer: Any, enable_thinking: bool | None,
                   stats: dict[str, Any]) -> DrafterChoice | None:
    """``blend.select``'s chooser, or None for ``by: hash``."""
    if blend.select.by == "hash":
        return None
    score, block_size = drafter_scorer(blend.select, info, tokenizer, enable_thinking, stats)
    return DrafterChoice(blend.select, blend.seed, block_size, score)


def format_select(report: dict[str, Any]) -> str:
    """The console table: per scored source, the pool's and the chosen rows' mean score, and the correlations."""
    lines = [f"blend.select by {report['drafter']} ({report['rule']}, pool {report['pool']}): mean teacher-forced "
             "acceptance", f"{'source':<20} {'candidates':>10} {'unscored':>8} {'pool':>6} {'chosen':>6}"]
    for s, x in report["sources"].items():
        pool, chosen = x["pool"].get("mean"), x["chosen"].get("mean")
        lines.append(f"{s:<20} {x['candidates']:>10} {x['unscored']:>8} {pool or 0:>6.2f} {chosen or 0:>6.2f}")
    for setting, c in report.get("correlation", {}).items():
        lines.append(f"score vs measured acceptance ({setting}, dev): Spearman {c['all']['spearman']} over "
                     f"{c['all']['n']} prompts")
    return "\n".join(lines)


def score_rows(report: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The plot: per scored source, the mean score of its candidates and of the rows chosen (grouped bars)."""
    rows = []
    for s, x in (report or {}).get("sources", {}).items():
        for group in ("pool", "chosen"):
            if x[group].get("mean") is not None:
                rows.append({"source": s, "series": group, "score": x[group]["mean"]})
    return rows
