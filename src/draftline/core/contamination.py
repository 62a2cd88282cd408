"""Evaluation prompts and the n-gram index that finds training texts giving one away (shared by the prompt stage,
which checks every training prompt, and merge, which checks every row a ``merge.base`` carries in).

The evaluation prompts are every user turn of every ``evaluate.sets`` conversation, every prompt of the files named
in ``decontaminate.extra``, and the held-out prompts (dev and test) the prompt stage sets aside. A text *hits* an
evaluation prompt when it holds at least ``decontaminate.threshold`` of that evaluation prompt's word n-grams, or
equals it after normalisation. Invariants:

- Normalisation is the same on both sides: NFKC, lowercase, every number as ``0`` (a changed number still matches),
  punctuation and whitespace dropped (only words count). N-grams never cross a sentence end (``.!?;``), so
  sentences in another order give the same n-gram set; a sentence shorter than n words is one n-gram of its own.
- Coverage is measured on the evaluation prompt's side only: a text that contains a benchmark question (plus
  anything else) hits; a short text that is a fragment of a long evaluation prompt does not (it gives nothing
  away, and counting it would drop every generic instruction).
- An n-gram shared by ``decontaminate.shared_by`` or more evaluation prompts is boilerplate (the instruction a set
  appends to every question) and counts for none; an evaluation prompt left without n-grams (or shorter than n
  words) is matched by its whole text alone (numbers kept: in so short a prompt they are much of the question).
- Lookups go through an inverted index (n-gram hash -> evaluation prompts): the cost grows with the checked texts'
  n-grams, never with text x evaluation pairs. Hashes are xxh3 (64-bit), the same on every machine; the outcome
  depends on the texts alone, never on the order they are checked in.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import xxhash

from draftline.core.errors import MissingInput
from draftline.core.jsonl import iter_jsonl
from draftline.core.params import Params, ParamsError
from draftline.core.records import CONVERSATIONS_FILE, read_conversations
from draftline.core.skips import Skips


@dataclass(frozen=True)
class DecontaminateParams(Params):
    """``params.yaml: decontaminate`` (the prompt stage's check; ``base``: what merge does with a base's hits)."""

    enabled: bool
    ngram: int
    threshold: float
    shared_by: int
    extra: list[str]
    base: Literal["report", "drop"]

    def validate(self, where: str) -> None:
        if not 0.0 < self.threshold <= 1.0 or self.ngram < 1 or self.shared_by < 2:
            raise ParamsError(f"params.yaml: {where}: threshold must be in (0, 1], ngram >= 1, shared_by >= 2")


# The word pattern of near dedup (dedup.py): CJK characters one by one, elsewhere runs of letters/digits; plus the
# sentence ends that cut n-grams. Everything else (punctuation, whitespace) is dropped.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_ENDS = ".!?;\u3002\uff01\uff1f"
_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[{_ENDS}]")
WORD = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_ASCII_DIGIT = re.compile(r"[0-9]")
_MIX = np.uint64(0x9E3779B97F4A7C15)
_END_HASHES = np.array(sorted(xxhash.xxh3_64_intdigest(c.encode()) for c in _ENDS), dtype=np.uint64)


def normalize(text: str) -> str:
    """NFKC, lowercase, numbers as ``0``; ASCII skips NFKC (it changes nothing there) and, without a digit, the
    number pattern (a plain scan costs half as much): the tokenizing regex is then most of the cost."""
    if not text.isascii():
        return _NUMBER.sub("0", unicodedata.normalize("NFKC", text).lower())
    return _NUMBER.sub("0", text.lower()) if _ASCII_DIGIT.search(text) else text.lower()


def exact_key(text: str) -> int:
    """The hash of a text's words (NFKC, lowercase), numbers KEPT: for a prompt too short for n-grams its numbers
    are much of its question ("Solve for y: 2y + 21 = 49" is not "3y + 18 = 54")."""
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    return xxhash.xxh3_64_intdigest(" ".join(WORD.findall(text.lower())).encode("utf-8"))


@dataclass
class Shingles:
    """N-gram hashes of a batch of texts: ``doc[k]`` is the text ``hashes[k]`` came from (repeats possible);
    ``words[i]`` text i's word count."""

    doc: np.ndarray
    hashes: np.ndarray
    words: np.ndarray


