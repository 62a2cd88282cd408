"""The ``dataset`` backend: each prompt's own dataset answer passed through as its reply; no target is loaded.

The baseline every regeneration should beat: a drafter trained on these rows learns the datasets' answers, one
trained on the other backends' rows the target's own, at equal rows and through the same journal, shards and report.

Invariants:

- **The reply is the prompt's reference, byte for byte**, as the assistant's ``content``: the text the prompt stage
  kept of the dataset's reply (:func:`draftline.prompts.canonical.reply_text`: its reasoning, text and tool calls
  joined by newlines), so a reply carries neither ``reasoning_content`` nor structured ``tool_calls``. Its
  ``finish_reason`` is ``dataset``: never ``length`` (never truncated, whatever ``max_tokens``), and it goes through
  :class:`~draftline.generate.regeneration.Regeneration` into the journal as any backend's reply does.
- **A prompt it cannot answer is a counted skip, never an empty reply** (:func:`answerable`, before any work):
  ``no_reference`` (none, or blank) and ``multi_turn`` (several user turns: with ``prompts.turns: all`` the
  reference joins every dataset reply into one text, which cannot be cut into one reply per turn). Under
  ``generate.strict: true`` the first one stops the stage, as a bad line of the prompts file does.
- **Token counts as the other backends count them**, under the target's tokenizer (the only part of the target it
  loads): ``prompt_tokens`` the prompt rendered by the one render with the generation prompt, ``completion_tokens``
  the reply's tokens and the end-of-turn token a server counts.
- **Journaled in chunks** of :data:`CHUNK` prompts, so a kill loses at most one chunk's counting; a rerun reads the
  journal, whose key (:mod:`draftline.generate.key`) covers every reference.
"""

from __future__ import annotations

from typing import Any

from draftline.core.chat import render
from draftline.core.records import PromptRecord, TargetInfo
from draftline.core.skips import Skips
from draftline.core.target_loader import load_tokenizer
from draftline.generate.openai_client import ChatResult
from draftline.generate.params import GenerateParams
from draftline.generate.regeneration import Regeneration
from draftline.generate.turns import split_turns
from draftline.generate.work import Work

FINISH_REASON = "dataset"
# The engine every passed-through reply records: none ran; the row's ``source`` names the dataset.
ENGINE = {"name": "dataset", "version": None}
NO_REFERENCE, MULTI_TURN = "no_reference", "multi_turn"
CHUNK = 1000  # prompts counted and journaled together


def answerable(prompts: list[PromptRecord], skips: Skips) -> list[PromptRecord]:
    """The prompts with a dataset answer to pass through; every other one counted in ``skips`` with its reason."""
    out = []
    for p in prompts:
        where = f"prompt {p.id} ({p.source} row {p.row})"
        if not (p.reference or "").strip():
            skips.add(NO_REFERENCE, where, "the dataset has no answer to pass through")
        elif len(split_turns(p.messages)[1]) > 1:
            skips.add(MULTI_TURN, where, "its reference joins the replies to every user turn in one text")
        else:
            out.append(p)
    return out


def generate_dataset(work: Work, s: GenerateParams, info: TargetInfo) -> dict[str, int]:
    """Journal ``work``'s pending prompts with their references as replies; returns the requests made (none)."""
    tokenizer = load_tokenizer(info)

    def lengths(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]

    pending = work.plan.pending
    for start in range(0, len(pending), CHUNK):
        chunk = [p for p in pending[start : start + CHUNK] if not work.journal.done(p.id)]
        if not chunk:
            continue
        prompt_tokens = lengths([render(tokenizer, p.messages, p.tools, enable_thinking=s.enable_thinking,
                                        generation_prompt=True) for p in chunk])
        reply_tokens = lengths([p.reference or "" for p in chunk])
        entries = [_passed_through(p, n_prompt, n_reply + 1)
                   for p, n_prompt, n_reply in zip(chunk, prompt_tokens, reply_tokens)]
        for entry in work.journal.append_many(entries):
            work.record(entry)
    return {"requests": 0, "retries": 0}


def _passed_through(p: PromptRecord, n_prompt: int, n_out: int) -> dict[str, Any]:
    """The journal entry of ``p`` answered by its reference (``thinking`` off: the dataset's answer has no
    reasoning apart, so the check for empty reasoning does not apply)."""
    reply = ChatResult(message={"role": "assistant", "content": p.reference}, finish_reason=FINISH_REASON,
                       usage={"prompt_tokens": n_prompt, "completion_tokens": n_out}, engine=ENGINE)
    entry = Regeneration(p, thinking=False).take(reply)
    assert entry is not None  # a single-turn prompt ends at its first reply (answerable keeps no other)
    return entry
