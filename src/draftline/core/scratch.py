"""Resumable scratch: where a stage keeps progress that must outlive the stage's own outputs.

DVC deletes a stage's outputs before it runs it, so the generation journal and the training states live in an
ignored folder instead, ``<root>/<stage>/<key>/``, where ``key`` hashes everything that decides the result:

- a run with other inputs never resumes from another's progress, and the same run always finds its own;
- ``<root>`` is ``$DRAFTLINE_CACHE`` (shared storage, for several nodes), else ``<repo>/.draftline/cache``;
- ``dvc exp run --temp`` and queued experiments run in a throwaway copy under ``<repo>/.dvc/tmp/exps/``; the
  scratch must outlive that copy, so a path inside it resolves to the repository that holds it;
- ``key.json`` beside the progress records what the key was made of, for a human looking.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from draftline.core.files import write_json

KEY_FILE = "key.json"


def cache_root(start: str | os.PathLike | None = None) -> Path:
    """``$DRAFTLINE_CACHE``, else ``<repo>/.draftline/cache`` for the git repository above ``start`` (the cwd)."""
    if env := os.environ.get("DRAFTLINE_CACHE"):
        return Path(env).resolve()
    here = Path(start or os.getcwd()).resolve()
    parts = here.parts
    for i in range(len(parts) - 3):
        if parts[i : i + 3] == (".dvc", "tmp", "exps"):
            return Path(*parts[:i]) / ".draftline" / "cache"
    for d in (here, *here.parents):
        if (d / ".git").exists():
            return d / ".draftline" / "cache"
    return here / ".draftline" / "cache"


def scratch_key(decides: dict[str, Any]) -> str:
    """A short stable hash of what decides a result (canonical JSON: key order never matters)."""
    canonical = json.dumps(decides, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def scratch_dir(stage: str, decides: dict[str, Any], root: str | os.PathLike | None = None) -> Path:
    """``<root>/<stage>/<key>/``, created, with ``key.json`` recording ``decides``."""
    folder = Path(root or cache_root()) / stage / scratch_key(decides)
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / KEY_FILE).is_file():
        write_json(folder / KEY_FILE, json.loads(json.dumps(decides, default=str)))
    return folder
