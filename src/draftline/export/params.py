"""The export stage's params: ``params.yaml: export``, loaded by :func:`load`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftline.core.params import Params, ParamsError

GgufType = Literal["f32", "f16", "bf16", "q8_0"]


@dataclass(frozen=True)
class GgufTypes(Params):
    """``export.gguf``: the types the drafter and (a Hugging Face target) the target are written in."""

    drafter: GgufType
    target: GgufType


@dataclass(frozen=True)
class ExportParams(Params):
    """``params.yaml: export``."""

    formats: list[Literal["specforge", "speculators", "hf", "gguf"]]
    gguf: GgufTypes

    def validate(self, where: str) -> None:
        if len(set(self.formats)) != len(self.formats):
            raise ParamsError(f"params.yaml: {where}.formats lists a format twice: {self.formats}")


def load(_args: object = None) -> ExportParams:
    return ExportParams.load("export")
