"""Cutting a prompt into the requests that regenerate it, one per user turn (``prompts.turns: all``).

A prompt with at most one user message is sent as it is. A multi-turn prompt is regenerated turn by turn on
the target's OWN earlier answers: request k is the leading messages (system) followed by
``user_1, reply_1, ..., user_k``. The dataset's assistant (and tool) messages between user turns are dropped:
they answered a different conversation than the one the target is having, and a drafter must learn the
target's own continuations.
"""

from __future__ import annotations

from draftline.core.records import Message


def split_turns(messages: list[Message]) -> tuple[list[Message], list[list[Message]]]:
    """``(head, turns)``: the request for turn k is ``head + turns[0] + reply_0 + ... + turns[k]``."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if len(users) <= 1:
        return [], [list(messages)]
    head = list(messages[: users[0]])
    return head, [[messages[i]] for i in users]


def request_messages(head: list[Message], turns: list[list[Message]], replies: list[Message], k: int) -> list[Message]:
    """The messages sent for turn ``k``, given the target's replies to the turns before it."""
    out = list(head)
    for j in range(k):
        out += turns[j]
        out.append(replies[j])
    return out + turns[k]

