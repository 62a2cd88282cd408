"""Decontamination in the prompt stage: no training prompt gives away an evaluation prompt.

The evaluation prompts and the index that finds hits are :mod:`draftline.core.contamination`'s (its docstring
states the matching rules); merge checks a base's rows with the same. Invariants here:

- The evaluation prompts are every ``evaluate.sets`` user turn, every ``decontaminate.extra`` prompt, and the
  held-out prompts (dev and test) this stage sets aside, indexed as found among the kept prompts, so the split (a
  hash of the id) never depends on the check.
- A held-out prompt is an evaluation prompt itself: only a set's or an extra file's prompt can disqualify it.
- A hit is dropped and counted per source and per set (a prompt hitting two sets counts in both).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from draftline.core.contamination import (
    HELDOUT,
    DecontaminateParams,
    EvalIndex,
    EvalPrompt,
    best_per_set,
    excerpt,
)
from draftline.core.records import PromptRecord
from draftline.core.skips import Skips
from draftline.prompts.canonical import user_text

# What the stage, its tests and bench/decontaminate.py take from here (the shared parts re-exported).
# ------------------------------------------------------------------------------------------------------ the check


@dataclass
class Contamination:
    """What the check dropped: per source, per evaluation set (a prompt hitting two sets counts in both), and the
    first few examples of each set."""

    sets: list[str]
    by_source: Counter[str] = field(default_factory=Counter)
    by_set: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[dict]] = field(default_factory=dict)
    eval_prompts: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def report(self, params: DecontaminateParams) -> dict:
        """``reports/prompts.json: decontamination``."""
        return {"ngram": params.ngram, "threshold": params.threshold, "shared_by": params.shared_by,
                "eval_prompts": {s: self.eval_prompts[s] for s in self.sets}, "dropped": sum(self.by_source.values()),
                "by_set": {s: self.by_set[s] for s in self.sets}, "by_source": dict(sorted(self.by_source.items())),
                "examples": {s: self.examples.get(s, []) for s in self.sets}}

    def headline(self) -> dict[str, int]:
        """``metrics/prompts.json: contaminated``: the total dropped, then per set (``dvc metrics show``)."""
        return {"total": sum(self.by_source.values()), **{s: self.by_set[s] for s in self.sets}}


def decontaminate(kept: Sequence[PromptRecord], held_out: set[str], outside: Sequence[EvalPrompt],
                  params: DecontaminateParams, skips: Skips, examples: int = 3) -> tuple[frozenset[str], Contamination]:
    """The ids of ``kept`` to drop, and the counts. A prompt hits when it gives away an ``outside`` evaluation
    prompt (a set's, an extra file's) or, unless held out itself, one of the ``held_out`` prompts. Held-out
    prompts are indexed as found in ``kept``, so the split (a hash of the id) never depends on the check."""
    started = time.perf_counter()
    held = [EvalPrompt(HELDOUT, f"{r.source} row {r.row}", user_text(r)) for r in kept if r.id in held_out]
    prompts = [*outside, *held]
    sets = list(dict.fromkeys([p.set for p in outside] + [HELDOUT]))
    c = Contamination(sets, eval_prompts=Counter(p.set for p in prompts))
    index = EvalIndex.build(prompts, params.ngram, params.shared_by)
    dropped = set()
    for r, hit in zip(kept, index.hits([user_text(r) for r in kept], params.threshold)):
        # A held-out prompt is an evaluation prompt itself: only a set's or a file's prompt can disqualify it.
        hit = {e: x for e, x in hit.items() if r.id not in held_out or prompts[e].set != HELDOUT}
        if not hit:
            continue
        dropped.add(r.id)
        c.by_source[r.source] += 1
        best = best_per_set(hit, prompts)
        for name, (e, share) in best.items():
            c.by_set[name] += 1
            if len(c.examples.setdefault(name, [])) < examples:
                c.examples[name].append({"source": r.source, "row": r.row, "id": r.id, "prompt": excerpt(user_text(r)),
                                         "eval": prompts[e].where, "eval_prompt": excerpt(prompts[e].text),
                                         "coverage": share})
        first = min(best.items(), key=lambda kv: kv[1][0])
        skips.add("contaminated", f"{r.source} row {r.row}",
                  f"{first[0]} {prompts[first[1][0]].where}, {first[1][1]:.0%} of its n-grams")
    c.seconds = time.perf_counter() - started
    return frozenset(dropped), c
