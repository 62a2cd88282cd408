"""Cutting a prompt out of a conversation, and its canonical form: the content-based id every later stage keys on.

The id hashes the WHOLE prompt (system, tools, every user turn) after whitespace and Unicode normalisation,
never a prefix: prompts behind one long shared system prompt differ only at their end.
"""

from __future__ import annotations

import json
import re
import unicodedata
from functools import lru_cache

import xxhash

from draftline.core.records import Conversation, Message, PromptRecord, Tool
from draftline.core.skips import RowError

_WS = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """NFKC (full-width, ligatures, non-breaking spaces) then every whitespace run as one space, trimmed."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text)).strip()


# Shared system prompts and tool lists repeat across thousands of rows: normalise each distinct one once.
_normalize_cached = lru_cache(maxsize=4096)(normalize_text)


def _canonical_tools(tools: list[Tool] | None) -> str:
    return json.dumps(tools, ensure_ascii=False, sort_keys=True, separators=(",", ":")) if tools else "null"


@lru_cache(maxsize=4096)
def _head_hash(head: str) -> bytes:
    return xxhash.xxh3_128_digest(head.encode("utf-8"))


def canonical_parts(messages: list[Message], tools: list[Tool] | None) -> tuple[str, str]:
    """(system + tools, the other turns) in canonical JSON; hashed apart so a shared head costs one hash."""
    head: list[str] = []
    body: list[object] = []
    for m in messages:
        if m["role"] == "system":
            head.append(_normalize_cached(m["content"]))
            continue
        item: dict[str, object] = {"role": m["role"], "content": normalize_text(m["content"])}
        for key in ("tool_calls", "tool_call_id", "name"):
            if key in m:
                item[key] = m[key]
        body.append(item)
    head_json = json.dumps(head, ensure_ascii=False, separators=(",", ":")) + _canonical_tools(tools)
    return head_json, json.dumps(body, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def prompt_id(messages: list[Message], tools: list[Tool] | None) -> str:
    """Hex xxh3-128 of the canonical prompt: equal for prompts that differ only in whitespace or Unicode form."""
    head, body = canonical_parts(messages, tools)
    return xxhash.xxh3_128_hexdigest(_head_hash(head) + body.encode("utf-8"))


def reply_text(message: Message) -> str:
    """What the target would have produced for a reply: its reasoning, text and tool calls (a token proxy)."""
    calls = [json.dumps(c.get("function", c), ensure_ascii=False) for c in message.get("tool_calls") or []]
    return "\n".join(t for t in (message.get("reasoning_content"), message.get("content"), *calls) if t)


def cut_prompt(conv: Conversation, turns: str) -> PromptRecord:
    """The prompt to send to the target, with the dataset's own answer as ``reference``.

    ``first``: everything up to and including the first user turn (system and tools kept); reference = the
    reply right after it. ``all``: system and every user turn, the dataset's replies and tool results dropped
    (the target regenerates them); reference = all the dataset's replies.
    """
    if turns not in ("first", "all"):
        raise ValueError(f"prompts.turns must be 'first' or 'all', not {turns!r}")
    msgs = conv.messages
    first = next((i for i, m in enumerate(msgs) if m["role"] == "user"), None)
    if first is None:
        raise RowError("no_user", "no user turn")
    if not msgs[first]["content"].strip():
        raise RowError("empty", "empty first user turn")
    if turns == "first":
        prompt = msgs[: first + 1]
        after = msgs[first + 1] if first + 1 < len(msgs) else None
        reference = reply_text(after) if after is not None and after["role"] == "assistant" else ""
    else:
        prompt = [m for m in msgs if m["role"] == "system" or (m["role"] == "user" and m["content"].strip())]
        reference = "\n".join(reply_text(m) for m in msgs if m["role"] == "assistant")
    return PromptRecord(
        id=prompt_id(prompt, conv.tools),
        source=conv.source,
        row=conv.row,
        messages=prompt,
        tools=conv.tools,
        reference=reference or None,
    )


def user_text(record: PromptRecord) -> str:
    """The text near-duplicate detection looks at: user turns only, so a shared system prompt cannot merge prompts."""
    return "\n".join(m["content"] for m in record.messages if m["role"] == "user")
