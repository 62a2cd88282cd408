"""Whether a drafter fits a target, and the drafter loaded bound to it: the check the evaluate stage makes
before running a drafter against the target.

Invariants: a drafter is only ever run against the target its training data was made for. Refused in one line,
naming what to change: a folder without a checkpoint, one without draftline's lineage, one whose data used another
tokenizer (its ids would mean other tokens) and one trained on a target with another number of layers (its
``target_layer_ids`` would read other layers). A mask token that differs from ``target.json``'s is only warned
about: the drafter's own is the one it was trained with.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftline.core.errors import MissingInput
from draftline.core.logs import get_logger
from draftline.core.records import TargetInfo
from draftline.drafter.config import DrafterMismatch, lineage_of
from draftline.drafter.model import DFlashDrafter

log = get_logger("draftline.drafter")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype | str:
    """A ``dtype`` param's word as torch's dtype (``auto``: the checkpoint's own, as transformers reads it)."""
    return "auto" if name == "auto" else _DTYPES[name]


def resolve_device(name: str) -> torch.device:
    """A ``device`` param: ``auto`` is cuda where there is one, else the CPU; anything else as torch names it."""
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)


def check_lineage(checkpoint: str | os.PathLike, info: TargetInfo) -> dict[str, Any]:
    """The checkpoint's lineage (see :func:`draftline.drafter.config.lineage_of`), checked against the target."""
    from transformers import PretrainedConfig

    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.json").is_file():
        raise MissingInput(f"no drafter in {checkpoint} (config.json missing): run the train stage first")
    lineage = lineage_of(PretrainedConfig.from_json_file(str(checkpoint / "config.json")))
    if lineage["tokenizer_fingerprint"] != info.tokenizer_fingerprint:
        raise DrafterMismatch(
            f"the drafter in {checkpoint} was trained on data of another tokenizer (fingerprint "
            f"{lineage['tokenizer_fingerprint'][:12]}) than the target's ({info.tokenizer_fingerprint[:12]}): "
            "retrain it for this target"
        )
    return lineage


def check_fits(checkpoint: str | os.PathLike, info: TargetInfo) -> dict[str, Any]:
    """:func:`check_lineage`, and the layer count against ``target.json``'s (no model loaded): what a server's
    drafter must pass before the server starts."""
    lineage = check_lineage(checkpoint, info)
    config = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))
    n_trained = config.get("num_target_layers")
    if info.num_hidden_layers is not None and n_trained is not None and int(n_trained) != info.num_hidden_layers:
        raise DrafterMismatch(
            f"the drafter in {checkpoint} was trained on a {n_trained}-layer target, but {info.path} has "
            f"{info.num_hidden_layers} layers: retrain it for this target"
        )
    return lineage


def load_fitting(checkpoint: str | os.PathLike, info: TargetInfo, target: nn.Module) -> DFlashDrafter:
    """The drafter in ``checkpoint``, checked against ``info`` (:func:`check_lineage`, the layer count), bound to
    ``target`` and in its dtype, in eval mode."""
    check_lineage(checkpoint, info)
    drafter = DFlashDrafter.from_pretrained(checkpoint, target).to(target.dtype)
    n_target = target.config.get_text_config().num_hidden_layers
    if int(getattr(drafter.config, "num_target_layers", n_target)) != n_target:
        raise DrafterMismatch(
            f"the drafter in {checkpoint} was trained on a {drafter.config.num_target_layers}-layer target, "
            f"but {info.path} has {n_target} layers: retrain it for this target"
        )
    if drafter.mask_token_id != info.mask_token_id:
        log.warning("the drafter's mask token %d is not target.json's %d: was it trained for another target?",
                    drafter.mask_token_id, info.mask_token_id)
    return drafter
