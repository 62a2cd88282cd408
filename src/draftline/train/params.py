"""``params.yaml: train``: the drafter, the objective, batches and memory, optimisation, running."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftline.core.params import Params, ParamsError

# Params that change how a run is watched or checked, not the weights it produces: left out of the state key.
NOT_IN_KEY = ("save_every", "log_every", "memory_limit_gb", "max_skip_share", "feature_cache_gb")


@dataclass(frozen=True)
class DFlash2Params(Params):
    """``params.yaml: train.dflash2``: DFlash 2's parts and the selector's loss (read when ``architecture:
    dflash2``)."""

    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int
    selector_loss_weight: float
    selector_warmup_ratio: float
    selector_labels: Literal["data", "target", "target_distribution"]
    selector_argmax_share: float
    gold_outside_top_k: Literal["drop", "insert"]
    selector_trains_drafter: bool

    def validate(self, where: str) -> None:
        if min(self.conv_kernel_size, self.conv_group_size, self.selector_rank) < 1 or self.selector_top_k < 2:
            raise ParamsError(f"params.yaml: {where}: conv_kernel_size, conv_group_size and selector_rank must be "
                              f">= 1 and selector_top_k >= 2")
        if self.selector_loss_weight < 0 or not 0 <= self.selector_warmup_ratio <= 1:
            raise ParamsError(f"params.yaml: {where}: selector_loss_weight must be >= 0 and selector_warmup_ratio in "
                              f"[0, 1]")
        if not 0 <= self.selector_argmax_share <= 1:
            raise ParamsError(f"params.yaml: {where}: selector_argmax_share must be in [0, 1]")
        if self.selector_argmax_share and self.selector_labels != "target_distribution":
            # the share mixes the argmax into the soft label; with any other label it would be silently ignored
            raise ParamsError(f"params.yaml: {where}: selector_argmax_share is read only with selector_labels: "
                              f"target_distribution (it is {self.selector_labels}); set it to 0")


@dataclass(frozen=True)
class LabelWeights(Params):
    """``params.yaml: train.labels``: the weight of each loss block position k learns token a + k by."""

    data: float
    target_argmax: float
    target_distribution: float

    def validate(self, where: str) -> None:
        weights = (self.data, self.target_argmax, self.target_distribution)
        if min(weights) < 0 or sum(weights) <= 0:
            raise ParamsError(f"params.yaml: {where}: the weights must be >= 0 and not all 0, got {weights}")

    @property
    def from_target(self) -> bool:
        """Whether a loss needs the target's own predictions (its last hidden state beside its features)."""
        return self.target_argmax > 0 or self.target_distribution > 0


@dataclass(frozen=True)
class TrainParams(Params):
    """``params.yaml: train`` (every key is documented there and in docs/train.md)."""

    architecture: Literal["dflash", "dflash2"]
    dflash2: DFlash2Params
    init_from: str | None
    drafter_layers: int
    target_layers: int | list[int]
    block_size: int
    sliding_window: int | None
    max_window_layers: int
    gamma: float
    labels: LabelWeights
    argmax_path: Literal["data", "on_greedy_path", "greedy"]
    anchors_per_seq: int
    anchor_sampling: Literal["per_row", "per_token"]
    max_length: int
    max_tokens_per_batch: int
    memory_limit_gb: float
    feature_cache_gb: float
    epochs: float
    max_steps: int
    lr: float
    min_lr_ratio: float
    warmup_ratio: float
    weight_decay: float
    adam_betas: list[float]
    grad_clip: float
    skip_nonfinite: int
    bf16: bool
    seed: int
    threads: int
    gpus: int
    save_every: int
    log_every: int
    strict: bool
    max_skip_share: float

    def validate(self, where: str) -> None:
        if self.block_size < 2 or self.drafter_layers < 1 or self.anchors_per_seq < 1:
            raise ParamsError(f"params.yaml: {where}: block_size must be >= 2, drafter_layers and anchors_per_seq >= 1")
        layers = self.target_layers if isinstance(self.target_layers, list) else [self.target_layers]
        if not layers or min(layers) < (0 if isinstance(self.target_layers, list) else 1):
            raise ParamsError(f"params.yaml: {where}.target_layers must be a count >= 1 or a non-empty list of layer "
                              f"ids >= 0, got {self.target_layers}")
        if self.sliding_window is not None and (self.sliding_window < 1 or not 0 <= self.max_window_layers
                                                < self.drafter_layers):
            raise ParamsError(f"params.yaml: {where}: sliding_window must be null or >= 1, and max_window_layers (the "
                              f"first sliding layer) in [0, drafter_layers), got {self.sliding_window} and "
                              f"{self.max_window_layers}")
        if self.max_tokens_per_batch < self.max_length:
            raise ParamsError(f"params.yaml: {where}.max_tokens_per_batch ({self.max_tokens_per_batch}) must be >= "
                              f"max_length ({self.max_length}): a longest row must fit a batch")
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ParamsError(f"params.yaml: {where}.adam_betas must be two numbers in [0, 1) (AdamW's beta1, beta2), "
                              f"got {self.adam_betas}")
        hard_selector = self.architecture == "dflash2" and self.dflash2.selector_labels == "target"
        if self.argmax_path != "data" and not (self.labels.target_argmax > 0 or hard_selector):
            # with no label from the target's argmax the choice would be silently ignored
            raise ParamsError(f"params.yaml: {where}.argmax_path is read only with labels.target_argmax > 0 or "
                              f"dflash2.selector_labels: target; set it to data")
        if self.feature_cache_gb < 0:
            raise ParamsError(f"params.yaml: {where}.feature_cache_gb must be >= 0 (0: features online), "
                              f"got {self.feature_cache_gb}")
        if self.save_every < 1 or self.log_every < 1 or (self.max_steps <= 0 and self.epochs <= 0):
            raise ParamsError(f"params.yaml: {where}: save_every and log_every must be >= 1, and max_steps or epochs > 0")


def load(_args: object = None) -> TrainParams:
    """``params.yaml: train`` (the stage's paths do not change its params)."""
    return TrainParams.load("train")
