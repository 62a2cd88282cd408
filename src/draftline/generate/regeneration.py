"""Regenerating one prompt turn by turn on the target's own replies (:mod:`draftline.generate.turns`).

Invariants: a conversation ends at its first truncated turn (``finish_reason: length``), at a failure, or after a
reply to every user turn, and only then yields its journal entry (status ``ok`` or ``failed``); before that,
:meth:`Regeneration.partial` is what may be journaled. A conversation resumed from a ``partial`` or ``failed`` entry
starts after its last finished turn, so no finished request is sent again, and its usage keeps counting from there.
With thinking on, a reply whose answer or reasoning is empty fails as ``empty`` (a server without the reasoning
parser leaves the reasoning in the content). Every entry names the engine that answered its latest turn
(``engine``), which the completion records.
"""

from __future__ import annotations

from typing import Any

from draftline.core.records import PromptRecord
from draftline.generate.journal import FAILED, OK, PARTIAL
from draftline.generate.openai_client import ChatResult
from draftline.generate.turns import request_messages, split_turns


class Regeneration:
    """One prompt being regenerated turn by turn; ``take`` returns the journal entry once it has ended."""

    def __init__(self, prompt: PromptRecord, thinking: bool, prior: dict[str, Any] | None = None):
        self.prompt = prompt
        self.thinking = thinking
        self.head, self.turns = split_turns(prompt.messages)
        # A failed or half-done conversation resumes after its last finished turn: no finished request is resent.
        self.replies: list[dict[str, Any]] = list(prior["replies"]) if prior else []
        self.usage = dict(prior["usage"]) if prior else {"prompt_tokens": 0, "completion_tokens": 0}
        # Speed, not result: kept in the journal entry beside the record, never in the completions.
        self.speculative: dict[str, int] | None = dict(prior["speculative"]) if prior and prior.get("speculative") else None
        # The engine (and its version) that answered the latest turn; a journal written before engines were
        # recorded has none.
        self.engine: dict[str, Any] | None = prior.get("engine") if prior else None

    def next_request(self) -> list[dict[str, Any]]:
        return request_messages(self.head, self.turns, self.replies, len(self.replies))

    def _entry(self, status: str, finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
        if self.speculative is not None:
            extra["speculative"] = dict(self.speculative)
        if self.engine is not None:
            extra["engine"] = self.engine
        return {"id": self.prompt.id, "status": status, "replies": self.replies, "finish_reason": finish_reason,
                "usage": dict(self.usage), **extra}

    def take(self, r: ChatResult) -> dict[str, Any] | None:
        for k in self.usage:
            self.usage[k] += r.usage.get(k, 0)
        self.engine = r.engine or self.engine
        if r.speculative is not None:
            spec = self.speculative or {"turns": 0, "steps": 0, "tokens": 0}
            self.speculative = {"turns": spec["turns"] + 1, "steps": spec["steps"] + r.speculative["steps"],
                                "tokens": spec["tokens"] + r.speculative["tokens"]}
        truncated = r.finish_reason == "length"
        if self.thinking and not truncated:
            m = r.message
            if not (m.get("content", "").strip() or m.get("tool_calls")) or not m.get("reasoning_content", "").strip():
                return self.fail("empty", "thinking is on but the answer or the reasoning is empty")
        self.replies.append(r.message)
        if truncated or len(self.replies) == len(self.turns):
            return self._entry(OK, r.finish_reason)
        return None

    def partial(self) -> dict[str, Any]:
        return self._entry(PARTIAL)

    def fail(self, reason: str, detail: str) -> dict[str, Any]:
        return self._entry(FAILED, reason=reason, detail=detail)
