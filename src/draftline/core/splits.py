"""The two evaluation splits: ``dev``, which any decision may read (``blend.steer``, the benches that pick a default),
and ``test``, which is reported and never read by a decision.

Invariant: a prompt's split is a function of its id alone (a hash), so it never changes when a source grows, the
blend changes, another round runs or another stage asks: the prompt stage fills each source's dev and test quotas
from the prompts of that split, and evaluate labels every request (held-out prompts and benchmark sets alike) by
the same function. About a third of all ids hash to ``dev`` (the default quotas are 24 dev and 48 test per source).
"""

from __future__ import annotations

import xxhash

DEV, TEST = "dev", "test"
SPLITS = (DEV, TEST)
# The share of ids that hash to dev. Fixed, not a param: changing it would move prompts between the splits, and a
# decision made on the old dev would then have read part of the new test.
DEV_SHARE = 1 / 3


def split_of(prompt_id: str) -> str:
    """``dev`` or ``test``, from a hash of the id only (independent of ``blend.seed``'s rank hash)."""
    u = xxhash.xxh3_64_intdigest(f"draftline-split:{prompt_id}".encode()) / 2**64
    return DEV if u < DEV_SHARE else TEST
