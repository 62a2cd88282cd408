"""How sure an acceptance figure, or a difference of two, is: a seeded bootstrap over requests.

The statistics are z-lab's acceptance (the figure of DFlash model cards, ``draftline.evaluate.report.figures``: the
mean over requests of each request's mean tokens per verification step) and the pooled tau (tokens over steps, summed
over requests). :func:`bootstrap` resamples requests with replacement, a request's columns kept together, and takes
the percentile interval of the statistic: of one drafter's figure (the evaluate stage's ``acceptance_ci``,
``tau_ci``), or of two drafters' difference on the same requests (``draftline compare``, bench/peers.py), where a
request's pair moves as one, so what the two share, a hard prompt, cancels out. Figures pooled over several target
seeds come from :func:`clustered_bootstrap` (:func:`compare_seeds`): it draws the seeds with replacement, then each
drawn seed's requests, so the interval holds the seed-to-seed variance that resampling requests alone leaves out.

Invariants (``tests/evaluate/test_intervals.py``):

* a request counts once, on the requests both drafters have a verification step for (a turn the prefill's token
  already ended has none, as in :func:`draftline.evaluate.report.figures`); the count is reported (``n``);
* identical pairs give the interval ``[0, 0]``; a pair shifted by a constant gives that constant, exactly;
* the same inputs, resamples and seed give the same bytes (a numpy ``PCG64`` generator of ``seed``; nothing else
  draws from it), so an interval can be quoted and recomputed.

The per-step file of the evaluate stage (``--steps``, one line per setting, set, request and turn with ``produced``
per step) is the input: :func:`request_acceptance` reads its records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import mean
from typing import Any

import numpy as np

# Resamples drawn at a time: bounds the memory of the index matrix whatever the number of requests.
_CHUNK = 1000


@dataclass(frozen=True)
class Interval:
    """The mean paired difference ``estimate`` and its ``confidence`` percentile interval ``[low, high]``."""

    estimate: float
    low: float
    high: float
    n: int
    resamples: int
    confidence: float
    seed: int

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def request_acceptance(steps: Iterable[Mapping[str, Any]], setting: str, set_name: str = "heldout",
                       split: str | None = None) -> dict[str, tuple[str, float]]:
    """Each request's acceptance under ``setting`` on ``set_name`` (in ``split`` only, if given):
    ``{"<id>#<turn>": (source, mean produced)}``.

    ``steps`` are the evaluate stage's per-step records; a turn without a verification step is left out (it has no
    acceptance)."""
    out = {}
    for r in steps:
        if r["setting"] == setting and r["set"] == set_name and r["produced"] and split in (None, r.get("split")):
            out[f"{r['id']}#{r['turn']}"] = (r["source"], float(mean(r["produced"])))
    return out


def paired(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The requests both ``a`` and ``b`` have, in sorted order, and their two figures as arrays."""
    keys = sorted(set(a) & set(b))
    if not keys:
        raise ValueError("the two drafters share no request: were they evaluated on the same prompts?")
    return keys, np.array([a[k] for k in keys], dtype=np.float64), np.array([b[k] for k in keys], dtype=np.float64)


def bootstrap(columns: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray], resamples: int = 10_000,
              confidence: float = 0.95, seed: int = 0) -> Interval:
    """``statistic`` of the column means of ``columns`` (one row a request) and its percentile interval over
    ``resamples`` resamples of the rows drawn with replacement (a row kept whole: a request's figures, or a pair's,
    move together). ``statistic`` maps an ``(m, k)`` array of column means to ``m`` values."""
    x = np.asarray(columns, dtype=np.float64)
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"need a non-empty (requests, columns) array, got shape {x.shape}")
    if resamples < 1 or not 0 < confidence < 1:
        raise ValueError(f"resamples must be >= 1 and confidence in (0, 1), got {resamples} and {confidence}")
    rng = np.random.Generator(np.random.PCG64(seed))
    stats = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, _CHUNK):
        count = min(_CHUNK, resamples - start)
        stats[start:start + count] = statistic(x[rng.integers(0, len(x), size=(count, len(x)))].mean(axis=1))
    tail = (1 - confidence) / 2
    low, high = np.quantile(stats, [tail, 1 - tail])
    estimate = float(statistic(x.mean(axis=0)[None, :])[0])
    return Interval(estimate, float(low), float(high), len(x), resamples, confidence, seed)


