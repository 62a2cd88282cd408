"""Helpers for the merge tests: a small BPE tokenizer trained here, its target.json, rows made by really
tokenizing chat-like texts, and dataset folders in the draftline and legacy layouts."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from draftline.core import dataset as fmt
from draftline.core.fingerprint import template_sha256, tokenizer_fingerprint
from draftline.core.records import TargetInfo

WORDS = (
    "the drafter learns what the target says next token block anchor mask loss merge shard arrow "
    "prompt answer reason think tool call result python code math sum prove river stone cloud light "
    "quick brown fox jumps over lazy dog seven eleven forty data version cache remote"
).split()
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def train_tokenizer(folder: Path, vocab_size: int = 400, seed: int = 0) -> Path:
    """A byte-level BPE tokenizer trained here: ids unrelated to Qwen3's, decode/encode lossless."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(300)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(folder)
    return folder


def write_target(path: Path, tok_dir: Path) -> TargetInfo:
    """A data/target/target.json for a tokenizer folder, fingerprinted as the target stage does."""
    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    info = TargetInfo(
        path=str(tok_dir),
        tokenizer_fingerprint=tokenizer_fingerprint(tok_dir, tok.chat_template),
        chat_template_sha256=template_sha256(tok.chat_template),
        eos_token="<|im_end|>",
        eos_token_id=eot,
        pad_token_id=tok.pad_token_id,
        end_of_turn_token="<|im_end|>",
        end_of_turn_token_id=eot,
        think_start_token=None,
        think_end_token=None,
        mask_token_id=len(tok) - 1,
        vocab_size=len(tok),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info.to_dict()), encoding="utf-8")
    return info


def make_rows(tok_dir: Path, ids: list[str], seed: int, source: str = "s", words: int = 12) -> pa.Table:
    """Tokenized chat rows: the reply (after the generation prompt) is the supervised part.

    A row's prompt depends on its id alone, its reply on ``seed`` too: like a prompt answered again."""
    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    offsets, input_ids, mask = [0], [], []
    for row_id in ids:
        rng = random.Random(f"prompt {row_id}")
        q = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, words)))
        rng = random.Random(f"reply {seed} {row_id}")
        a = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, words)))
        prompt = f"<|im_start|>user\n{row_id} {q}<|im_end|>\n<|im_start|>assistant\n"
        enc = tok(prompt + a + "<|im_end|>\n", add_special_tokens=False, return_offsets_mapping=True)
        input_ids += enc["input_ids"]
        mask += [start >= len(prompt) for start, _ in enc["offset_mapping"]]
        offsets.append(len(input_ids))
    return fmt.build_table(ids, [source] * len(ids), np.array(offsets), np.array(input_ids), np.array(mask))


def write_tokenized(folder: Path, table: pa.Table, info: TargetInfo, max_shard_bytes: int = 4000,
                    provenance: list[str | None] | None = None) -> fmt.DatasetMeta:
    """A tokenized folder of ``table``'s rows; ``provenance``: each row's (none: rows that record none)."""
    meta = fmt.DatasetMeta(
        tokenizer_fingerprint=info.tokenizer_fingerprint,
        chat_template_sha256=info.chat_template_sha256,
        enable_thinking=False,
        max_len=256,
        mask_token_id=info.mask_token_id,
        end_of_turn_token_id=info.end_of_turn_token_id,
    )
    return fmt.write_dataset(folder, [(table, provenance) if provenance else table], meta,
                             max_shard_bytes=max_shard_bytes)


def write_legacy(folder: Path, table: pa.Table, with_ids: bool = False, **extra: list) -> None:
    """A legacy folder as older pipelines saved it: int64 ids, int64 mask, no draftline.json."""
    cols = {
        "input_ids": [[int(x) for x in r] for r in table.column("input_ids").to_pylist()],
        "loss_mask": [[int(x) for x in r] for r in table.column("loss_mask").to_pylist()],
        **extra,
    }
    if with_ids:
        cols["id"] = table.column("id").to_pylist()
    save_int64(folder, cols)


def save_int64(folder: Path, cols: dict) -> None:
    """save_to_disk with 64-bit token columns (datasets would infer int32 for a column named input_ids)."""
    features = datasets.Dataset.from_dict(cols).features
    for name in ("input_ids", "loss_mask"):
        if features[name].feature.dtype.startswith("int"):
            features[name] = datasets.List(datasets.Value("int64"))
    datasets.Dataset.from_dict(cols, features=features).save_to_disk(str(folder))


def file_hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


DOMAIN_PROMPTS = {  # a prompt each domain's rule recognises (core/classify.py)
    "code": "Write a Python function that returns the median of a list.",
    "math": "Tom has 12 apples and gives 5 away. How many apples does he have left?",
    "tool_use": "<|im_start|>system\n# Tools\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"w\"}}\n"
                "</tools><|im_end|>\n<|im_start|>user\nWhat is the weather in Oslo?",
    "general": "Describe the first snow of winter in a few sentences.",
}


def chat_rows(tok_dir: Path, domains: list[str]) -> pa.Table:
    """One tokenized row per domain name: its prompt (chat template rendered), a short supervised reply."""
    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    offsets, ids, mask = [0], [], []
    for i, d in enumerate(domains):
        body = DOMAIN_PROMPTS[d]
        prompt = (body if body.startswith("<|im_start|>") else f"<|im_start|>user\n{body}") + f" ({i})<|im_end|>\n"
        prompt += "<|im_start|>assistant\n"
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        a = tok("an answer<|im_end|>\n", add_special_tokens=False)["input_ids"]
        ids += p + a
        mask += [False] * len(p) + [True] * len(a)
        offsets.append(len(ids))
    return fmt.build_table([f"r{i}" for i in range(len(domains))], ["s"] * len(domains), np.array(offsets),
                           np.array(ids), np.array(mask))
