"""Reading ``params.yaml``: each stage reads only the sections it declares in ``dvc.yaml``."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import yaml

PARAMS_FILE = Path(os.environ.get("DRAFTLINE_PARAMS", "params.yaml"))


def load_params(*sections: str, path: str | os.PathLike = PARAMS_FILE) -> dict[str, Any]:
    """Return ``{section: value}`` for the named top-level sections; a missing one is a clear error."""
    with open(path, encoding="utf-8") as f:
        params = yaml.safe_load(f) or {}
    missing = [s for s in sections if s not in params]
    if missing:
        raise KeyError(f"{path} has no section(s) {missing}; add them (see the README's params reference)")
    return {s: params[s] for s in sections}


def check_keys(values: dict[str, Any], cls: type, where: str, exclude: tuple[str, ...] = ()) -> None:
    """Refuse a params section with a key that ``cls`` (a dataclass) does not know.

    A misspelt key would otherwise be ignored and its default silently used: name it, and the keys that exist.
    ``exclude`` names fields that are not set from this section (filled from elsewhere).
    """
    known = {f.name for f in dataclasses.fields(cls)} - set(exclude)
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"params.yaml: {where} has unknown key(s) {unknown}; known: {sorted(known)}")
