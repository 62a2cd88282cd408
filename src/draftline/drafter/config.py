"""The drafter's config: the target's shapes, DFlash's fields in z-lab's layout, and the lineage of its training data.

Invariants: a config shares with its target every field the borrowed embedding and lm_head depend on (hidden size,
vocabulary) and what keeps the drafter a Qwen3 that servers build (heads, head_dim, RoPE, ...); it never taps the
target's last layer (transformers reports that one after the final norm, servers before it); ``architectures`` is
``DFlashDraftModel`` or ``DFlash2DraftModel`` (:data:`ARCHITECTURES`), and DFlash 2's sizes are in ``dflash_config``.
Every config made here records its training data's lineage under ``draftline``; a drafter config without one is
refused by :func:`lineage_of`, since nothing then says which target it fits.
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen3Config

from draftline.core.errors import Refusal
from draftline.drafter.modeling_dflash import DFLASH, DFLASH2, FULL, SLIDING

ARCHITECTURES = {"dflash": DFLASH, "dflash2": DFLASH2}
# DFlash 2's fields of dflash_config (z-lab's layout, e.g. SpecForge's configs/qwen3.6-27b-dflash2.json).
DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")

# Fields of the target's (text) config the drafter must share: the embedding and lm_head are the target's,
# so the hidden size and vocabulary must match; the rest keeps the drafter a Qwen3 that servers can build.
_SHARED_FIELDS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rms_norm_eps",
    "vocab_size",
    "max_position_embeddings",
    "hidden_act",
    "rope_parameters",
)


class DrafterMismatch(Refusal, ValueError):
    """A drafter that does not fit its target (layers, hidden size) or was not made by the train stage (no lineage,
    another architecture): the message says what to retrain or change."""


def build_target_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """``count`` target layers spread evenly from layer 1 to layer L-3, as z-lab picks them.

    The last layers are left out because they are specialised to the target's own next token; the middle
    ones carry what the following tokens depend on. One layer: the middle one.
    """
    if count < 1:
        raise DrafterMismatch(f"need at least one target layer, got {count}")
    if count == 1:
        return [num_target_layers // 2]
    start, end = 1, max(1, num_target_layers - 3)
    ids = sorted({int(round(start + i * (end - start) / (count - 1))) for i in range(count)})
    return ids


def make_config(
    target_config: Any,
    *,
    num_layers: int,
    block_size: int,
    mask_token_id: int,
    target_layer_ids: list[int],
    lineage: dict[str, Any],
    architecture: str = "dflash",
    dflash2: dict[str, int] | None = None,
    sliding_window: int | None = None,
    max_window_layers: int | None = None,
) -> Qwen3Config:
    """The drafter's config: the target's shapes, ``num_layers`` layers, the DFlash fields in z-lab's layout, and
    ``lineage`` (what its training data was made with, under ``draftline``: see :func:`lineage_of`).

    ``architecture`` ``dflash2`` adds ``dflash2``'s fields (:data:`DFLASH2_FIELDS`) and ``block_size`` to
    ``dflash_config``. ``sliding_window`` (tokens) makes layers ``max_window_layers`` and up sliding-window layers,
    written as Qwen3 configs need it (``use_sliding_window``, ``max_window_layers``, and ``layer_types`` spelt out)."""
    text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    n_target = int(text.num_hidden_layers)
    _check_target_layers(target_layer_ids, n_target)
    shared = {k: getattr(text, k) for k in _SHARED_FIELDS if getattr(text, k, None) is not None}
    shared.setdefault("head_dim", text.hidden_size // text.num_attention_heads)
    dflash_config = _dflash_config(architecture, block_size, mask_token_id, target_layer_ids, dflash2)
    window = _window(num_layers, sliding_window, max_window_layers)
    return Qwen3Config(
        **shared,
        **window,
        num_hidden_layers=num_layers,
        architectures=[ARCHITECTURES[architecture]],
        block_size=block_size,
        num_target_layers=n_target,
        dflash_config=dflash_config,
        tie_word_embeddings=False,
        use_cache=False,
        draftline=dict(lineage),
    )


def _check_target_layers(target_layer_ids: list[int], n_target: int) -> None:
    """Refuse target layers outside the target's ``n_target`` layers, or its last layer."""
    bad = [i for i in target_layer_ids if not 0 <= i < n_target]
    if bad:
        raise DrafterMismatch(f"target_layer_ids {bad} are outside the target's {n_target} layers")
    if n_target - 1 in target_layer_ids:
        # transformers reports the last layer's output after the final norm (hidden_states[L] is normed), and
        # servers capture raw layer outputs: the drafter would be served other features than it trained on.
        raise DrafterMismatch(
            f"target_layer_ids may not include the last layer ({n_target - 1}): use layers up to {n_target - 2}"
        )


def _dflash_config(
    architecture: str, block_size: int, mask_token_id: int, target_layer_ids: list[int], dflash2: dict[str, int] | None
) -> dict[str, Any]:
    """``dflash_config`` in z-lab's layout: the target layers and the mask token, and for DFlash 2 its sizes and the
    block size."""
    dflash_config: dict[str, Any] = {"target_layer_ids": list(target_layer_ids), "mask_token_id": int(mask_token_id)}
    if architecture == "dflash2":
        missing = [k for k in DFLASH2_FIELDS if k not in (dflash2 or {})]
        if missing:
            raise DrafterMismatch(f"a DFlash 2 drafter needs {missing}")
        dflash_config = {"block_size": int(block_size), **{k: int(dflash2[k]) for k in DFLASH2_FIELDS}, **dflash_config}
    elif architecture != "dflash":
        raise DrafterMismatch(f"unknown drafter architecture {architecture!r}: dflash or dflash2")
    return dflash_config


def _window(num_layers: int, sliding_window: int | None, max_window_layers: int | None) -> dict[str, Any]:
    """The sliding-window fields as Qwen3 configs need them (none without ``sliding_window``)."""
    if sliding_window is None:
        return {}
    first = num_layers if max_window_layers is None else int(max_window_layers)
    return {
        "use_sliding_window": True,
        "sliding_window": int(sliding_window),
        "max_window_layers": first,
        "layer_types": [SLIDING if i >= first else FULL for i in range(num_layers)],
    }


def lineage_of(config: Any) -> dict[str, Any]:
    """The training data's lineage a checkpoint records (tokenizer fingerprint, chat template, thinking mode,
    mask token); a checkpoint without one is refused, since nothing then says which target it fits."""
    lineage = getattr(config, "draftline", None)
    if not isinstance(lineage, dict) or "tokenizer_fingerprint" not in lineage:
        raise DrafterMismatch(
            "the drafter's config.json has no `draftline` lineage (tokenizer fingerprint, thinking "
            "mode): it was not trained by draftline's train stage; retrain it"
        )
    return lineage
