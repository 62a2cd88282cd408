"""The records that travel between stages, defined once, with the one reader of each record file.

Invariants: every line draftline writes is encoded by :func:`dumps`; a reader never stops at a bad line, it
counts it as a skip with its reason and ``file:line`` (or raises in strict mode), and never yields a half-valid
record. Files of records: ``data/conversations/<name>/conversations.jsonl`` (:class:`Conversation`),
``data/prompts/{train,eval}.jsonl`` (:class:`PromptRecord`), ``data/completions/part-*.jsonl``
(:class:`CompletionRecord`) and ``data/target/target.json`` (:class:`TargetInfo`).

A conversation is a list of OpenAI-style messages (plain dicts, so they go straight into
``tokenizer.apply_chat_template`` and over the wire to an OpenAI-compatible server):

    {"role": "system" | "user" | "assistant" | "tool", "content": str,
     "reasoning_content"?: str, "tool_calls"?: [...], "tool_call_id"?: str, "name"?: str}

Tools are OpenAI function specs: ``{"type": "function", "function": {"name", "description", "parameters"}}``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from draftline.core.jsonl import dumps, iter_jsonl
from draftline.core.skips import Skips

# A source's folder of conversations (data/conversations/<name>/): the records, and the counts of reading them.
CONVERSATIONS_FILE = "conversations.jsonl"
CONVERSATIONS_STATS_FILE = "stats.json"
# The prompt stage's folder: the prompts generation sends, and the held-out prompts evaluation decodes.
TRAIN_FILE = "train.jsonl"
EVAL_FILE = "eval.jsonl"

Message = dict[str, Any]
Tool = dict[str, Any]

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Conversation:
    """A source row normalised by an adapter: the whole conversation, the dataset's own answers included.

    The prompt stage cuts prompts out of it; the embedded target trains on it.
    """

    source: str
    row: int
    messages: list[Message]
    tools: list[Tool] | None = None

    def to_json(self) -> str:
        return dumps(asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Conversation":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass
class PromptRecord:
    """One prompt for the target: the output of the prompt stage (``data/prompts/*.jsonl``)."""

    id: str
    source: str
    row: int
    messages: list[Message]
    tools: list[Tool] | None = None
    # The dataset's own answer: never sent to the target; it estimates token counts, and is the reply of the
    # baseline ``generate.backend: dataset``.
    reference: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PromptRecord":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass
class CompletionRecord(PromptRecord):
    """A prompt with the target's reply appended to ``messages`` (``data/completions/part-*.jsonl``); with
    ``generation.backend: dataset``, the dataset's own answer instead.

    ``generation`` records how the reply was made: backend, target fingerprint, sampling params (null where nothing
    was sampled) and ``enable_thinking``, so that the tokenizer renders it exactly as the server did.
    """

    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    generation: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_messages(self) -> list[Message]:
        """The messages up to (not including) the target's final reply."""
        last = max(i for i, m in enumerate(self.messages) if m["role"] != "assistant") if self.messages else -1
        return self.messages[: last + 1]


@dataclass
class TargetInfo:
    """What every stage after ``target`` needs to know about the target model (``data/target/target.json``).

    ``path`` is the Hugging Face folder to load with ``AutoTokenizer`` / ``AutoModelForCausalLM``; for a real
    checkpoint it is used in place. ``tokenizer_fingerprint`` is a sha256 over the tokenizer files and the chat
    template: data made under one fingerprint is only ever merged with data of the same fingerprint.
    """

    path: str
    tokenizer_fingerprint: str
    chat_template_sha256: str
    eos_token: str
    eos_token_id: int
    pad_token_id: int | None
    end_of_turn_token: str
    end_of_turn_token_id: int
    think_start_token: str | None
    think_end_token: str | None
    # An id the target never produces, used as the drafter's mask token.
    mask_token_id: int
    vocab_size: int
    # From config.json where there is one (a tokenizer-only folder has none).
    num_hidden_layers: int | None = None
    hidden_size: int | None = None
    model_fingerprint: str | None = None
    embedded: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TargetInfo":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def _valid_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in value
    )


def read_conversations(path: str | os.PathLike, skips: Skips) -> Iterator[Conversation]:
    """The conversations of one ``conversations.jsonl``, in file order."""
    for lineno, value, error in iter_jsonl(path):
        where = f"{path}:{lineno}"
        if error:
            skips.add("invalid JSON", where, error)
        elif not isinstance(value, dict) or not _valid_messages(value.get("messages")):
            skips.add("no messages", where)
        else:
            yield Conversation.from_dict(value)


def read_prompts(path: str | os.PathLike, skips: Skips) -> list[PromptRecord]:
    """The prompt records of ``path`` in file order; a line repeating an earlier id is skipped (``duplicate id``)."""
    records, seen = [], set()
    for lineno, value, error in iter_jsonl(path):
        where = f"{path}:{lineno}"
        if error:
            skips.add("invalid JSON", where, error)
            continue
        if not isinstance(value, dict) or not _valid_messages(value.get("messages")):
            skips.add("no messages", where)
            continue
        try:
            rec = PromptRecord.from_dict(value)
            if not isinstance(rec.id, str) or not isinstance(rec.source, str):
                raise TypeError("needs a string id and source")
        except TypeError as e:
            skips.add("not a PromptRecord", where, str(e))
            continue
        if rec.id in seen:
            skips.add("duplicate id", where, rec.id)
            continue
        seen.add(rec.id)
        records.append(rec)
    return records


def parse_completion(obj: Any) -> CompletionRecord:
    """One decoded ``data/completions`` line as a record; raises ValueError saying what is wrong with it."""
    if not isinstance(obj, dict):
        raise ValueError(f"a completion is a JSON object, not a {type(obj).__name__}")
    try:
        rec = CompletionRecord.from_dict(obj)
    except TypeError as e:
        raise ValueError(str(e)) from None
    if not _valid_messages(rec.messages):
        raise ValueError("messages must be a non-empty list of {role, content} objects")
    if not isinstance(rec.generation, dict):
        raise ValueError("generation must be an object")
    return rec
