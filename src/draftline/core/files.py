"""Writing outputs so that nothing half-written is ever taken for finished, and reading JSON lines tolerantly."""

from __future__ import annotations

import csv
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from draftline.core.records import dumps


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write (a file or a folder); rename it into place on success.

    On any exception the temporary is removed and ``path`` keeps whatever it held before.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        if path.is_dir() and tmp.is_dir():
            # os.replace cannot put a folder over a non-empty one: move the old one aside first.
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            _remove(old)
        else:
            if path.is_dir():
                _remove(path)
            os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Pretty JSON for metrics and metadata (``dvc metrics show`` reads it); keys sorted for stable diffs."""
    write_text(path, json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True, allow_nan=False) + "\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[Any]) -> int:
    """Write one JSON value per line, atomically. Rows may be dicts or objects with ``to_json()``."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(row.to_json() if hasattr(row, "to_json") else dumps(row))
            f.write("\n")
            n += 1
    return n


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any, str | None]]:
    """Yield ``(line_number, value, error)`` for each non-blank line; ``value`` is None when ``error`` is set.

    Line numbers start at 1, as an editor shows them, so a reported bad line can be found by hand.
    """
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line), None
            except json.JSONDecodeError as e:
                yield lineno, None, f"invalid JSON ({e.msg}, column {e.colno})"


def write_csv(path: str | os.PathLike, rows: list[dict[str, Any]], columns: list[str] | None = None) -> None:
    """Plot data for ``dvc plots``."""
    columns = columns or (list(rows[0]) if rows else [])
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