def shingle(texts: Sequence[str], n: int) -> Shingles:
    """The n-grams of every text in one numpy pass: a loop over n, not over words (~12K prompts of 120 words a
    second per core, most of it the tokenizing regex)."""
    tokens: list[str] = []
    lengths = []
    for t in texts:
        found = _TOKEN.findall(normalize(t))
        tokens += found
        lengths.append(len(found))
    # One encode for the batch (a C-level split beats encoding token by token), then one hash per token.
    h = np.fromiter(map(xxhash.xxh3_64_intdigest, "\x00".join(tokens).encode("utf-8").split(b"\x00")),
                    dtype=np.uint64, count=len(tokens)) if tokens else np.empty(0, np.uint64)
    tok_doc = np.repeat(np.arange(len(texts)), lengths)
    is_end = np.isin(h, _END_HASHES)
    # A segment (sentence) id per token: a new one after each sentence end and at each text's start.
    starts_doc = np.zeros(len(h), dtype=bool)
    starts_doc[np.cumsum([0, *lengths[:-1]])[np.asarray(lengths) > 0]] = True
    seg = np.cumsum(starts_doc | np.concatenate([[False], is_end[:-1]]))
    w, s, d = h[~is_end], seg[~is_end], tok_doc[~is_end]
    return Shingles(*_ngrams(w, s, d, n), np.bincount(d, minlength=len(texts)))


def _ngrams(w: np.ndarray, s: np.ndarray, d: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(doc, hash) of every n-word window inside one segment, and of every whole segment shorter than n."""
    if len(w) == 0:
        return np.empty(0, np.int64), np.empty(0, np.uint64)
    first = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
    seg_len = np.diff(np.concatenate([first, [len(w)]]))
    docs, out = [], []
    acc = w.copy()
    for length in range(1, n + 1):
        if length > 1:
            m = len(w) - length + 1
            if m <= 0:
                break
            with np.errstate(over="ignore"):
                acc = acc[:m] * _MIX + w[length - 1 : length - 1 + m]  # acc[i]: hash of words i .. i+length-1
        if length < n:
            at = first[seg_len == length]  # segments of exactly this length: one shingle, the whole segment
        else:
            at = np.flatnonzero(s[: len(acc)] == s[n - 1 : n - 1 + len(acc)])  # windows within one segment
        docs.append(d[at])
        out.append(acc[at])
    return np.concatenate(docs), np.concatenate(out)


@dataclass(frozen=True)
class EvalPrompt:
    """One evaluation prompt: the set it belongs to (an ``evaluate.sets`` name, ``heldout`` or an extra file),
    where it is (for the report) and its text."""

    set: str
    where: str
    text: str


@dataclass
class EvalIndex:
    """The inverted index over the evaluation prompts' n-grams (build it with :meth:`build`)."""

    prompts: list[EvalPrompt]
    ngram: int
    keys: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))  # sorted n-gram hashes
    postings: list[list[int]] = field(default_factory=list)  # keys[k] -> the prompts holding it
    sizes: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # counted n-grams per prompt
    exact: dict[int, list[int]] = field(default_factory=dict)  # exact_key -> prompts without counted n-grams
    exact_words: frozenset[int] = frozenset()  # their word counts: only a text of such a length can equal one

    @classmethod
    def build(cls, prompts: Sequence[EvalPrompt], ngram: int, shared_by: int) -> EvalIndex:
        index = cls(list(prompts), ngram)
        sh = shingle([p.text for p in index.prompts], ngram)
        pairs = np.unique(np.stack([sh.hashes, sh.doc.astype(np.uint64)]), axis=1)  # distinct (hash, prompt)
        _, df = np.unique(pairs[0], return_counts=True)
        # Boilerplate and prompts shorter than n words: matched by their whole text only (module docstring).
        short = sh.words < ngram
        counted = np.repeat(df < shared_by, df) & ~short[pairs[1].astype(np.int64)]
        pairs = pairs[:, counted]
        index.keys, starts = np.unique(pairs[0], return_index=True)
        index.postings = [list(map(int, p)) for p in np.split(pairs[1], starts[1:])] if len(pairs[0]) else []
        index.sizes = np.bincount(pairs[1].astype(np.int64), minlength=len(index.prompts))
        # A prompt with counted n-grams is found by them (a verbatim copy holds them all); the rest by their text.
        for i, p in enumerate(index.prompts):
            if sh.words[i] and not index.sizes[i]:
                index.exact.setdefault(exact_key(p.text), []).append(i)
        index.exact_words = frozenset(int(sh.words[i]) for ids in index.exact.values() for i in ids)
        return index

    def hits(self, texts: Sequence[str], threshold: float, batch: int = 2048) -> list[dict[int, float]]:
        """Per text, ``{evaluation prompt: share of its n-grams the text holds}`` for every prompt it hits
        (1.0 for an equal whole text). In batches (bounded memory); the outcome does not depend on their size."""
        out: list[dict[int, float]] = []
        for start in range(0, len(texts), batch):
            out += self._hits(texts[start : start + batch], threshold)
        return out

    def _hits(self, texts: Sequence[str], threshold: float) -> list[dict[int, float]]:
        sh = shingle(texts, self.ngram)
        out: list[dict[int, float]] = [{} for _ in texts]
        if len(self.keys):
            at = np.minimum(np.searchsorted(self.keys, sh.hashes), len(self.keys) - 1)
            found = self.keys[at] == sh.hashes
            # Only the n-grams found in the index reach Python: a clean prompt costs its numpy share alone.
            counts: dict[int, Counter[int]] = defaultdict(Counter)
            for doc, k in set(zip(sh.doc[found].tolist(), at[found].tolist())):
                counts[doc].update(self.postings[k])
            # In whole n-grams: 0.3 * 10 is 3.0000000000000004 in floats, and 3 of 10 must reach 0.3.
            need = np.ceil(threshold * self.sizes - 1e-9)
            for doc, per_prompt in counts.items():
                for e, c in per_prompt.items():
                    if c >= need[e]:
                        out[doc][e] = round(c / int(self.sizes[e]), 4)
        for doc in np.flatnonzero(np.isin(sh.words, list(self.exact_words))).tolist():
            for e in self.exact.get(exact_key(texts[doc]), ()):
                out[doc][e] = 1.0
        return out


