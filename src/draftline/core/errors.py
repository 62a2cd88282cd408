"""The one kind of error a stage expects: a refusal, whose message says what to change.

A stage refuses what it cannot use (a misspelt param, an infeasible blend, a base made with another tokenizer, a
full disk, a missing input) by raising a :class:`Refusal`; the stage runner (:mod:`draftline.core.runner`) prints
that message alone and exits non-zero. Any other exception is a bug and keeps its traceback. Refusals are also
``ValueError`` (and a missing input a ``FileNotFoundError``, a full disk an ``OSError``), as they were before, so
callers that catch those still do.
"""

from __future__ import annotations


class Refusal(ValueError):
    """Input or settings the stage cannot use; the message names the cause and what to change."""


class MissingInput(Refusal, FileNotFoundError):
    """An input the stage reads is not there; the message names the stage to run first."""
