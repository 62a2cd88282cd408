"""Counting rows that are skipped, with their reason, instead of stopping or silently dropping them.

A count is not enough when a reason takes a large share of the rows: that is a setting at odds with the data
(36% of the rows over a length cap), not a few bad rows, and a run that "succeeds" has silently lost them.
:meth:`Skips.check_share` turns that into an error naming the reason, the count and the param to change.
"""

from __future__ import annotations

import logging
from collections import Counter

from draftline.core.errors import Refusal


class SkipError(Refusal, ValueError):
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

    def check_share(self, rows_in: int, max_share: float, param: str, hints: dict[str, str] | None = None) -> None:
        """Raise :class:`SkipError` when one reason skipped more than ``max_share`` of ``rows_in`` rows. ``param``
        names the share's setting; ``hints`` the setting to change for a reason (e.g. a length cap)."""
        for reason, n in sorted(self.counts.items()):
            if rows_in and n > max_share * rows_in:
                fix = (hints or {}).get(reason) or "fix the rows' cause (the log names the first ones)"
                raise SkipError(
                    f"{n} of {rows_in} rows ({100 * n / rows_in:.1f}%) were skipped for {reason!r}, more than "
                    f"{param} ({max_share:g}) allows: {fix}, or raise {param} to accept the loss"
                )

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
