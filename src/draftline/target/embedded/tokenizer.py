"""The embedded target's tokenizer: byte-level BPE trained on the rendered corpus, Qwen3's special tokens, our template.

Laid out like Qwen3's tokenizer so that code written against the embedded target meets the same shapes on a real
checkpoint: the learned vocabulary first, the added tokens after it (so eos is a high id), ``<|im_end|>`` as eos,
``<|endoftext|>`` as pad, think and tool tags as added tokens that decoding keeps, and reserved special tokens that
nothing emits (one becomes the drafter's mask token). Digits are split one by one, as Qwen3 does, which also makes
arithmetic learnable for a tiny model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from importlib import resources

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from draftline.core.chat import render
from draftline.core.gguf import QWEN2_SPLIT
from draftline.core.records import Conversation
from draftline.core.skips import Skips

# Special (skipped by decode(skip_special_tokens=True)) and plain added tokens, in Qwen3's order.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
RESERVED_TOKENS = [f"<|reserved_{i}|>" for i in range(4)]
EOS, PAD = "<|im_end|>", "<|endoftext|>"

# Pre-tokenization by Qwen2's split rule, word for word (Qwen3 keeps it): words with one leading non-letter,
# single digits, punctuation runs, and newline runs kept whole. The newline rule matters: with GPT-2's pattern "\n\n"
# splits differently before a word than at the end of a text, so a generation prompt ending in "</think>\n\n" would
# tokenize unlike the same text inside a training conversation (and prompt tokens would not prefix full tokens).
# Word for word, because llama.cpp's converter names a pre-tokenizer only by a rule it knows (core/gguf.py).
SPLIT_PATTERN = QWEN2_SPLIT
_ADDED_RE = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + TAG_TOKENS + RESERVED_TOKENS))


def chat_template() -> str:
    """The embedded target's chat template (``chat_template.jinja`` beside this module)."""
    return resources.files("draftline.target.embedded").joinpath("chat_template.jinja").read_text(encoding="utf-8")


def _wrap(tok: Tokenizer, model_max_length: int) -> PreTrainedTokenizerFast:
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = chat_template()
    return fast


def _bare_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def render_corpus(conversations: Iterable[Conversation], skips: Skips) -> Iterator[tuple[Conversation, str]]:
    """``(conversation, text)``: each rendered whole with our template by the one render (:mod:`draftline.core.chat`).

    Rendering needs no vocabulary, so a bare tokenizer object carries the template here, before BPE is trained.
    A conversation the template cannot render is counted as a ``render_error`` skip and left out.
    """
    renderer = _wrap(_bare_bpe(), model_max_length=1 << 30)
    for conv in conversations:
        try:
            yield conv, render(renderer, conv.messages, conv.tools, enable_thinking=None, generation_prompt=False)
        except Exception as e:  # a malformed message costs one conversation, not the build
            skips.add("render_error", f"{conv.source} row {conv.row}", f"{type(e).__name__}: {e}")


def train_tokenizer(texts: list[str], vocab_size: int, model_max_length: int) -> PreTrainedTokenizerFast:
    """Train byte-level BPE on ``texts`` (rendered chats) and return it as a transformers fast tokenizer.

    BPE learns from the text between added tokens only, so no merge is spent on pieces of ``<|im_start|>``;
    the added tokens are appended after training, after the learned vocabulary, as in Qwen3.
    """
    tok = _bare_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator((piece for text in texts for piece in _ADDED_RE.split(text) if piece), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in RESERVED_TOKENS])
    return _wrap(tok, model_max_length)
