"""Writing outputs so that nothing half-written is ever taken for finished.

Invariants: an output exists under its final name only once it is complete (:func:`atomic_path`); a write that
fails leaves the previous version in place and no temporary behind; a full disk raises :class:`DiskFullError`
naming what was being written and where, never a bare ``OSError`` from deep inside pyarrow or torch.
"""

from __future__ import annotations

import csv
import errno
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from draftline.core.errors import Refusal
from draftline.core.jsonl import dumps


class DiskFullError(OSError, Refusal):
    """No space (or quota) left while writing an output: says what and where, and that nothing half-written stays.

    ``target`` is the output's final name; ``file`` the file inside it being written, when it is a folder."""

    def __init__(self, target: str | os.PathLike, what: str | None = None, file: str | None = None):
        self.target, self.what, self.file = Path(target), what, file
        folder = next((p for p in self.target.parents if p.exists()), Path("/"))
        detail = (f"{what} ({target})" if what else str(target)) + (f", at {file}" if file else "")
        super().__init__(
            errno.ENOSPC,
            f"no space left while writing {detail} ({shutil.disk_usage(folder).free / 2**20:.1f} MiB free there): "
            "free space or move it to a larger disk, then rerun; nothing half-written was kept",
        )


def _is_disk_full(e: BaseException | None) -> bool:
    """ENOSPC/EDQUOT anywhere in the chain. Libraries wrap it: pyarrow in an OSError without errno, safetensors in
    its own error, both carrying the system's message; torch in a RuntimeError raised while handling the OSError
    of a Python file's write."""
    while e is not None:
        if (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or "No space left" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


@contextmanager
def writing(path: str | os.PathLike, what: str | None = None) -> Iterator[None]:
    """Turn a full disk while writing ``path`` (``what``: what it holds) into a :class:`DiskFullError` naming it;
    the outermost output wins, keeping the name of the file inside it that was being written."""
    try:
        yield
    except DiskFullError as e:
        raise DiskFullError(path, what or e.what, e.file or e.target.name) from e.__cause__
    except Exception as e:
        if not _is_disk_full(e):
            raise
        raise DiskFullError(path, what) from e


@contextmanager
def atomic_path(path: str | os.PathLike, what: str | None = None) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write (a file or a folder); rename it into place on success.

    On any exception the temporary is removed and ``path`` keeps whatever it held before; a full disk is reported
    as :class:`DiskFullError` naming ``path`` (and ``what``, when given).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        with writing(path, what):
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


def write_csv(path: str | os.PathLike, rows: list[dict[str, Any]], columns: list[str] | None = None) -> None:
    """Plot data for ``dvc plots``."""
    columns = columns or (list(rows[0]) if rows else [])
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