# ------------------------------------------------------------------------------------------- the evaluation prompts

HELDOUT = "heldout"  # the set name of the prompt stage's held-out prompts (as evaluate names them)
_EXTRA_KEYS = ("prompt", "question", "text", "instruction", "content")


def set_prompts(names: Sequence[str], sets_dir: Path, skips: Skips) -> list[EvalPrompt]:
    """Every user turn of every conversation of each ``evaluate.sets`` name: each turn is a request of its own in
    evaluate (core/requests.py), so each is an evaluation prompt of its own."""
    out = []
    for name in names:
        path = Path(sets_dir) / name / CONVERSATIONS_FILE
        if not path.is_file():
            raise MissingInput(f"{path} does not exist: run its stages first (dvc repro set_conversations@{name})")
        for conv in read_conversations(path, skips):
            turns = [m["content"] for m in conv.messages if m["role"] == "user" and m["content"].strip()]
            out += [EvalPrompt(name, f"row {conv.row}" + (f" turn {k}" if len(turns) > 1 else ""), t)
                    for k, t in enumerate(turns)]
    return out


def extra_prompts(path: str, skips: Skips) -> list[EvalPrompt]:
    """A user's list of benchmark questions: ``.jsonl`` lines holding a string, ``messages`` (each user turn) or
    one of ``prompt``/``question``/``text``/``instruction``/``content``; any other file, one prompt a line. Its
    set is the file's name without its extension (a metrics key: ``contaminated.<name>``)."""
    if not Path(path).is_file():
        raise MissingInput(f"decontaminate.extra names {path}, which does not exist")
    name = Path(path).stem
    if not path.endswith(".jsonl"):
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        return [EvalPrompt(name, f"{path}:{i}", t) for i, t in enumerate(lines, 1) if t.strip()]
    out = []
    for lineno, value, error in iter_jsonl(path):
        texts = [value] if isinstance(value, str) else []
        if isinstance(value, dict):
            if isinstance(value.get("messages"), list):
                texts = [m.get("content") for m in value["messages"] if isinstance(m, dict) and m.get("role") == "user"]
            else:
                texts = [next((value[k] for k in _EXTRA_KEYS if isinstance(value.get(k), str)), None)]
        texts = [t for t in texts if isinstance(t, str) and t.strip()]
        if error or not texts:
            skips.add("unreadable evaluation prompt", f"{path}:{lineno}", error or "no prompt text in it")
        out += [EvalPrompt(name, f"{path}:{lineno}", t) for t in texts]
    return out


def best_per_set(hit: dict[int, float], prompts: Sequence[EvalPrompt]) -> dict[str, tuple[int, float]]:
    """Per evaluation set a text hits, its first hit prompt (by index) and that prompt's coverage."""
    best: dict[str, tuple[int, float]] = {}
    for e, share in sorted(hit.items()):
        best.setdefault(prompts[e].set, (e, share))
    return best


def excerpt(text: str, limit: int = 160) -> str:
    """``text`` on one line, cut to ``limit`` characters (a report's example)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
