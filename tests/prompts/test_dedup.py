"""Dedup: whole-prompt exact ids, user-text MinHash LSH, and which copy survives."""

from __future__ import annotations

import random

import numpy as np
import xxhash
from conftest import default_params

from draftline.core.records import Conversation
from draftline.prompts.canonical import cut_prompt, prompt_id
from draftline.prompts.dedup import MinHasher, lsh_params
from draftline.prompts.params import DedupParams, NearParams
from draftline.prompts.report import SourceReport
from draftline.prompts.stage import deduplicate

WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "ne", "pu", "ru", "so", "ta", "vi", "zo") for b in ("b", "d", "g", "k", "m", "n", "p", "r", "s", "t", "v", "x")]
NEAR = {"near": {"threshold": 0.8, "num_perm": 128, "ngram": 5}}


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _record(source: str, row: int, user: str, system: str | None = None, tools=None):
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return cut_prompt(Conversation(source=source, row=row, messages=msgs, tools=tools), "first")


# params.yaml's dedup.near, with no source keeping its numbers unless a test says so.
BASE_NEAR = {**default_params("dedup")["near"], "exact_numbers": []}


def _dedup(records, cfg=NEAR, order=None):
    order = order or sorted({r.source for r in records})
    reports = {s: SourceReport() for s in order}
    params = DedupParams.parse({"priority": cfg.get("priority", []), "near": {**BASE_NEAR, **cfg["near"]}}, "dedup")
    kept = deduplicate(records, reports, params, order)
    return kept, reports


def test_500_requests_behind_one_shared_3kb_system_prompt_all_survive() -> None:
    rng = random.Random(0)
    system = _text(rng, 800)
    assert len(system) >= 3000
    records = [_record("agent", i, f"Please help me with this: {_text(rng, 30)}", system) for i in range(500)]
    kept, reports = _dedup(records)
    assert len(kept) == 500
    assert reports["agent"].exact_duplicates == reports["agent"].near_duplicates == 0
    # ...while a real near-copy of one of them is caught, so the detector is on.
    edited = records[7].messages[-1]["content"].replace("Please", "Kindly")
    kept, reports = _dedup(records + [_record("agent", 500, edited, system)])
    assert len(kept) == 500 and reports["agent"].near_duplicates == 1


def test_math_variants_that_differ_only_in_numbers_survive() -> None:
    rng = random.Random(1)
    story = _text(rng, 120)
    a = f"{story} Janet has 16 ducks and sells each egg for $2. How much does she make?"
    b = f"{story} Janet has 17 ducks and sells each egg for $2. How much does she make?"
    records = [_record("metamathqa", 0, a), _record("metamathqa", 1, b)]
    keep_numbers = {"near": {**NEAR["near"], "exact_numbers": ["metamathqa"]}}
    kept, _ = _dedup(records, keep_numbers)
    assert len(kept) == 2
    # With numbers normalised (the default for other sources) the same pair is one prompt: the setting matters.
    kept, reports = _dedup(records, NEAR)
    assert len(kept) == 1 and reports["metamathqa"].near_duplicates == 1


def test_exact_duplicates_collapse_under_whitespace_and_unicode_changes() -> None:
    system = "You are   helpful."
    a = _record("s", 0, "Write a haiku about  autumn.\n", system)
    b = _record("s", 1, "  Write a haiku\tabout autumn.", "You are helpful.\n")
    c = _record("s", 2, "Ｗｒｉｔｅ a haiku about autumn.", system)  # full-width letters, NFKC-equal
    d = _record("s", 3, "Write a haiku about winter.", system)
    assert a.id == b.id == c.id != d.id
    # The whole prompt counts, not a prefix: a different system prompt or tool list is a different prompt.
    assert _record("s", 4, "Write a haiku about autumn.", "You are terse.").id != a.id
    tool = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    assert _record("s", 5, "Write a haiku about autumn.", system, tool).id != a.id
    kept, reports = _dedup([d, c, b, a], {"near": {"enabled": False}})
    assert [r.row for r in kept] == [3, 0]  # the lowest row of equal prompts stays, whatever the input order
    assert reports["s"].exact_duplicates == 2
    # Ids are a pure function of the canonical prompt: stable across runs and machines.
    # The documented canonical form: xxh3-128(xxh3-128(system JSON + tools JSON) + turns JSON, keys sorted).
    head = xxhash.xxh3_128_digest(b'["You are helpful."]null')
    expected = xxhash.xxh3_128_hexdigest(head + b'[{"content":"hi","role":"user"}]')
    assert prompt_id([{"role": "system", "content": " You are\u00a0helpful. "}, {"role": "user", "content": "hi"}], None) == expected


def test_priority_decides_which_copy_survives() -> None:
    rng = random.Random(2)
    base = _text(rng, 80)
    low = _record("web", 0, base)
    high = _record("code", 9, base + " thanks")
    cfg = {"priority": ["code"], **NEAR}
    kept, reports = _dedup([low, high], cfg, order=["web", "code"])
    assert [r.source for r in kept] == ["code"] and reports["web"].near_duplicates == 1
    kept, reports = _dedup([low, high], {"priority": ["web"], **NEAR}, order=["web", "code"])
    assert [r.source for r in kept] == ["web"] and reports["code"].near_duplicates == 1


def test_minhash_estimates_jaccard_and_lsh_bands_fit() -> None:
    hasher = MinHasher(NearParams.parse({**BASE_NEAR, "num_perm": 256, "ngram": 1}, "dedup.near"))
    a = hasher.shingles(" ".join(f"w{i}x" for i in range(100)), False)
    b = hasher.shingles(" ".join(f"w{i}x" for i in range(50, 150)), False)  # Jaccard 50/150
    sigs = hasher.signatures([a, b, np.empty(0, dtype=np.uint64)])
    assert abs(np.mean(sigs[0] == sigs[1]) - 1 / 3) < 0.08
    assert (sigs[2] == np.iinfo(np.uint32).max).all()
    # Batching must not change a signature.
    assert (hasher.signatures([a, b], batch_shingles=7) == sigs[:2]).all()
    bands, rows = lsh_params(0.8, 128)
    assert bands * rows <= 128 and 0.7 < (1 / bands) ** (1 / rows) < 0.85
