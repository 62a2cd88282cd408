"""What a drafter is judged on (the evaluate stage, the served bench): requests of one or more user turns, from the
held-out prompts and the benchmark sets, each turn rendered as the target saw its prompts in generation.

A request is decoded turn by turn, as z-lab's ``dflash benchmark`` does for mt-bench: each next user turn is
appended after the target's own reply to the previous one, so a multi-turn set measures the drafter on the
conversation the target actually has. Every turn is one request in z-lab's figure.

Held-out prompts (the prompts stage's ``eval.jsonl``) are single-turn requests, rendered exactly as generation
sent them; a set's conversations keep their system messages and user turns, and drop the dataset's answers
(the target writes its own).

Every request carries its split (``dev`` or ``test``), a function of its id alone (core/splits.py): the prompt
stage filled each source's quotas with the same function, and a set's rows are split by it too. Every turn has a
seed of its own (:func:`turn_seed`) and its output a digest (:func:`tokens_digest`), so two decoders of the same
requests (evaluate's loop and a server) can be compared turn by turn.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from draftline.core.chat import render
from draftline.core.errors import MissingInput
from draftline.core.records import (
    Conversation,
    Message,
    PromptRecord,
    TargetInfo,
    Tool,
    read_conversations,
    read_prompts,
)
from draftline.core.skips import Skips
from draftline.core.splits import split_of

# The held-out prompts of the training sources (the prompts stage's eval.jsonl): always judged, under this name.
HELDOUT = "heldout"


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


def load_requests(prompts: str | os.PathLike, sets: str | os.PathLike, set_names: Iterable[str],
                  max_per_source: int | None, skips: Skips) -> list[Request]:
    """The held-out prompts of ``prompts`` (capped per source and split), then the requests of every set named, read
    from ``<sets>/<name>/conversations.jsonl``, in that order."""
    if not Path(prompts).is_file():
        raise MissingInput(f"{prompts} does not exist: run the prompts stage first (dvc repro prompts)")
    requests = heldout_requests(read_prompts(prompts, skips), max_per_source)
    for name in set_names:
        path = Path(sets) / name / "conversations.jsonl"
        if not path.is_file():
            raise MissingInput(f"{path} does not exist: run its stages first (dvc repro set_conversations@{name})")
        requests += set_requests(name, read_conversations(path, skips), skips)
    return requests


def render_prompt(tokenizer, messages: list, tools: list | None, enable_thinking: bool | None) -> list[int]:
    """A turn's prompt ids as the target saw them in generation: the one render (:mod:`draftline.core.chat`).

    The text is tokenized without special tokens, as ``apply_chat_template(tokenize=True)`` and SGLang do; a
    different render here is the first suspect when tau is low.
    """
    text = render(tokenizer, messages, tools, enable_thinking=enable_thinking, generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def stop_token_ids(info: TargetInfo) -> set[int]:
    """Decoding ends at the end-of-turn token (a chat reply's end) or at eos."""
    return {info.eos_token_id, info.end_of_turn_token_id}


def turn_seed(seed: int, setting: str, request: Request, turn: int) -> int:
    """Each turn's own seed: its draws do not depend on which turns ran before it or in which order."""
    return xxhash.xxh64_intdigest(f"{seed}/{setting}/{request.set}/{request.id}/{turn}".encode()) & (2**63 - 1)


def tokens_digest(tokens: list[int]) -> str:
    """xxh64 of a turn's output ids (the stop token included) as little-endian int64s."""
    return xxhash.xxh64_hexdigest(np.asarray(tokens, dtype="<i8").tobytes())
