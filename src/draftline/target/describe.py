"""Describing a checkpoint (or tokenizer-only) folder as :class:`TargetInfo`: what every later stage needs.

The drafter's mask token must be an id that never occurs in training data: by default the highest-id *special*
added token that the chat template never writes and that is not eos/pad/bos/end-of-turn. Special added tokens are
only produced when their literal text is in the input, and decoding skips them. For Qwen3 that is
``<|video_pad|>`` (151656), a vision placeholder that text-only data never holds; for the embedded target it is its
last reserved token. The choice depends on the tokenizer alone, so a tokenizer-only folder (a CPU box) and the full
checkpoint (the GPU box) agree. ``target.mask_token_id`` overrides it, e.g. to match an existing drafter
(an id past the tokenizer, in the embedding's padding rows, is accepted when config.json shows those rows exist).

The end-of-turn token is read from the template, not assumed: an assistant turn is rendered and the token that
follows its content, past any whitespace the template writes first, is it when that is one added token (ChatML's
``<|im_end|>``, Llama 3's ``<|eot_id|>``, Gemma's ``<end_of_turn>``); a template that closes a turn with plain text,
or not at all, falls back to eos. Think tags are recorded only when the tokenizer has them as single tokens; a
target without them has no thinking mode.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from draftline.core.errors import MissingInput, Refusal
from draftline.core.fingerprint import model_fingerprint, template_sha256, tokenizer_fingerprint
from draftline.core.records import TargetInfo

THINK_TAGS = ("<think>", "</think>")
# An assistant reply no template writes on its own: what the template adds after it closes the turn.
_SENTINEL = "draftline-end-of-turn-probe"


def _read_config(folder: Path) -> dict[str, Any] | None:
    """config.json's text-model fields; multimodal checkpoints (Qwen3.5/3.6) keep them under ``text_config``."""
    file = folder / "config.json"
    if not file.is_file():
        return None
    cfg = json.loads(file.read_text(encoding="utf-8"))
    text = cfg.get("text_config") or {}
    return {k: cfg.get(k, text.get(k)) for k in ("num_hidden_layers", "hidden_size", "vocab_size")}


def _added_id(tok, token: str) -> int | None:
    """The id of ``token`` when the tokenizer has it as one piece (an added token), else None."""
    for tid, added in tok.added_tokens_decoder.items():
        if added.content == token:
            return tid
    return None


def end_of_turn(tok) -> tuple[str, int]:
    """The token the chat template closes an assistant turn with (see the module docstring), else eos."""
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        text = tok.apply_chat_template(messages, tokenize=False)
    except Exception as e:  # every later stage renders such a pair: a template that cannot is unusable
        raise Refusal(f"the chat template cannot render a user turn and an assistant reply "
                      f"({type(e).__name__}: {e}); fix the template") from None
    # Whitespace a template writes before its closing token ("\n<|im_end|>") would hide the token behind a newline.
    after = text.split(_SENTINEL, 1)[1].lstrip() if _SENTINEL in text else ""
    ids = tok(after, add_special_tokens=False)["input_ids"]
    if ids and ids[0] in tok.added_tokens_decoder:
        return tok.added_tokens_decoder[ids[0]].content, ids[0]
    return tok.eos_token, tok.eos_token_id


def _template_text(template: str | dict[str, str]) -> str:
    return template if isinstance(template, str) else "\n".join(template.values())


def pick_mask_token(tok, template: str | dict[str, str], reserved: set[int]) -> int:
    """The highest-id special added token the template never writes and that is not in ``reserved``."""
    text = _template_text(template)
    for tid in sorted(tok.added_tokens_decoder, reverse=True):
        added = tok.added_tokens_decoder[tid]
        if added.special and added.content not in text and tid not in reserved:
            return tid
    raise Refusal(
        "the tokenizer has no special added token that its chat template leaves unused; "
        "set target.mask_token_id to an id the target never produces"
    )


def _check_mask_token(tok, template: str | dict[str, str], mask_id: int, reserved: set[int], rows: int | None) -> None:
    """An explicit mask id must be an added special token the template never writes, or an embedding padding row."""
    if mask_id in reserved:
        raise Refusal(f"target.mask_token_id={mask_id} is eos/pad/bos/end-of-turn; choose an unused id")
    added = tok.added_tokens_decoder.get(mask_id)
    if added is not None:
        if not added.special or added.content in _template_text(template):
            raise Refusal(
                f"target.mask_token_id={mask_id} is {added.content!r}, which the chat template writes or decoding "
                "keeps; choose a special token the template never uses"
            )
    elif mask_id < len(tok):
        raise Refusal(
            f"target.mask_token_id={mask_id} is an ordinary vocabulary token that text encodes to; "
            "choose a reserved special token or an embedding padding row"
        )
    elif rows is None:
        raise Refusal(
            f"target.mask_token_id={mask_id} lies past the tokenizer ({len(tok)} tokens) and this folder has no "
            "config.json to show that the embedding has such a row; add config.json beside the tokenizer"
        )
    elif mask_id >= rows:
        raise Refusal(f"target.mask_token_id={mask_id} is outside the embedding ({rows} rows, config.json)")


def describe_target(
    folder: str | os.PathLike, mask_token_id: int | None = None, hash_weights: bool = True, embedded: bool = False
) -> TargetInfo:
    """Everything later stages need to know about the checkpoint (or tokenizer-only) folder ``folder``."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    if not folder.is_dir():
        raise MissingInput(f"target.path {folder} is not a folder; give a Hugging Face checkpoint folder or 'embedded'")
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    template = tok.chat_template
    if not template:
        raise Refusal(f"the tokenizer in {folder} has no chat template; add chat_template.jinja")
    if tok.eos_token_id is None:
        raise Refusal(f"the tokenizer in {folder} has no eos token (tokenizer_config.json: eos_token)")
    eot, eot_id = end_of_turn(tok)
    think = [t if _added_id(tok, t) is not None else None for t in THINK_TAGS]

    config = _read_config(folder)
    rows = config["vocab_size"] if config else None
    if rows is not None and rows < len(tok):
        raise Refusal(f"{folder}: the tokenizer has {len(tok)} tokens but config.json vocab_size is only {rows}")
    reserved = {i for i in (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id, tok.unk_token_id, eot_id) if i is not None}
    if mask_token_id is None:
        mask_token_id = pick_mask_token(tok, template, reserved)
    else:
        _check_mask_token(tok, template, mask_token_id, reserved, rows)

    return TargetInfo(
        path=str(folder),
        tokenizer_fingerprint=tokenizer_fingerprint(folder, template),
        chat_template_sha256=template_sha256(template),
        eos_token=tok.eos_token,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        end_of_turn_token=eot,
        end_of_turn_token_id=eot_id,
        think_start_token=think[0],
        think_end_token=think[1],
        mask_token_id=mask_token_id,
        vocab_size=rows if rows is not None else len(tok),
        num_hidden_layers=config["num_hidden_layers"] if config else None,
        hidden_size=config["hidden_size"] if config else None,
        model_fingerprint=model_fingerprint(folder, hash_weights),
        embedded=embedded,
    )
