"""The ``export`` stage: ``data/merged`` -> ``data/export/<format>/`` for each of ``export.formats``.

Off by default (``formats: []``: the folder then holds its manifest alone). The whole of ``data/export`` is written
under a temporary name and renamed, so a half-written export is never taken for finished. The manifest
(``data/export/export.json``) lists the formats written and the lineage of the merged set they came from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from draftline.core import dataset as fmt
from draftline.core.files import atomic_path, write_json
from draftline.core.logs import get_logger
from draftline.core.params import Params, ParamsError
from draftline.export.formats import lineage, write_format

log = get_logger(__name__)


@dataclass(frozen=True)
class ExportParams(Params):
    """``params.yaml: export``."""

    formats: list[Literal["specforge", "speculators", "hf"]]

    def validate(self, where: str) -> None:
        if len(set(self.formats)) != len(self.formats):
            raise ParamsError(f"params.yaml: {where}.formats lists a format twice: {self.formats}")


def run_export(params: ExportParams, merged_dir: str | os.PathLike = "data/merged",
               out_dir: str | os.PathLike = "data/export") -> dict[str, Any]:
    """Write every requested format; returns the manifest."""
    meta = fmt.read_meta(merged_dir)
    fmt.verify_shards(merged_dir, meta)
    manifest = {"formats": list(params.formats), "source": lineage(meta, "draftline")}
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        for name in params.formats:
            write_format(name, merged_dir, meta, tmp / name)
            log.info("export: %s written (%d rows, %d tokens)", name, meta.num_rows, meta.num_tokens)
        write_json(Path(tmp) / fmt.EXPORT_FILE, manifest)
    if not params.formats:
        log.info("export: no format requested (export.formats is empty)")
    return manifest
