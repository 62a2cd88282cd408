"""Shared test fixtures. Nothing here reaches a hub: tests use files they make, the embedded target or ../shared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` beside the checkout; tests that need it skip cleanly where it is absent."""
    if not (SHARED / "fixtures").is_dir():
        pytest.skip("../shared/fixtures is not present beside this checkout")
    return SHARED


@pytest.fixture(scope="session")
def datasets_dir(shared_dir: Path) -> Path:
    return shared_dir / "fixtures" / "datasets"


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir(shared_dir: Path) -> Path:
    """The real Qwen3 tokenizer and hybrid-thinking chat template."""
    return shared_dir / "fixtures" / "qwen3-tokenizer"


@pytest.fixture(scope="session")
def qwen3_alt_tokenizer_dir(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Build a tokenizer folder for one of the alt/ templates: ``qwen3_alt_tokenizer_dir("qwen3_coder")``."""
    base = shared_dir / "fixtures" / "qwen3-tokenizer"

    def make(name: str) -> Path:
        d = tmp_path_factory.mktemp(name)
        for f in ("vocab.json", "merges.txt"):
            os.symlink(base / f, d / f)
        (d / "tokenizer_config.json").write_bytes((base / "alt" / f"{name}.tokenizer_config.json").read_bytes())
        return d

    return make
