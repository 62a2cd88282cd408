"""The merge tests keep what they cache (per-row mix labels of unrecorded shards, core/mix.py) in their own folder."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    before = os.environ.get("DRAFTLINE_CACHE")
    os.environ["DRAFTLINE_CACHE"] = str(tmp_path_factory.mktemp("draftline-cache"))
    yield
    if before is None:
        os.environ.pop("DRAFTLINE_CACHE", None)
    else:
        os.environ["DRAFTLINE_CACHE"] = before
