"""The drafter (and a Hugging Face target) as GGUF files, what llama.cpp serves: ``export.formats: [gguf]``.

``drafter.gguf`` is the train stage's checkpoint converted by the pinned llama.cpp's own converter with the target's
folder beside it (:mod:`draftline.core.gguf`); ``target.gguf`` the target's folder, written only where the target is
not already a GGUF file (a GGUF target is served from its own file, which the manifest names with its sha256).
Serve them as ``llama-server -m target.gguf --model-draft drafter.gguf --spec-type draft-dflash
--spec-draft-n-max <block_size - 1>`` (the serve stage does).

Invariants: a drafter whose training data was made with another tokenizer than the target's is refused before
anything is converted; ``export.json`` records what each file was made from (the drafter's lineage and weights'
sha256, the target's fingerprints, the llama.cpp version and the types), so a consumer can check that the two
belong together and that a file is what was written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftline.core.dataset import EXPORT_FILE
from draftline.core.files import write_json
from draftline.core.fingerprint import sha256_file
from draftline.core.gguf import convert
from draftline.core.llama_cpp import VERSION
from draftline.core.target_loader import load_target, source_gguf
from draftline.drafter.checkpoint import WEIGHTS_FILE
from draftline.drafter.fit import check_lineage
from draftline.export.params import GgufTypes

DRAFTER_FILE = "drafter.gguf"
TARGET_FILE = "target.gguf"


def _file(path: Path, outtype: str) -> dict[str, Any]:
    return {"file": path.name, "type": outtype, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def write_gguf(checkpoint: Path, target_json: Path, types: GgufTypes, out: Path) -> dict[str, Any]:
    """Write ``drafter.gguf`` (and ``target.gguf`` for a Hugging Face target) into the new folder ``out``; return
    the manifest (also written as its ``export.json``)."""
    info = load_target(target_json)
    lineage = check_lineage(checkpoint, info)
    out.mkdir(parents=True)
    drafter = convert(checkpoint, out / DRAFTER_FILE, types.drafter, target_dir=info.path)
    config = json.loads((checkpoint / "config.json").read_text())
    manifest: dict[str, Any] = {
        "format": "gguf", "producer": "draftline", "llama_cpp": VERSION,
        "drafter": {**_file(drafter, types.drafter), "architecture": config["architectures"][0],
                    "block_size": config.get("block_size", config.get("dflash_config", {}).get("block_size")),
                    "lineage": lineage, "checkpoint_sha256": sha256_file(checkpoint / WEIGHTS_FILE)},
        "target": {"model_fingerprint": info.model_fingerprint, "tokenizer_fingerprint": info.tokenizer_fingerprint},
    }
    own = source_gguf(target_json)
    if own is None:
        manifest["target"].update(_file(convert(info.path, out / TARGET_FILE, types.target), types.target))
    else:
        manifest["target"].update(file=own.name, sha256=sha256_file(own), bytes=own.stat().st_size,
                                  served_from="target.path (a GGUF target is served from its own file)")
    write_json(out / EXPORT_FILE, manifest)
    return manifest
