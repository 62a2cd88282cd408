"""What a prompt costs in tokens under the target tokenizer, for ``blend.unit: tokens`` and the report.

A row costs its prompt, rendered by the target's own chat template exactly as the server will see it, plus
the dataset's own answer (``reference``) as a proxy for the completion the target will write.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from draftline.records import PromptRecord


def load_target_tokenizer(target_json: str | os.PathLike) -> Any:
    """The tokenizer named by ``data/target/target.json`` (its ``path``), loaded offline."""
    from transformers import AutoTokenizer

    with open(target_json, encoding="utf-8") as f:
        path = json.load(f)["path"]
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def token_costs(records: Sequence[PromptRecord], tokenizer: Any, batch_size: int = 512) -> tuple[list[int], list[int]]:
    """``(prompt tokens, reference tokens)`` per record; texts are encoded in batches by the fast tokenizer."""
    prompt_tokens: list[int] = []
    reference_tokens: list[int] = []
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        rendered = [
            tokenizer.apply_chat_template(r.messages, tools=r.tools, add_generation_prompt=True, tokenize=False)
            for r in chunk
        ]
        enc = tokenizer(rendered + [r.reference or "" for r in chunk], add_special_tokens=False)["input_ids"]
        prompt_tokens += [len(ids) for ids in enc[: len(chunk)]]
        reference_tokens += [len(ids) for ids in enc[len(chunk) :]]
    return prompt_tokens, reference_tokens
