"""What evaluate decodes: requests of one or more user turns, from the held-out prompts and the benchmark sets.

A request is decoded turn by turn, as z-lab's ``dflash benchmark`` does for mt-bench: each next user turn is
appended after the target's own reply to the previous one, so a multi-turn set measures the drafter on the
conversation the target actually has. Every turn is one request in z-lab's figure.

Held-out prompts (the prompts stage's ``eval.jsonl``) are single-turn requests, rendered exactly as generation
sent them; a set's conversations keep their system messages and user turns, and drop the dataset's answers
(the target writes its own).

Every request carries its split (``dev`` or ``test``), a function of its id alone (core/splits.py): the prompt
stage filled each source's quotas with the same function, and a set's rows are split by it too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from draftline.core.records import Conversation, Message, PromptRecord, Tool
from draftline.core.skips import Skips
from draftline.core.splits import split_of
from draftline.evaluate.params import HELDOUT


@dataclass(frozen=True)
class Request:
    set: str  # "heldout" or a name under evaluate.sets
    source: str  # the training source (heldout) or the set's name
    id: str
    prefix: list[Message]  # messages before the first decoded user turn (a system prompt, earlier exchanges)
    turns: list[Message]  # the user turns, decoded one after another
    tools: list[Tool] | None = None

    @property
    def split(self) -> str:
        return split_of(self.id)


def heldout_requests(records: Iterable[PromptRecord], max_per_source: int | None) -> list[Request]:
    """The held-out prompts in file order (the prompt stage's), the first ``max_per_source`` of each source and
    split (None: all)."""
    taken: dict[tuple[str, str], int] = defaultdict(int)
    requests = []
    for rec in records:
        req = Request(HELDOUT, rec.source, rec.id, rec.messages[:-1], rec.messages[-1:], rec.tools)
        if max_per_source is None or taken[rec.source, req.split] < max_per_source:
            taken[rec.source, req.split] += 1
            requests.append(req)
    return requests


def set_requests(name: str, conversations: Iterable[Conversation], skips: Skips) -> list[Request]:
    """A benchmark set's conversations as requests: system messages first, then every user turn in order; a
    conversation without a user turn is a counted skip."""
    requests = []
    for conv in conversations:
        prefix = [m for m in conv.messages if m["role"] == "system"]
        turns = [m for m in conv.messages if m["role"] == "user"]
        if not turns:
            skips.add("set row without a user turn", f"{name} row {conv.row}")
            continue
        requests.append(Request(name, name, f"{name}-{conv.row}", prefix, turns, conv.tools))
    return requests
