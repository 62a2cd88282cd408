"""The generation journal: every finished result, appended and fsynced, so that a run can resume to the row.

DVC deletes a stage's outputs before it runs, so the journal lives outside them, in the stage's scratch folder
(:mod:`draftline.core.scratch`), keyed by a hash of everything that decides a result. A rerun after kill -9 reads the journal, sends only the
prompts without a result, and writes the shards from it. The last line may be torn by a kill mid-write: it is
dropped (that result was never acknowledged as saved) and cut off before the next append.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from draftline.core.records import dumps

JOURNAL_FILE = "journal.jsonl"
OK, PARTIAL, FAILED = "ok", "partial", "failed"


class Journal:
    """An append-only JSON-lines file of results, one entry per line: ``{"id", "status", ...}``.

    The latest entry for an id wins, so a failure followed by a success on a later run reads as a success.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / JOURNAL_FILE
        self.torn = 0
        self._file = None

    def load(self) -> dict[str, dict[str, Any]]:
        """Read every complete entry; a torn or corrupt line is counted in ``self.torn`` and ignored."""
        entries: dict[str, dict[str, Any]] = {}
        if not self.path.exists():
            return entries
        with open(self.path, "rb") as f:
            for raw in f:
                if not raw.endswith(b"\n"):
                    self.torn += 1  # killed mid-write: never acknowledged, so never counted as done
                    break
                try:
                    entry = json.loads(raw)
                    entries[entry["id"]] = entry
                except (ValueError, KeyError, TypeError):
                    self.torn += 1
        return entries

    def _open(self):
        if self._file is None:
            if self.path.exists():
                with open(self.path, "rb+") as f:
                    data = f.read()
                    end = data.rfind(b"\n") + 1
                    if end != len(data):
                        f.truncate(end)  # drop a torn tail so the next entry starts on its own line
            self._file = open(self.path, "ab")
        return self._file

    def append_many(self, entries: Iterable[dict[str, Any]]) -> None:
        """Append entries and make them durable (write, flush, fsync) before returning: group commit."""
        data = b"".join(dumps(e).encode("utf-8") + b"\n" for e in entries)
        if not data:
            return
        f = self._open()
        f.write(data)
        f.flush()
        os.fsync(f.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
