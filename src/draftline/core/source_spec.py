"""One entry of ``params.yaml: sources``: where a dataset comes from and which adapter reads its rows.

Shared by the ``sources@<name>`` stage (which reads the dataset) and the ``conversations@<name>`` stage (which
adapts its rows); each depends on ``sources.<name>`` alone, so changing one source reruns that source's stages
only. The benchmark sets of ``evaluate.sets`` are entries of the same kind, read by the same two stages. Exactly one of ``path`` and ``hf`` is set; a hub source is pinned to a ``revision`` and names its ``split``.
Keys left out read as null (see each field).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftline.core.params import PARAMS_FILE, Params, ParamsError, load_section, optional


@dataclass(frozen=True)
class SourceSpec(Params):
    """``sources.<name>``; params.yaml documents every key."""

    adapter: str
    path: str | None = optional()
    hf: str | None = optional()
    revision: str | None = optional()
    config: str | None = optional()  # null: the dataset's default config
    split: str | None = optional()
    streaming: bool | None = optional()  # null: false
    max_rows: int | None = optional()  # null: every row
    strict: bool | None = optional()  # null: false (count and skip unreadable lines)
    options: dict[str, Any] | None = optional()  # null: the adapter preset's own options

    def validate(self, where: str) -> None:
        if (self.hf is None) == (self.path is None):
            raise ParamsError(f"params.yaml: {where}: set exactly one of `hf: <dataset id>` and `path: <file or folder>`")
        if self.hf is not None and not (self.revision and self.split):
            raise ParamsError(
                f"params.yaml: {where}: a hub source needs `revision` (a commit sha of {self.hf}: otherwise the data "
                "can change while DVC thinks nothing did) and `split`"
            )
        if self.max_rows is not None and self.max_rows < 1:
            raise ParamsError(f"params.yaml: {where}.max_rows must be a positive integer or null, not {self.max_rows}")

    @property
    def origin(self) -> str:
        if self.hf is not None:
            return f"hf:{self.hf}@{self.revision}" + (f"/{self.config}" if self.config else "") + f":{self.split}"
        return f"path:{self.path}"


def load_source(entry: str, path=PARAMS_FILE) -> SourceSpec:
    """The source entry ``entry`` of params.yaml, parsed: ``<name>`` or ``sources.<name>`` (a training source), or
    ``evaluate.sets.<name>`` (a benchmark set, read and adapted by the same two stages). An entry that is not there
    is an error listing the ones that are."""
    keys = entry.split(".") if "." in entry else ["sources", entry]
    section = load_section(keys[0], path)
    for i, key in enumerate(keys[1:-1], start=1):
        section = section.get(key) if isinstance(section, dict) else None
        if not isinstance(section, dict):
            raise ParamsError(f"params.yaml has no mapping {'.'.join(keys[: i + 1])}")
    where, name = ".".join(keys[:-1]), keys[-1]
    if name not in section:
        raise ParamsError(f"params.yaml: {where} has no entry {name!r}; it has {sorted(section)}")
    return SourceSpec.parse(section[name], f"{where}.{name}")


def entry_name(entry: str) -> str:
    """The source's name in records and logs: the last key of its entry."""
    return entry.rsplit(".", 1)[-1]
