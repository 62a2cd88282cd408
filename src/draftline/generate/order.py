"""The order prompts are sent in: prompts sharing a prefix (system turn + tools) go together.

Invariants: the order is a stable function of the prompts alone (groups in order of first appearance, prompt order
inside), so every run and every writer of a shared journal walks the same list; it decides only when a prompt is
sent, never what it gets back, and the outputs are always written in prompt order.
"""

from __future__ import annotations

import hashlib

from draftline.core.jsonl import dumps
from draftline.core.records import PromptRecord


def prefix_group(p: PromptRecord) -> str:
    """What a server's prefix cache can share between prompts: the leading system turn(s) and the tools."""
    lead = []
    for m in p.messages:
        if m["role"] == "user":
            break
        lead.append(m)
    return hashlib.sha256(dumps([lead, p.tools]).encode("utf-8")).hexdigest()


def dispatch_order(groups: list[str]) -> list[int]:
    """Indices in an order that sends prompts sharing a prefix group (system prompt + tools) together.

    Groups come in order of first appearance and keep prompt order inside, so the order is stable; the
    server's prefix cache then holds the shared prefix while its prompts are in flight.
    """
    first: dict[str, int] = {}
    for i, g in enumerate(groups):
        first.setdefault(g, i)
    return sorted(range(len(groups)), key=lambda i: (first[groups[i]], i))
