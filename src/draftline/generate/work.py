"""What one run has to do and where its results go, handed whole to a backend's driver.

Invariants:

- :class:`Plan` is fixed before the first request: ``ordered`` is EVERY prompt in dispatch order
  (:mod:`draftline.generate.order`), ``pending`` those of them without an ok result in the journal when the run
  began, in the same order. It is plain data, so a spawned worker process receives it whole.
- :class:`Work` adds this process's journal, its view of the entries and its progress bar. A result counts as done
  once it is in the journal (:mod:`draftline.generate.journal`); ``entries`` and the bar follow the journal, never
  lead it, and the outputs are written from the journal alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from draftline.core.records import PromptRecord
from draftline.generate.journal import Journal
from draftline.generate.progress import Progress


@dataclass
class Plan:
    """The prompts of a run in dispatch order, and those of them still to generate."""

    ordered: list[PromptRecord]
    pending: list[PromptRecord]
    pending_ids: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.pending_ids = frozenset(p.id for p in self.pending)


@dataclass
class Work:
    """A plan with this process's journal, its entries (id -> journal entry) and its progress (none in a worker)."""

    plan: Plan
    journal: Journal
    entries: dict[str, dict[str, Any]]
    progress: Progress | None

    def record(self, entry: dict[str, Any]) -> None:
        """Count a result the journal holds: into ``entries`` and the progress bar."""
        self.entries[entry["id"]] = entry
        if self.progress is not None:
            self.progress.done(entry)
