"""Exact and near-duplicate removal, deterministic in which copy survives.

Exact: equal ids (the id hashes the whole normalised prompt, system and tools included).
Near: MinHash LSH over word n-grams of the USER text only, so that prompts sharing a long system prompt
are compared by what they ask. Signatures are computed in numpy batches (multiply-shift hashing of 32-bit
shingle hashes): the same estimator as datasketch's, about 3x faster per core (see bench/prompts.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import xxhash

from draftline.prompts.params import NearParams

# CJK has no spaces: each character is a word; elsewhere runs of letters/digits are.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_WORD = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_SHINGLE_MIX = np.uint64(0x9E3779B97F4A7C15)


def survivor_order(sources: Sequence[str], ids: Sequence[str], rows: Sequence[int], priority: Sequence[str]) -> list[int]:
    """Indices in the order in which copies claim survival: ``dedup.priority`` of the source, lowest id, lowest row."""
    rank = {name: i for i, name in enumerate(priority)}
    return sorted(range(len(ids)), key=lambda i: (rank.get(sources[i], len(rank)), ids[i], rows[i]))


def exact_duplicates(sources: Sequence[str], ids: Sequence[str], rows: Sequence[int], priority: Sequence[str]) -> list[int]:
    """Indices of records whose id an earlier-claiming record already has (the first in priority order stays)."""
    seen: set[str] = set()
    dropped = []
    for i in survivor_order(sources, ids, rows, priority):
        if ids[i] in seen:
            dropped.append(i)
        else:
            seen.add(ids[i])
    return sorted(dropped)


def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """Bands and rows (b * r <= num_perm) that minimise false positives + false negatives around ``threshold``."""
    s = np.linspace(0.0, 1.0, 501)
    best, best_err = (1, num_perm), float("inf")
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            p = 1.0 - (1.0 - s**r) ** b
            err = np.trapezoid(np.where(s < threshold, p, 1.0 - p), s)
            if err < best_err:
                best, best_err = (b, r), err
    return best


class MinHasher:
    """MinHash signatures of word n-grams, many documents per numpy call."""

    def __init__(self, params: NearParams):
        self.params = params
        rng = np.random.default_rng(params.seed)
        # Multiply-shift: h(x) = (a*x + b) mod 2^64 >> 32, a odd; universal over 32-bit keys.
        self.a = (rng.integers(0, 2**63, params.num_perm, dtype=np.uint64) << np.uint64(1)) | np.uint64(1)
        self.b = rng.integers(0, 2**63, params.num_perm, dtype=np.uint64)

    def shingles(self, text: str, normalize_numbers: bool) -> np.ndarray:
        """32-bit hashes of the word n-grams (lowercased; numbers as ``0`` when normalised); short texts: one shingle."""
        text = text.lower()
        if normalize_numbers:
            text = _NUMBER.sub("0", text)
        words = _WORD.findall(text)
        if not words:
            return np.empty(0, dtype=np.uint64)
        # One encode for the whole text: a C-level split beats encoding word by word.
        encoded = "\x00".join(words).encode("utf-8").split(b"\x00")
        h = np.fromiter(map(xxhash.xxh3_64_intdigest, encoded), dtype=np.uint64, count=len(words))
        n = min(self.params.ngram, len(h))
        m = len(h) - n + 1
        acc = h[:m].copy()
        with np.errstate(over="ignore"):
            for k in range(1, n):
                acc = acc * _SHINGLE_MIX + h[k : k + m]
        return np.unique(acc >> np.uint64(32))

    def signatures(self, shingle_sets: Sequence[np.ndarray], batch_shingles: int = 1 << 15) -> np.ndarray:
        """(len(shingle_sets), num_perm) uint32 minima; an empty set gets all-max (never a candidate)."""
        out = np.full((len(shingle_sets), self.params.num_perm), np.iinfo(np.uint32).max, dtype=np.uint32)
        a, b = self.a[:, None], self.b[:, None]
        start = 0
        while start < len(shingle_sets):
            end, size = start, 0
            while end < len(shingle_sets) and (size == 0 or size + len(shingle_sets[end]) <= batch_shingles):
                size += len(shingle_sets[end])
                end += 1
            docs = [i for i in range(start, end) if len(shingle_sets[i])]
            if docs:
                flat = np.concatenate([shingle_sets[i] for i in docs])
                offsets = np.cumsum([0] + [len(shingle_sets[i]) for i in docs[:-1]])
                with np.errstate(over="ignore"):
                    hv = (a * flat[None, :] + b) >> np.uint64(32)
                out[docs] = np.minimum.reduceat(hv, offsets, axis=1).T.astype(np.uint32)
            start = end
        return out


def near_duplicates(
    signatures: np.ndarray,
    has_text: Sequence[bool],
    number_keys: Sequence[bytes],
    order: Sequence[int],
    threshold: float,
) -> dict[int, int]:
    """``{dropped index: the kept index it duplicates}``, visiting records in ``order`` (earlier ones stay).

    Two records are candidates when one LSH band matches and their ``number_keys`` are equal (for sources
    whose numbers matter, the key holds the numbers, so problems that differ only there never meet); a
    candidate is a duplicate when the estimated Jaccard similarity reaches ``threshold``.
    """
    bands, rows = lsh_params(threshold, signatures.shape[1])
    width = rows * signatures.dtype.itemsize
    tables: list[dict[bytes, list[int]]] = [{} for _ in range(bands)]
    dup_of: dict[int, int] = {}
    for i in order:
        if not has_text[i]:
            continue
        raw = signatures[i].tobytes()
        keys = [number_keys[i] + raw[k * width : (k + 1) * width] for k in range(bands)]
        candidates = sorted({j for t, key in zip(tables, keys) for j in t.get(key, ())})
        match = next((j for j in candidates if np.mean(signatures[i] == signatures[j]) >= threshold), None)
        if match is not None:
            dup_of[i] = match
            continue
        for t, key in zip(tables, keys):
            t.setdefault(key, []).append(i)
    return dup_of


def number_key(text: str) -> bytes:
    """The numbers of a text, hashed: part of every LSH key for sources whose numbers are not normalised."""
    return xxhash.xxh3_64_digest("\x00".join(_NUMBER.findall(text)).encode("utf-8"))
