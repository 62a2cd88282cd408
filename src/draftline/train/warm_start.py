"""The warm start (``train.init_from``): a new drafter takes the weights of a drafter checkpoint before step 1.

Invariants: nothing is loaded into the drafter unless the checkpoint fits it (and so the target it was built for) in
every field that says what its weights mean (hidden size, vocabulary, mask token, block size, target layers, number of
layers, its training data's tokenizer fingerprint where it records one) and in every shared tensor's shape; a misfit
raises :class:`DrafterMismatch` naming the field and both values. DFlash 1 -> DFlash 2 leaves the convolutions and
the selector at their identity / zero start, so the drafter drafts what the checkpoint drafts; DFlash 2 -> DFlash 1
is refused (it would drop the selector). The optimiser and the schedule are not part of it: they start fresh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftline.drafter.checkpoint import read_config, read_weights
from draftline.drafter.config import DrafterMismatch, lineage_of
from draftline.drafter.model import DFlashDrafter
from draftline.drafter.modeling_dflash import dflash_value, is_dflash2

# Parts a DFlash 2 drafter has and a DFlash 1 drafter lacks: a warm start leaves them at their identity / zero start.
DFLASH2_ONLY = (".attention_conv.", ".mlp_conv.", "candidate_selector.")


def warm_start(drafter: DFlashDrafter, path: str | Path) -> dict[str, Any]:
    """Load the weights of the drafter checkpoint in ``path`` (draftline's or z-lab's layout) into ``drafter``, once
    :func:`check_fit` passes. Returns what was loaded (for the report)."""
    path = Path(path)
    source = read_config(path)
    check_fit(source, drafter, path)
    state = read_weights(path)
    own = drafter.state_dict()
    unexpected = sorted(set(state) - set(own))
    missing = sorted(
        k
        for k in set(own) - set(state)
        if not (is_dflash2(drafter.config) and not is_dflash2(source) and any(p in k for p in DFLASH2_ONLY))
    )
    if unexpected or missing:
        raise DrafterMismatch(
            f"the drafter in {path} does not fit this one: tensors it lacks {missing[:5]}, tensors "
            f"it has that this one does not {unexpected[:5]}"
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise DrafterMismatch(
                f"the drafter in {path} has {name} of shape {tuple(tensor.shape)}, this run needs "
                f"{tuple(own[name].shape)} (intermediate_size, heads or DFlash 2 sizes differ)"
            )
    dtype = drafter.fc.weight.dtype
    drafter.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    return {
        "from": str(path),
        "architecture": "dflash2" if is_dflash2(source) else "dflash",
        "tensors_loaded": len(state),
        "tensors_at_their_start": len(set(own) - set(state)),
    }


def check_fit(source: Any, drafter: DFlashDrafter, path: Path) -> None:
    """Refuse the checkpoint config ``source`` (read from ``path``) for ``drafter`` where a field differs, where it
    records no mask token, or where it is DFlash 2 and ``drafter`` DFlash 1."""
    mine = drafter.config
    if dflash_value(source, "mask_token_id") is None:
        raise DrafterMismatch(
            f"the drafter in {path} records no mask_token_id (dflash_config): nothing says which "
            "target it was trained for"
        )
    checks = {
        "hidden_size": (source.hidden_size, mine.hidden_size),
        "vocab_size": (source.vocab_size, mine.vocab_size),
        "mask_token_id": (int(dflash_value(source, "mask_token_id")), drafter.mask_token_id),
        "block_size": (getattr(source, "block_size", None), drafter.block_size),
        "target_layer_ids": (
            [int(i) for i in dflash_value(source, "target_layer_ids")],
            list(drafter.target_layer_ids),
        ),
        "num_hidden_layers": (source.num_hidden_layers, mine.num_hidden_layers),
    }
    # A draftline drafter records its training data's tokenizer: one of another target with the same shapes (another
    # embedded seed) must not pass. A released z-lab drafter records none; its shapes are all there is to check.
    theirs = getattr(source, "draftline", None)
    if isinstance(theirs, dict) and "tokenizer_fingerprint" in theirs:
        checks["tokenizer_fingerprint"] = (theirs["tokenizer_fingerprint"], lineage_of(mine)["tokenizer_fingerprint"])
    for name, (theirs, ours) in checks.items():
        if theirs != ours:
            raise DrafterMismatch(f"the drafter in {path} has {name} {theirs}, this run needs {ours}")
    if is_dflash2(source) and not is_dflash2(mine):
        raise DrafterMismatch(f"the drafter in {path} is DFlash 2: start a dflash2 drafter from it, not a DFlash 1")
