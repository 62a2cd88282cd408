"""A drafter checkpoint in z-lab's layout: ``config.json``, ``model.safetensors`` and the modeling file, one folder.

Invariants: a folder is written whole or not at all (:func:`draftline.core.files.atomic_path`); it holds the drafter's
weights only (the target's embedding and lm_head are borrowed, never saved), in the dtype asked for (the target's),
under z-lab's names, which SGLang, vLLM and z-lab's ``dflash`` load as ``DFlashDraftModel`` / ``DFlash2DraftModel``
(``architectures`` chooses); its config.json has what transformers 4.5x and 5.x both read, and an ``auto_map`` that
names the class of its architecture in the copied modeling file. Reading takes draftline's layout or z-lab's (a
``model.`` prefix, sharded safetensors) and refuses a config of another architecture.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config

from draftline.core.files import atomic_path
from draftline.drafter.config import ARCHITECTURES, DrafterMismatch

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# The self-contained modeling file copied into every checkpoint (config.json's auto_map names its class there).
MODELING_FILE = "modeling_dflash.py"

# PretrainedConfig bookkeeping that means nothing for a drafter; left out of config.json to keep it readable.
_GENERIC_CONFIG_KEYS = {
    "_name_or_path",
    "id2label",
    "label2id",
    "chunk_size_feed_forward",
    "output_attentions",
    "output_hidden_states",
    "problem_type",
    "return_dict",
    "is_encoder_decoder",
}


def checkpoint_config(config: Qwen3Config, dtype: torch.dtype) -> dict[str, Any]:
    """``config.json`` as every reader needs it: transformers 5 reads ``rope_parameters`` and ``dtype``; 4.5x
    (z-lab pins 4.57.1) reads top-level ``rope_theta`` / ``rope_scaling`` and ``torch_dtype``, and without them
    silently takes rope_theta 10000; ``auto_map`` points ``AutoModel`` (trust_remote_code) at the modeling file."""
    out = {k: v for k, v in config.to_dict().items() if k not in _GENERIC_CONFIG_KEYS}
    out["dtype"] = out["torch_dtype"] = str(dtype).removeprefix("torch.")
    rope = dict(out.get("rope_parameters") or {})
    out["rope_theta"] = rope.get("rope_theta", getattr(config, "rope_theta", None))
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    out["rope_scaling"] = scaling if scaling.get("rope_type", "default") != "default" else None
    out["auto_map"] = {"AutoModel": f"{MODELING_FILE.removesuffix('.py')}.{out['architectures'][0]}"}
    return out


def write_checkpoint(path: str | Path, config: Qwen3Config, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """Write ``config.json`` + ``model.safetensors`` (``state``'s tensors in ``dtype``) and the modeling file,
    atomically as one folder."""
    with atomic_path(path, "the drafter checkpoint") as tmp:
        tmp.mkdir(parents=True)
        raw = checkpoint_config(config, dtype)
        (tmp / CONFIG_FILE).write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tensors = {k: v.detach().to(dtype).contiguous().cpu() for k, v in state.items()}
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        shutil.copyfile(Path(__file__).with_name(MODELING_FILE), tmp / MODELING_FILE)


def read_config(path: str | Path) -> Qwen3Config:
    """A drafter checkpoint's config (draftline's or z-lab's layout: ``architectures`` names DFlash 1 or 2)."""
    path = Path(path)
    raw = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    if not set(ARCHITECTURES.values()) & set(raw.get("architectures") or []):
        raise DrafterMismatch(
            f"{path / CONFIG_FILE} is not a {' or '.join(ARCHITECTURES.values())} config: {raw.get('architectures')}"
        )
    for key in ("dtype", "torch_dtype", "auto_map", "transformers_version"):
        raw.pop(key, None)
    return Qwen3Config(**raw)


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors, one ``model.safetensors`` or the shards its index names; a ``model.`` prefix (some
    trainers write it) dropped."""
    path = Path(path)
    index = path / f"{WEIGHTS_FILE}.index.json"
    files = (
        [path / f for f in sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))]
        if index.exists()
        else [path / WEIGHTS_FILE]
    )
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update({k.removeprefix("model."): v for k, v in load_file(str(f)).items()})
    return state
