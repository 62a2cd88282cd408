"""Every generate test gets its own scratch folder: journals never leak from one test to the next."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTLINE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"
