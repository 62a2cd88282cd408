"""Loading the target for the stages after ``target``: they read its ``target.json`` and nothing else.

Invariants: ``target.json``'s relative ``path`` is resolved against its own folder, so a checkout works anywhere;
every tokenizer load re-checks the fingerprint ``target.json`` recorded, so data is never made with a tokenizer
that changed behind DVC's back; models and tokenizers load from local files only, never from a hub.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from draftline.core.errors import MissingInput, Refusal
from draftline.core.fingerprint import sha256_file, tokenizer_fingerprint
from draftline.core.records import TargetInfo

TARGET_JSON = "target.json"


def load_target(target_json: str | os.PathLike) -> TargetInfo:
    """Read a ``target.json``; its relative ``path`` is resolved against the file's folder, so it works anywhere."""
    file = Path(target_json)
    if not file.is_file():
        raise MissingInput(f"{file} does not exist: run the target stage first (dvc repro target)")
    info = TargetInfo.from_dict(json.loads(file.read_text(encoding="utf-8")))
    if not os.path.isabs(info.path):
        info.path = os.path.normpath(file.parent.absolute() / info.path)
    return info


def load_tokenizer(info: TargetInfo, check: bool = True):
    """The target's tokenizer (``AutoTokenizer``, local files only).

    ``check`` recomputes the tokenizer fingerprint (milliseconds): a folder whose tokenizer changed after the
    target stage ran would otherwise make data that silently disagrees with ``target.json``.
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(info.path, local_files_only=True)
    if check and tokenizer_fingerprint(info.path, tok.chat_template) != info.tokenizer_fingerprint:
        raise Refusal(
            f"the tokenizer in {info.path} changed since the target stage described it; "
            "rerun it (dvc repro -f target) and the stages after it"
        )
    return tok


def load_model(info: TargetInfo, dtype: Any = "auto", device: Any = None):
    """The target model (``AutoModelForCausalLM``, local files only), in eval mode."""
    from transformers import AutoModelForCausalLM

    if info.model_fingerprint is None:
        raise Refusal(
            f"{info.path} holds no model weights (only a tokenizer): point target.path at the full checkpoint"
        )
    model = AutoModelForCausalLM.from_pretrained(info.path, dtype=dtype, local_files_only=True)
    if device is not None:
        model = model.to(device)
    return model.eval()


def source_gguf(target_json: str | os.PathLike) -> Path | None:
    """The GGUF file a GGUF target was converted from (``target.json: gguf``), checked by size and sha256 against
    what the target stage recorded; None for a Hugging Face target. This is the file llama.cpp serves."""
    file = Path(target_json)
    record = json.loads(file.read_text(encoding="utf-8")).get("gguf")
    if record is None:
        return None
    if "path" not in record:
        raise Refusal(f"{file} records its GGUF without the file's path (an older target stage): "
                      "rerun it (dvc repro -f target)")
    gguf = Path(record["path"]) if os.path.isabs(record["path"]) else file.parent / record["path"]
    if not gguf.is_file() or gguf.stat().st_size != record["bytes"] or sha256_file(gguf) != record["sha256"]:
        raise Refusal(f"{gguf} is missing or is not the GGUF file the target stage converted (sha256 "
                      f"{record['sha256'][:12]}, {record['bytes']} bytes): restore it, or rerun dvc repro -f target")
    return gguf.resolve()
