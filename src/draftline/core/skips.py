"""Counting rows that are skipped, with their reason, instead of stopping or silently dropping them."""

from __future__ import annotations

import logging
from collections import Counter


class SkipError(ValueError):
    """Raised in strict mode: the first bad row stops the stage, naming where it is and why."""


class Skips:
    """Skip accounting for one stage: ``skips.add(reason, where, detail)`` counts and logs a bad row.

    Logs the first ``log_first`` examples of each reason (enough to find the rows by hand without
    flooding the log); ``strict=True`` raises :class:`SkipError` instead.
    """

    def __init__(self, logger: logging.Logger, strict: bool = False, log_first: int = 5):
        self.counts: Counter[str] = Counter()
        self.logger = logger
        self.strict = strict
        self.log_first = log_first

    def add(self, reason: str, where: str, detail: str = "") -> None:
        msg = f"skip {where}: {reason}" + (f" ({detail})" if detail else "")
        if self.strict:
            raise SkipError(msg + "; set strict: false to count and skip such rows instead")
        self.counts[reason] += 1
        if self.counts[reason] <= self.log_first:
            self.logger.warning(msg)
        elif self.counts[reason] == self.log_first + 1:
            self.logger.warning("more rows skipped for %r; see the metrics for the count", reason)

    def as_dict(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class RowError(ValueError):
    """A row that cannot be used; ``reason`` is the skip reason it is counted under (``Skips.add``)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
