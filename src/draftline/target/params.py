"""The target stage's params: ``target`` of params.yaml, ``target.embedded`` (the size and training budget of
the embedded target) and ``target.gguf_dtype`` (the dtype a GGUF target is converted to). No torch import here: a
real checkpoint's run never loads the build."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftline.core.params import Params, ParamsError, optional
from draftline.core.threads import check_workers


@dataclass(frozen=True)
class EmbeddedParams(Params):
    """``target.embedded``; params.yaml says what each key does."""

    vocab_size: int
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    max_position_embeddings: int
    max_len: int
    batch_tokens: int
    parts: int
    source_weights: dict[str, float]
    steps: int
    lr: float
    warmup_steps: int
    min_lr_ratio: float
    weight_decay: float
    adam_betas: list[float]
    grad_clip: float
    threads: int
    workers: int | Literal["auto"]
    held_out: int
    greedy_tokens: int

    def validate(self, where: str) -> None:
        if self.batch_tokens < self.max_len:
            raise ParamsError(f"params.yaml: {where}.batch_tokens ({self.batch_tokens}) must be >= max_len "
                              f"({self.max_len}): the longest example must fit a batch")
        if any(w < 0 for w in self.source_weights.values()):
            raise ParamsError(f"params.yaml: {where}.source_weights maps source names to weights >= 0")
        if self.num_layers < 4:
            raise ParamsError(f"params.yaml: {where}.num_layers must be >= 4: the drafter taps several target layers")
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ParamsError(f"params.yaml: {where}.adam_betas must be two numbers in [0, 1), not {self.adam_betas}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ParamsError(f"params.yaml: {where}: hidden_size must divide by num_heads, num_heads by num_kv_heads")
        if self.parts < 1:
            raise ParamsError(f"params.yaml: {where}.parts must be >= 1")
        check_workers(self.threads, self.workers, where)


@dataclass(frozen=True)
class TargetParams(Params):
    """``params.yaml: target`` (documented there and in docs/target.md)."""

    path: str
    mask_token_id: int | None
    hash_weights: bool
    seed: int
    # Read only for the embedded target: a real checkpoint's params.yaml may leave it out.
    embedded: EmbeddedParams | None = optional()
    # Read only for a GGUF target (the dtype its weights are dequantized to): other targets may leave it out.
    gguf_dtype: Literal["float32", "bfloat16", "float16"] | None = optional()


def load(_args=None) -> TargetParams:
    return TargetParams.load("target")
