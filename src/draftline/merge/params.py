"""The merge stage's params: ``params.yaml: merge``, loaded by :func:`load`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftline.core.params import Params, ParamsError


@dataclass(frozen=True)
class MergeParams(Params):
    """``params.yaml: merge`` (each key is documented there and in docs/merge.md)."""

    base: str | None
    base_tokenizer: str | None
    assume_same_tokenizer: bool
    check_rows: int
    check_min_match: float
    drop_columns: list[str]
    seed: int
    carry: Literal["auto", "reflink", "hardlink", "copy"]
    allow_other_target: bool

    def validate(self, where: str) -> None:
        if self.check_rows < 0 or not 0.0 <= self.check_min_match <= 1.0:
            raise ParamsError(f"params.yaml: {where}.check_rows must be >= 0 and {where}.check_min_match in [0, 1]")


def load(_args: object = None) -> MergeParams:
    return MergeParams.load("merge")
