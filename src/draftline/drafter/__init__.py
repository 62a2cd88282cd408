"""The DFlash drafter: model, training data, memory planning, checkpoints, training and evaluation."""

from draftline.drafter.model import DFlashDrafter, DraftCache, target_features

__all__ = ["DFlashDrafter", "DraftCache", "target_features"]
