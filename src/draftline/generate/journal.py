"""The generation journal: every finished result, appended and fsynced, so that a run can resume to the row.

DVC deletes a stage's outputs before it runs, so the journal lives outside them, in the stage's scratch folder
(:mod:`draftline.core.scratch`), keyed by a hash of everything that decides a result. A rerun after kill -9 reads
the journal, sends only the prompts without a result, and writes the shards from it.

Invariants:

- **Nothing damaged is consumed.** Each line carries the xxh3-64 of its own entry (``"xxh3"``). A line that does not
  parse, or whose checksum does not match (a bit flipped by bad storage), is counted in ``torn`` and ignored, so its
  prompt is sent again. The last line may be torn by a kill mid-write: it was never acknowledged as saved.
- **Writers never interleave.** Two processes may share one journal (two nodes on shared storage, the same
  ``$DRAFTLINE_CACHE``). Every append holds an exclusive POSIX record lock (``lockf``: honoured over NFS, unlike
  ``flock`` on some clients). Under the lock the writer cuts off a torn tail that a killed writer left, and only
  then writes its own lines whole.
- **No id is recorded ok twice.** Under the same lock a writer reads what others appended since it last looked and
  drops its own entries for ids that are already ok; :meth:`Journal.done` lets the stage skip such prompts before
  sending them. An ok entry is final: a later entry for that id never replaces it.
- **Writers share the work.** Each live writer holds a numbered slot (``writer-<n>.lock``, locked for its lifetime;
  the lock of a killed process is released by the system), and writer ``n`` starts its walk through the pending
  prompts at :func:`start_at`, away from the others, so two nodes repeat only the requests in flight where their
  walks meet.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import xxhash

from draftline.core.files import writing
from draftline.core.jsonl import dumps

JOURNAL_FILE = "journal.jsonl"
OK, PARTIAL, FAILED = "ok", "partial", "failed"
CHECKSUM = "xxh3"
# Spreads the writers' starting points over the prompts for any number of writers (the golden ratio's fraction).
_SPREAD = 0.6180339887498949


def start_at(n: int, slot: int) -> int:
    """Where writer ``slot`` starts among ``n`` pending items: 0 for the first (a lone run keeps its order)."""
    return int(n * ((slot * _SPREAD) % 1.0))


def encode(entry: dict[str, Any]) -> bytes:
    """One journal line: the entry with the checksum of its own encoding appended."""
    body = dumps(entry)
    return (body[:-1] + f',"{CHECKSUM}":"{xxhash.xxh3_64_hexdigest(body.encode("utf-8"))}"}}\n').encode("utf-8")


def decode(raw: bytes) -> dict[str, Any] | None:
    """The entry of a complete line, or None when the line is damaged (bad JSON, no id, a checksum mismatch).

    Lines without a checksum were written by draftline before checksums existed and are taken as they are."""
    try:
        entry = json.loads(raw)
        digest = entry.pop(CHECKSUM, None)
        if not isinstance(entry["id"], str) or not isinstance(entry["status"], str):
            return None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if digest is not None and digest != xxhash.xxh3_64_hexdigest(dumps(entry).encode("utf-8")):
        return None
    return entry


class Journal:
    """An append-only JSON-lines file of results, one entry per line: ``{"id", "status", ..., "xxh3"}``.

    The latest entry for an id wins until it is ok, so a failure followed by a success on a later run reads as a
    success, and a success is never undone.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / JOURNAL_FILE
        self.torn = 0
        self.entries: dict[str, dict[str, Any]] = {}
        self._fd: int | None = None
        self._pos = 0  # bytes of the file already read into ``entries``
        self._slot: int | None = None
        self._slot_fd: int | None = None

    def load(self) -> dict[str, dict[str, Any]]:
        """Read every intact entry (a copy of the journal's view); damaged lines are counted in ``torn``."""
        self.entries, self._pos, self.torn = {}, 0, 0
        if self.path.exists():
            with open(self.path, "rb") as f:
                self._absorb(f.read())
        return dict(self.entries)

    def join(self) -> int:
        """Take the lowest free writer slot and hold it until :meth:`close`; returns its number."""
        n = 0
        while self._slot is None:
            fd = os.open(self.folder / f"writer-{n}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._slot, self._slot_fd = n, fd
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
                n += 1
        return self._slot

    def done(self, pid: str) -> bool:
        return self.entries.get(pid, {}).get("status") == OK

    def _absorb(self, data: bytes) -> list[dict[str, Any]]:
        """Take the complete lines of ``data`` (the file from ``_pos`` on) into ``entries``; returns them."""
        end = data.rfind(b"\n") + 1
        taken = []
        for raw in data[:end].splitlines():
            entry = decode(raw)
            if entry is None:
                self.torn += 1
            elif not self.done(entry["id"]):
                self.entries[entry["id"]] = entry
                taken.append(entry)
        self._pos += end
        if end != len(data):
            self.torn += 1  # a torn tail: never acknowledged, so never counted as done
        return taken

    def _catch_up(self, fd: int) -> None:
        """Under the lock: read what other writers appended, and cut off a tail torn by a killed one."""
        size = os.fstat(fd).st_size
        if size < self._pos:  # replaced or cut behind our back (a user's cleanup): start over
            self._pos = 0
            self.entries = {}
        self._absorb(os.pread(fd, size - self._pos, self._pos))
        if self._pos != size:
            os.ftruncate(fd, self._pos)

    @contextmanager
    def _locked(self) -> Iterator[int]:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        try:
            self._catch_up(self._fd)
            yield self._fd
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def refresh(self) -> dict[str, dict[str, Any]]:
        """Take in what other writers have appended since this one last looked; returns the whole view."""
        with self._locked():
            return dict(self.entries)

    def append_many(self, entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Append entries and make them durable (write, fsync) before returning: group commit. Entries for ids that
        another writer has meanwhile recorded ok are dropped; returns the entries actually written."""
        entries = list(entries)
        if not entries:
            return []
        with writing(self.path, "the generation journal"), self._locked() as fd:
            fresh = [e for e in entries if not self.done(e["id"])]
            data = b"".join(encode(e) for e in fresh)
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
            self._absorb(data)
            return fresh

    def close(self) -> None:
        for name in ("_fd", "_slot_fd"):
            if getattr(self, name) is not None:
                os.close(getattr(self, name))
                setattr(self, name, None)
        self._slot = None
