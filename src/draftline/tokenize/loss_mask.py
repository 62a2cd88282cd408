"""Render chats with the target's own template and mark exactly the tokens the target generated.

Why this way (each shortcut below fails silently on Qwen3):
- ``return_assistant_tokens_mask`` is all zeros with the stock Qwen3 template, so the mask is derived from text:
  the generated part of a row is what follows ``render(prompt, add_generation_prompt=True)`` in
  ``render(prompt + reply)``. Whatever the template puts into the generation prompt (an empty think block when
  thinking is off, the opening ``<think>`` of a thinking-only template) is thereby prompt, never trained on.
- Rendering turn by turn is wrong on Qwen3, which drops earlier turns' reasoning; so each row is rendered whole,
  and a row whose full render does not start with its prompt render is skipped (``template_not_prefix``).
- Tokenizing prompt and reply apart drifts from whole-text tokenization (BPE merges across the seam), so the
  whole text is tokenized once, in a batch, and the seam is located on the token offsets.

The masked region runs from the first token after the prompt up to the last end-of-turn token; what the template
adds after it (Qwen's ``\\n``) stays in ``input_ids`` but is unmasked, as the target never generated it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from draftline.core.chat import render
from draftline.core.dataset import build_table, empty_table
from draftline.core.records import Message, Tool

OVERFLOW_MODES = ("drop", "truncate")


class Example(NamedTuple):
    """One training row to be: the prompt messages and the same conversation with the reply to learn appended."""

    id: str
    source: str
    prompt: list[Message]
    full: list[Message]
    tools: list[Tool] | None
    enable_thinking: bool | None
    # How its completion was made (:func:`draftline.core.provenance.of_generation`); None where it did not say.
    provenance: str | None = None


@dataclass
class ChunkResult:
    """What one chunk of examples became: the rows, and every skipped example as ``(reason, id, detail)``."""

    table: pa.Table
    skips: list[tuple[str, str, str]] = field(default_factory=list)
    truncated: int = 0
    # enable_thinking of each written row's generation run (None where the run did not say).
    thinking: set[bool | None] = field(default_factory=set)
    # Each written row's provenance, in row order.
    provenance: list[str | None] = field(default_factory=list)


def render_example(tokenizer: Any, ex: Example) -> tuple[str, str]:
    """``(prompt_text, full_text)`` exactly as the server renders them: the one render, the run's tools and mode."""
    kw = {"enable_thinking": ex.enable_thinking}
    return (render(tokenizer, ex.prompt, ex.tools, generation_prompt=True, **kw),
            render(tokenizer, ex.full, ex.tools, generation_prompt=False, **kw))


class MaskBuilder:
    """Turns examples into rows; one per worker process (the tokenizer is loaded once, then reused)."""

    def __init__(self, tokenizer: Any, end_of_turn_id: int, max_len: int, overflow: str):
        if overflow not in OVERFLOW_MODES:
            raise ValueError(f"tokenize.overflow must be one of {OVERFLOW_MODES}, not {overflow!r}")
        if max_len < 2:
            raise ValueError(f"tokenize.max_len must be at least 2, not {max_len}")
        self.tokenizer = tokenizer
        self.backend = tokenizer.backend_tokenizer
        self.eot = end_of_turn_id
        self.max_len = max_len
        self.overflow = overflow

    def __call__(self, examples: list[Example]) -> ChunkResult:
        result = ChunkResult(table=empty_table())
        rendered: list[tuple[Example, int, str]] = []
        for ex in examples:
            try:
                prompt, full = render_example(self.tokenizer, ex)
            except Exception as e:  # a template raises on input it does not accept (e.g. roles out of order)
                result.skips.append(("render_error", ex.id, f"{type(e).__name__}: {e}"[:200]))
                continue
            if not full.startswith(prompt):
                at = next((i for i, (a, b) in enumerate(zip(prompt, full)) if a != b), min(len(prompt), len(full)))
                result.skips.append(("template_not_prefix", ex.id, f"renders differ at character {at}"))
                continue
            rendered.append((ex, len(prompt), full))

        encodings = self.backend.encode_batch([full for _, _, full in rendered], add_special_tokens=False)
        ids_parts: list[np.ndarray] = []
        mask_parts: list[np.ndarray] = []
        row_ids: list[str] = []
        sources: list[str] = []
        for (ex, boundary, full), enc in zip(rendered, encodings):
            row = self._row(ex, boundary, full, enc, result)
            if row is None:
                continue
            ids_parts.append(row[0])
            mask_parts.append(row[1])
            row_ids.append(ex.id)
            sources.append(ex.source)
            result.thinking.add(ex.enable_thinking)
            result.provenance.append(ex.provenance)

        lengths = np.fromiter((len(p) for p in ids_parts), dtype=np.int64, count=len(ids_parts))
        result.table = build_table(
            row_ids,
            sources,
            np.concatenate([[0], np.cumsum(lengths)]),
            np.concatenate(ids_parts) if ids_parts else np.zeros(0, np.int32),
            np.concatenate(mask_parts) if mask_parts else np.zeros(0, np.bool_),
        )
        return result

    def _row(self, ex: Example, boundary: int, full: str, enc: Any, result: ChunkResult):
        """``(input_ids, loss_mask)`` of one rendered example, or None after recording why it is skipped."""
        ids = np.asarray(enc.ids, dtype=np.int32)
        # First token of the reply: the one holding the reply's first character, looked up on the offsets inside
        # the tokenizer (about 2 us for 5K tokens, where copying the offsets out to bisect them costs 0.8 ms, 15%
        # of the encoding itself). It must start exactly there: a token spanning the seam is half prompt.
        start = enc.char_to_token(boundary) if boundary < len(full) else None
        if start is None:
            result.skips.append(("empty_loss_mask", ex.id, "the reply renders as no text"))
            return None
        if enc.token_to_chars(start)[0] != boundary:
            result.skips.append(("boundary_inside_token", ex.id, f"a token spans the prompt/reply seam at {boundary}"))
            return None
        eots = np.flatnonzero(ids[start:] == self.eot)
        if not len(eots):
            result.skips.append(("no_end_of_turn", ex.id, "the reply has no end-of-turn token"))
            return None
        end = start + int(eots[-1]) + 1
        tail = full[enc.token_to_chars(end - 1)[1] :]
        if tail.strip():
            result.skips.append(("text_after_end_of_turn", ex.id, f"the template adds {tail[:40]!r} after it"))
            return None

        mask = np.zeros(len(ids), dtype=np.bool_)
        mask[start:end] = True
        if len(ids) > self.max_len:
            if self.overflow == "drop":
                result.skips.append(("too_long", ex.id, f"{len(ids)} tokens > max_len {self.max_len}"))
                return None
            ids, mask = ids[: self.max_len], mask[: self.max_len]
            result.truncated += 1
        # The mask is one contiguous run, so its size is the longest run of consecutive supervised tokens.
        n_loss = int(mask.sum())
        if n_loss == 0:
            result.skips.append(("empty_loss_mask", ex.id, "truncation left no reply token"))
            return None
        if n_loss < 2:
            result.skips.append(("too_few_loss_tokens", ex.id, f"{n_loss} supervised token; training needs 2 in a row"))
            return None
        return ids, mask
