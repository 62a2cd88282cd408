"""GGUF files by llama.cpp's own converter: the pre-tokenizer named only where the tokenizer declares a rule llama.cpp
knows, the embedded target converted as it is, and a damaged cached conversion made again, never served. That
llama.cpp then tokenizes rendered prompts as transformers does is tested on the embedded default's own tokenizer
(tests/test_pipeline.py)."""

from __future__ import annotations

import copy
import json

import pytest

from draftline.core.gguf import QWEN2_SPLIT, declared_pre_tokenizer, served_target
from draftline.core.target_loader import load_target


def tokenizer_json(embedded_target) -> dict:
    return json.loads((embedded_target / "model" / "tokenizer.json").read_text())


def test_the_split_rule_is_qwen2s_word_for_word():
    qwen2 = pytest.importorskip("transformers.models.qwen2.tokenization_qwen2")
    assert QWEN2_SPLIT == qwen2.PRETOKENIZE_REGEX


def test_only_a_rule_llama_cpp_knows_is_named(embedded_target):
    declared = tokenizer_json(embedded_target)
    assert declared_pre_tokenizer(declared) == "qwen2"
    other = copy.deepcopy(declared)
    other["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN2_SPLIT.replace(r"\p{N}", r"\p{N}{1,3}")
    assert declared_pre_tokenizer(other) is None  # GPT-4's digit triples: another rule, left to the converter
    regex_twice = copy.deepcopy(declared)
    regex_twice["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = True
    assert declared_pre_tokenizer(regex_twice) is None
    assert declared_pre_tokenizer({"pre_tokenizer": None}) is None


def test_the_embedded_target_converts_and_a_damaged_copy_is_made_again(embedded_target):
    gguf = pytest.importorskip("gguf")
    file = served_target(embedded_target / "target.json", "f32")
    fields = gguf.GGUFReader(file).fields
    assert fields["tokenizer.ggml.pre"].contents() == "qwen2"
    assert fields["general.architecture"].contents() == "qwen3"
    assert fields["qwen3.block_count"].contents() == load_target(embedded_target / "target.json").num_hidden_layers
    good = file.read_bytes()
    with open(file, "r+b") as f:  # one flipped byte in the cached conversion
        f.seek(len(good) // 2)
        f.write(bytes([good[len(good) // 2] ^ 0xFF]))
    again = served_target(embedded_target / "target.json", "f32")
    assert again == file and again.read_bytes() == good  # the same conversion, made again
