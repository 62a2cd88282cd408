"""Decontamination of the base: no row a ``merge.base`` carries in gives away an evaluation prompt.

The prompt stage checks every new training prompt (:mod:`draftline.prompts.decontaminate`); a base is an earlier
round's (or another project's) rows, checked here against the same evaluation prompts with the same index and
rules (:mod:`draftline.core.contamination`). Invariants:

- The evaluation prompts are every ``evaluate.sets`` user turn, every ``decontaminate.extra`` prompt, and the user
  turns of the prompt stage's held-out prompts (``eval.jsonl``).
- A base row's prompt is its non-assistant tokens (``loss_mask`` 0), decoded with the target's tokenizer: one text
  per run of them between special tokens, less a leading role line (``user``), so that no text crosses a turn and
  a short question still equals its evaluation prompt whole. A row hits when any of its texts hits; every kind of
  base (draftline, legacy, another trainer's) is read the same way, from the tables the merge opened.
- ``decontaminate.base: drop`` leaves the hit rows out of the merged set; ``report`` keeps them. Both count them
  per set (a row hitting two sets counts in both) with the first few examples; the outcome depends on the rows
  alone, never on how they are cut into shards.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from draftline.core import dataset as fmt
from draftline.core.contamination import (
    HELDOUT,
    DecontaminateParams,
    EvalIndex,
    EvalPrompt,
    best_per_set,
    excerpt,
    extra_prompts,
    set_prompts,
)
from draftline.core.errors import MissingInput
from draftline.core.records import read_prompts
from draftline.core.skips import Skips

# A template's role header left at a text's start once its special tokens are cut out ("user\n" after <|im_start|>).
_ROLE_LINE = re.compile(r"^[A-Za-z_]+[ \t]*\n")


def evaluation_prompts(p: DecontaminateParams, sets: list[str], sets_dir: Path, held_out: Path,
                       skips: Skips) -> list[EvalPrompt]:
    """The sets' user turns, the extra files' prompts and the held-out prompts' user turns (``eval.jsonl``)."""
    if not Path(held_out).is_file():
        raise MissingInput(f"{held_out} does not exist: run the prompt stage first (dvc repro prompts)")
    held = [EvalPrompt(HELDOUT, f"{r.source} row {r.row}", "\n".join(m["content"] for m in r.messages
                                                                      if m["role"] == "user"))
            for r in read_prompts(held_out, skips)]
    return [*set_prompts(sets, sets_dir, skips), *(e for path in p.extra for e in extra_prompts(path, skips)),
            *(e for e in held if e.text.strip())]


def special_ids(tokenizer: Any) -> np.ndarray:
    """The ids of the tokenizer's special tokens (a ``tokenizers.Tokenizer``), sorted."""
    return np.array(sorted(i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special), np.int64)


def prompt_texts(table: pa.Table, tokenizer: Any, special: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """``(row of each text, texts)``: every run of a row's non-assistant, non-special tokens, decoded (see the
    module docstring); a row without any gives no text."""
    offsets, tokens, mask = fmt.flat_tokens(table)
    keep = np.flatnonzero(~mask & ~np.isin(tokens, special))
    row = np.searchsorted(offsets, keep, side="right") - 1
    cut = np.flatnonzero((np.diff(keep) != 1) | (np.diff(row) != 0)) + 1
    runs = np.split(keep, cut) if len(keep) else []
    texts = tokenizer.decode_batch([tokens[r].tolist() for r in runs], skip_special_tokens=False)
    return row[np.concatenate([[0], cut])].astype(np.int64) if runs else np.zeros(0, np.int64), [
        _ROLE_LINE.sub("", t, count=1) for t in texts]


@dataclass
class BaseContamination:
    """The base rows that hit (``hit``: one bool a base row, in row order) and the counts of the report."""

    mode: str
    sets: list[str]
    hit: np.ndarray
    by_set: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[dict]] = field(default_factory=dict)
    eval_prompts: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def drop(self) -> np.ndarray:
        """The base rows the merged set leaves out: the hits under ``drop``, none under ``report``."""
        return self.hit if self.mode == "drop" else np.zeros_like(self.hit)

    def report(self, params: DecontaminateParams) -> dict:
        """``reports/merge.json: decontamination``."""
        return {"mode": self.mode, "ngram": params.ngram, "threshold": params.threshold,
                "shared_by": params.shared_by, "eval_prompts": {s: self.eval_prompts[s] for s in self.sets},
                "base_rows_hit": int(self.hit.sum()), "dropped": int(self.drop.sum()),
                "by_set": {s: self.by_set[s] for s in self.sets}, "examples": {s: self.examples.get(s, []) for s in self.sets}}

    def headline(self) -> dict[str, int]:
        """``metrics/merge.json: contaminated``: the base rows that hit, then per set."""
        return {"total": int(self.hit.sum()), **{s: self.by_set[s] for s in self.sets}}


def check_base_rows(tables: list[pa.Table], where: str, prompts: list[EvalPrompt], params: DecontaminateParams,
                    tokenizer: Any, skips: Skips, examples: int = 3) -> BaseContamination:
    """Check every row of ``tables`` (the base, in row order) against ``prompts``; the sets are counted in their
    order there, ``heldout`` last (as the prompt stage counts them)."""
    started = time.perf_counter()
    sets = list(dict.fromkeys([p.set for p in prompts if p.set != HELDOUT] + [HELDOUT]))
    c = BaseContamination(params.base, sets, np.zeros(sum(t.num_rows for t in tables), bool),
                          eval_prompts=Counter(p.set for p in prompts))
    if not prompts:
        return c
    index = EvalIndex.build(prompts, params.ngram, params.shared_by)
    special, start = special_ids(tokenizer), 0
    for table in tables:
        for piece in fmt.pieces(table):
            rows, texts = prompt_texts(piece, tokenizer, special)
            best: dict[int, dict[str, tuple[int, float, str]]] = {}
            for r, text, hit in zip(rows.tolist(), texts, index.hits(texts, params.threshold)):
                for name, (e, share) in best_per_set(hit, prompts).items():
                    best.setdefault(start + r, {}).setdefault(name, (e, share, text))
            for row, per_set in sorted(best.items()):
                _count(c, row, per_set, prompts, where, skips, examples)
            start += piece.num_rows
        fmt.drop_pages(table)
    c.seconds = time.perf_counter() - started
    return c


def _count(c: BaseContamination, row: int, per_set: dict[str, tuple[int, float, str]], prompts: list[EvalPrompt],
           where: str, skips: Skips, examples: int) -> None:
    """Record one base row's hits (per set: its first hit prompt, the coverage and the row's text that hit)."""
    c.hit[row] = True
    for name, (e, share, text) in sorted(per_set.items(), key=lambda kv: kv[1][0]):
        c.by_set[name] += 1
        if len(c.examples.setdefault(name, [])) < examples:
            c.examples[name].append({"row": row, "prompt": excerpt(text), "eval": prompts[e].where,
                                     "eval_prompt": excerpt(prompts[e].text), "coverage": share})
    name, (e, share, _) = min(per_set.items(), key=lambda kv: kv[1][0])
    skips.add("contaminated base row", f"{where} row {row}", f"{name} {prompts[e].where}, {share:.0%} of its n-grams")
