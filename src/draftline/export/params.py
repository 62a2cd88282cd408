"""The export stage's params: ``params.yaml: export``, loaded by :func:`load`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftline.core.params import Params, ParamsError


@dataclass(frozen=True)
class ExportParams(Params):
    """``params.yaml: export``."""

    formats: list[Literal["specforge", "speculators", "hf"]]

    def validate(self, where: str) -> None:
        if len(set(self.formats)) != len(self.formats):
            raise ParamsError(f"params.yaml: {where}.formats lists a format twice: {self.formats}")


def load(_args: object = None) -> ExportParams:
    return ExportParams.load("export")
