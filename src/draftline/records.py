"""The records that travel between stages, defined once.

A conversation is a list of OpenAI-style messages (plain dicts, so they go straight into
``tokenizer.apply_chat_template`` and over the wire to an OpenAI-compatible server):

    {"role": "system" | "user" | "assistant" | "tool", "content": str,
     "reasoning_content"?: str, "tool_calls"?: [...], "tool_call_id"?: str, "name"?: str}

Tools are OpenAI function specs: ``{"type": "function", "function": {"name", "description", "parameters"}}``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

Message = dict[str, Any]
Tool = dict[str, Any]

ROLES = ("system", "user", "assistant", "tool")


def dumps(obj: Any) -> str:
    """The one JSON encoding used for every line draftline writes: compact, UTF-8, key order as built.

    Keeping a single encoder is what makes outputs byte-identical across runs and machines.
    """
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@dataclass
class Conversation:
    """A source row normalised by an adapter: the whole conversation, the dataset's own answers included.

    The prompt stage cuts prompts out of it; the embedded target trains on it.
    """

    source: str
    row: int
    messages: list[Message]
    tools: list[Tool] | None = None


@dataclass
class PromptRecord:
    """One prompt for the target: the output of the prompt stage (``data/prompts/*.jsonl``)."""

    id: str
    source: str
    row: int
    messages: list[Message]
    tools: list[Tool] | None = None
    # The dataset's own answer: used only to estimate token counts, never sent to the target.
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
    """A prompt with the target's reply appended to ``messages`` (``data/completions/part-*.jsonl``).

    ``generation`` records how the reply was made: backend, target fingerprint, sampling params and
    ``enable_thinking``, so that the tokenizer renders it exactly as the server did.
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