def clustered_bootstrap(groups: Sequence[np.ndarray], statistic: Callable[[np.ndarray], np.ndarray],
                        resamples: int = 10_000, confidence: float = 0.95, seed: int = 0) -> Interval:
    """:func:`bootstrap` over requests that come in groups (a target seed's requests): each resample draws as many
    groups as there are with replacement, then each drawn group's rows with replacement, and takes ``statistic`` of
    the column means of all the rows drawn. The estimate is that of every row pooled; ``n`` counts the rows."""
    xs = [np.asarray(g, dtype=np.float64) for g in groups]
    if not xs or any(x.ndim != 2 or len(x) == 0 or x.shape[1] != xs[0].shape[1] for x in xs):
        raise ValueError(f"need non-empty (requests, columns) arrays of one width, got {[x.shape for x in xs]}")
    if resamples < 1 or not 0 < confidence < 1:
        raise ValueError(f"resamples must be >= 1 and confidence in (0, 1), got {resamples} and {confidence}")
    rng = np.random.Generator(np.random.PCG64(seed))
    stats = np.empty(resamples, dtype=np.float64)
    for i in range(resamples):
        drawn = [xs[g] for g in rng.integers(0, len(xs), size=len(xs))]
        rows = np.concatenate([x[rng.integers(0, len(x), size=len(x))] for x in drawn])
        stats[i] = statistic(rows.mean(axis=0)[None, :])[0]
    tail = (1 - confidence) / 2
    low, high = np.quantile(stats, [tail, 1 - tail])
    pooled = np.concatenate(xs)
    estimate = float(statistic(pooled.mean(axis=0)[None, :])[0])
    return Interval(estimate, float(low), float(high), len(pooled), resamples, confidence, seed)


def first(m: np.ndarray) -> np.ndarray:
    """The statistic of a mean (of the first column)."""
    return m[:, 0]


def ratio(m: np.ndarray) -> np.ndarray:
    """The statistic of a pooled ratio (sum of column 0 over sum of column 1): tau, produced over steps."""
    return m[:, 0] / m[:, 1]


def ratio_difference(m: np.ndarray) -> np.ndarray:
    """One pooled ratio minus another (columns: numerator and denominator of A, then of B)."""
    return m[:, 0] / m[:, 1] - m[:, 2] / m[:, 3]


def paired_bootstrap(a: Sequence[float], b: Sequence[float], resamples: int = 10_000, confidence: float = 0.95,
                     seed: int = 0) -> Interval:
    """The mean of ``a_i - b_i`` and its percentile bootstrap interval over ``resamples`` resamples of the pairs."""
    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if xa.ndim != 1 or xa.shape != xb.shape or len(xa) == 0:
        raise ValueError(f"need two equal-length, non-empty sequences of paired figures, got {len(a)} and {len(b)}")
    return bootstrap((xa - xb)[:, None], first, resamples, confidence, seed)


def of_source(x: Mapping[str, tuple[str, float]], source: str | None) -> dict[str, float]:
    """The figures of ``x`` (a :func:`request_acceptance` result) of one held-out ``source``, or all of them."""
    return {k: v for k, (s, v) in x.items() if source is None or s == source}


def compare(a: Mapping[str, tuple[str, float]], b: Mapping[str, tuple[str, float]], source: str | None = None,
            resamples: int = 10_000, confidence: float = 0.95, seed: int = 0) -> Interval:
    """``a`` minus ``b`` (two :func:`request_acceptance` results) over their shared requests, or over those of one
    held-out ``source``."""
    _, xa, xb = paired(of_source(a, source), of_source(b, source))
    return paired_bootstrap(xa, xb, resamples, confidence, seed)


def compare_seeds(a: Sequence[Mapping[str, tuple[str, float]]], b: Sequence[Mapping[str, tuple[str, float]]],
                  source: str | None = None, resamples: int = 10_000, confidence: float = 0.95,
                  seed: int = 0) -> Interval:
    """:func:`compare` pooled over target seeds: ``a[i]`` and ``b[i]`` are seed ``i``'s :func:`request_acceptance`
    results, paired within the seed; the interval resamples the seeds, then their requests
    (:func:`clustered_bootstrap`)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same non-zero number of seeds on both sides, got {len(a)} and {len(b)}")
    diffs = []
    for sa, sb in zip(a, b):
        _, xa, xb = paired(of_source(sa, source), of_source(sb, source))
        diffs.append((xa - xb)[:, None])
    return clustered_bootstrap(diffs, first, resamples, confidence, seed)
