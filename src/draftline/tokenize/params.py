"""The tokenize stage's params: ``params.yaml: tokenize``, loaded by :func:`load`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from draftline.core.params import Params, ParamsError


@dataclass(frozen=True)
class TokenizeParams(Params):
    """``params.yaml: tokenize`` (each key is documented there and in docs/tokenize.md)."""

    turns: Literal["last", "all"]
    max_len: int
    overflow: Literal["drop", "truncate"]
    max_skip_share: float
    workers: int
    chunk_rows: int
    max_shard_mb: int
    strict: bool

    def validate(self, where: str) -> None:
        if not 0.0 <= self.max_skip_share <= 1.0:
            raise ParamsError(f"params.yaml: {where}.max_skip_share must be in [0, 1], got {self.max_skip_share}")
        if self.max_len < 2 or self.chunk_rows < 1 or self.max_shard_mb < 1 or self.workers < 0:
            raise ParamsError(f"params.yaml: {where}: max_len must be >= 2, chunk_rows and max_shard_mb >= 1, "
                              "workers >= 0 (0 = all cores)")

    @property
    def num_workers(self) -> int:
        return self.workers or os.cpu_count() or 1


def load(_args: object = None) -> TokenizeParams:
    return TokenizeParams.load("tokenize")
