"""JSON lines: the one encoding of every line draftline writes, and the one tolerant reader.

Invariants: :func:`dumps` is compact, UTF-8 and keeps key order as built, so the same record is the same bytes on
every run and machine; :func:`iter_jsonl` never stops at a bad line, it yields the line's number (from 1, as an
editor shows it) with the error, and the caller counts it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any


def dumps(obj: Any) -> str:
    """The one JSON encoding used for every line draftline writes: compact, UTF-8, key order as built."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any, str | None]]:
    """Yield ``(line_number, value, error)`` for each non-blank line; ``value`` is None when ``error`` is set."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line), None
            except json.JSONDecodeError as e:
                yield lineno, None, f"invalid JSON ({e.msg}, column {e.colno})"
