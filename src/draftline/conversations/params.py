"""The conversations stage's params: ``conversations`` of params.yaml, and the source's entry (its adapter and
options), loaded together as :class:`ConversationsSettings`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftline.core.params import Params
from draftline.core.source_spec import SourceSpec, load_source


@dataclass(frozen=True)
class ConversationsParams(Params):
    """``params.yaml: conversations`` (documented there and in docs/conversations.md)."""

    multimodal: Literal["drop", "skip"]
    strict: bool


@dataclass(frozen=True)
class ConversationsSettings:
    """What one ``conversations@<name>`` run reads: the source's entry and the ``conversations`` section."""

    spec: SourceSpec
    params: ConversationsParams


def load(args) -> ConversationsSettings:
    return ConversationsSettings(load_source(args.source), ConversationsParams.load("conversations"))
