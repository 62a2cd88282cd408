"""What a prompt costs in tokens under the target tokenizer, for ``blend.unit: tokens`` and the report.

A row costs its prompt, rendered by the target's own chat template exactly as the server will see it, plus
the dataset's own answer (``reference``) as a proxy for the completion the target will write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from draftline.core.chat import render
from draftline.core.records import PromptRecord


class _HeadCache:
    """Token counts of rendered system turns (system prompt + tools), each distinct one encoded once.

    Half of real prompts sit behind a few long shared system prompts; encoding those again for every row
    costs more than the rest of the stage. A head is only split off where the render puts an added token
    (``<|im_start|>``) right after it: added tokens are cut out before BPE, so the counts add up exactly.
    """

    def __init__(self, tokenizer: Any, enable_thinking: bool):
        self.tokenizer = tokenizer
        self.enable_thinking = enable_thinking
        self.added = tuple(tokenizer.get_added_vocab())
        self.renders: dict[str, str | None] = {}
        self.counts: dict[str, int] = {}

    def split(self, record: PromptRecord, full: str) -> tuple[str | None, str]:
        system = [m for m in record.messages if m["role"] == "system"]
        if not system and not record.tools:
            return None, full
        key = json.dumps([system, record.tools], sort_keys=True)
        if key not in self.renders:
            self.renders[key] = (
                render(self.tokenizer, system, record.tools, enable_thinking=self.enable_thinking, generation_prompt=False)
                if system else None
            )
        head = self.renders[key]
        if not head or not full.startswith(head) or not full[len(head) :].startswith(self.added):
            return None, full
        return head, full[len(head) :]


def token_costs(
    records: Sequence[PromptRecord], tokenizer: Any, enable_thinking: bool, batch_size: int = 512
) -> tuple[list[int], list[int]]:
    """``(prompt tokens, reference tokens)`` per record; texts are encoded in batches by the fast tokenizer."""
    heads = _HeadCache(tokenizer, enable_thinking)
    prompt_tokens: list[int] = []
    reference_tokens: list[int] = []
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        split = [
            heads.split(r, render(tokenizer, r.messages, r.tools, enable_thinking=enable_thinking, generation_prompt=True))
            for r in chunk
        ]
        new_heads = sorted({h for h, _ in split if h is not None and h not in heads.counts})
        texts = [rest for _, rest in split] + [r.reference or "" for r in chunk] + new_heads
        enc = tokenizer(texts, add_special_tokens=False)["input_ids"]
        n = len(chunk)
        heads.counts.update({h: len(ids) for h, ids in zip(new_heads, enc[2 * n :])})
        prompt_tokens += [len(ids) + (heads.counts[h] if h is not None else 0) for (h, _), ids in zip(split, enc[:n])]
        reference_tokens += [len(ids) for ids in enc[n : 2 * n]]
    return prompt_tokens, reference_tokens
