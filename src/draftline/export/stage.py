"""The ``export`` stage: the merged set -> ``<out>/<format>/`` for each of ``export.formats``; ``gguf``: the drafter
(and a Hugging Face target) as llama.cpp serves them (:mod:`draftline.export.gguf`).

Off by default (``formats: []``: the folder then holds its manifest alone). The whole output folder is written
under a temporary name and renamed, so a half-written export is never taken for finished. The manifest
(``<out>/export.json``) lists the formats written and the lineage of the merged set they came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftline.core import dataset as fmt
from draftline.core.errors import MissingInput
from draftline.core.files import atomic_path, write_json
from draftline.core.logs import get_logger
from draftline.core.runner import StageArgs, StageRun
from draftline.export.formats import lineage, write_format
from draftline.export.gguf import write_gguf
from draftline.export.params import ExportParams

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class ExportArgs(StageArgs):
    """``stages/export.py``'s paths (dvc.yaml passes them): the merge stage's folder, the drafter and the target
    (``gguf``), the export folder written and the headline metrics."""

    merged: Path
    checkpoint: Path
    target: Path  # the target's target.json
    out: Path
    metrics: Path


def run_export(p: ExportParams, args: ExportArgs, stage: StageRun) -> None:
    """Write every requested format and the manifest; the report is the manifest."""
    if not (Path(args.merged) / fmt.META_FILE).is_file():
        raise MissingInput(f"{Path(args.merged) / fmt.META_FILE} is missing: {args.merged} is not a merged training "
                           "set; run the merge stage first (dvc repro merge)")
    meta, _ = fmt.verified_shard_files(args.merged)  # a draftline dataset (its draftline.json was found above)
    manifest = {"formats": list(p.formats), "source": lineage(meta, "draftline")}
    with atomic_path(args.out) as tmp:
        tmp.mkdir(parents=True)
        for name in p.formats:
            if name == "gguf":
                manifest["gguf"] = write_gguf(args.checkpoint, args.target, p.gguf, tmp / name)
                log.info("export: gguf written (drafter %s)", manifest["gguf"]["drafter"]["type"])
                continue
            write_format(name, args.merged, meta, tmp / name)
            log.info("export: %s written (%d rows, %d tokens)", name, meta.num_rows, meta.num_tokens)
        write_json(Path(tmp) / fmt.EXPORT_FILE, manifest)
    if not p.formats:
        log.info("export: no format requested (export.formats is empty)")
    stage.details.update(manifest)
    stage.headline.update(rows=meta.num_rows if set(p.formats) - {"gguf"} else 0, formats=len(p.formats))
