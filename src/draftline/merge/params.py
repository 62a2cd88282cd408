"""The merge stage's params: ``params.yaml: merge``, with ``decontaminate`` and the names of ``evaluate.sets`` (the
base's rows are checked against their prompts), loaded together by :func:`load`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from draftline.core.contamination import DecontaminateParams
from draftline.core.params import Params, ParamsError, load_value, optional


@dataclass(frozen=True)
class MergeParams(Params):
    """``params.yaml: merge`` (each key is documented there and in docs/merge.md); ``decontaminate`` and ``sets``
    come from their own sections (:func:`load`; None: the base is not checked)."""

    base: str | None
    base_tokenizer: str | None
    assume_same_tokenizer: bool
    check_rows: int
    check_min_match: float
    drop_columns: list[str]
    seed: int
    carry: Literal["auto", "reflink", "hardlink", "copy"]
    allow_other_target: bool
    decontaminate: DecontaminateParams | None = optional()
    sets: list[str] | None = optional()

    def validate(self, where: str) -> None:
        if self.check_rows < 0 or not 0.0 <= self.check_min_match <= 1.0:
            raise ParamsError(f"params.yaml: {where}.check_rows must be >= 0 and {where}.check_min_match in [0, 1]")


def load(_args: object = None) -> MergeParams:
    return dataclasses.replace(MergeParams.load("merge"), decontaminate=DecontaminateParams.load("decontaminate"),
                               sets=list(load_value("evaluate.sets", dict[str, Any]) or {}))
