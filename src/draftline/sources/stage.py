"""The ``sources@<name>`` stage: read one dataset (a hub dataset or a local file/folder) and keep it as Parquet.

The output, ``data/raw/<name>/data.parquet``, is in the raw format of :mod:`draftline.core.raw`: the rows exactly
as the dataset published them. Unreadable lines are counted with ``file:line`` (or stop the stage with
``strict: true``); a source that yields no row is an error, never an empty success.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from draftline.core.errors import MissingInput, Refusal
from draftline.core.jsonl import iter_jsonl
from draftline.core.logs import get_logger
from draftline.core.raw import json_columns, rows_to_table, with_json_columns, write_raw
from draftline.core.runner import StageArgs, StageRun
from draftline.core.skips import Skips
from draftline.core.source_spec import SourceSpec, entry_name

log = get_logger(__name__)

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
# Enough broken lines in the metrics to find them by hand; the count is always complete.
MAX_REPORTED_BROKEN = 100


@dataclass
class _Loaded:
    table: pa.Table
    files: list[str]
    rows_read: int
    broken: list[dict[str, Any]]


# ---------------------------------------------------------------- readers


def _input_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise MissingInput(f"{path} does not exist; fix `path` in params.yaml: sources")
    files = sorted(
        p for p in path.rglob("*")
        if p.is_file() and p.suffix in JSON_SUFFIXES + PARQUET_SUFFIXES and not p.name.startswith(".")
    )
    if not files:
        raise MissingInput(f"{path} holds no {', '.join(JSON_SUFFIXES + PARQUET_SUFFIXES)} files")
    kinds = {p.suffix in PARQUET_SUFFIXES for p in files}
    if len(kinds) > 1:
        raise Refusal(f"{path} mixes Parquet and JSON files; point `path` at a folder of one kind")
    return files


def _iter_json_file(file: Path) -> Iterator[tuple[str, Any, str | None]]:
    """``(where, value, error)`` per row: JSON Lines, or a ``.json`` file holding one array of rows."""
    if file.suffix == ".json" and _first_char(file) == "[":
        try:
            with open(file, encoding="utf-8") as f:
                rows = json.load(f)
        except json.JSONDecodeError as e:
            # Unlike a JSONL line, a broken array loses every row: nothing to keep, so never skip it quietly.
            raise Refusal(f"{file}: invalid JSON array at line {e.lineno} column {e.colno}: {e.msg}") from e
        for i, row in enumerate(rows):
            yield f"{file}[{i}]", row, None
        return
    for lineno, row, error in iter_jsonl(file):
        yield f"{file}:{lineno}", row, error


def _first_char(file: Path) -> str:
    with open(file, encoding="utf-8", errors="replace") as f:
        while chunk := f.read(4096):
            if stripped := chunk.lstrip():
                return stripped[0]
    return ""


def _read_json_rows(label: str, files: list[Path], spec: SourceSpec, skips: Skips) -> _Loaded:
    rows: list[dict[str, Any]] = []
    broken: list[dict[str, Any]] = []
    read = 0
    with tqdm(desc=label, unit="rows", mininterval=2) as bar:
        for where, row, error in (r for file in files for r in _iter_json_file(file)):
            if spec.max_rows is not None and len(rows) >= spec.max_rows:
                break
            read += 1
            bar.update()
            if error is None and not isinstance(row, dict):
                error = f"row is a JSON {type(row).__name__}, not an object"
            if error is not None:
                reason = "invalid JSON" if error.startswith("invalid JSON") else "not an object"
                skips.add(reason, where, error)
                if len(broken) < MAX_REPORTED_BROKEN:
                    broken.append({"where": where, "error": error})
                continue
            rows.append(row)
    return _Loaded(rows_to_table(rows), [str(f) for f in files], read, broken)


def _read_parquet(files: list[Path], spec: SourceSpec) -> _Loaded:
    tables, left = [], spec.max_rows
    for file in files:
        if left is not None and left <= 0:
            break
        t = pq.read_table(file)
        if left is not None:
            t = t.slice(0, left)
            left -= t.num_rows
        tables.append(t)
    try:
        table = pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise Refusal(f"Parquet files under {spec.path} have incompatible schemas: {e}") from e
    return _Loaded(table, [str(f) for f in files], table.num_rows, [])


def _read_hf(label: str, spec: SourceSpec) -> _Loaded:
    """The hub path: ``datasets.load_dataset`` at a pinned revision (also works on a local dataset folder)."""
    import datasets

    if spec.streaming:
        # Streaming reads only the first max_rows rows instead of downloading every file of a huge dataset.
        ds = datasets.load_dataset(spec.hf, spec.config, revision=spec.revision, split=spec.split, streaming=True)
        if spec.max_rows is not None:
            ds = ds.take(spec.max_rows)
        rows = list(tqdm(ds, desc=label, unit="rows", mininterval=2))
        return _Loaded(rows_to_table(rows), [spec.origin], len(rows), [])
    split = spec.split if spec.max_rows is None else f"{spec.split}[:{spec.max_rows}]"
    ds = datasets.load_dataset(spec.hf, spec.config, revision=spec.revision, split=split)
    table = ds.with_format("arrow")[:]
    return _Loaded(with_json_columns(table, []), [spec.origin], table.num_rows, [])


def load_source(label: str, spec: SourceSpec, skips: Skips) -> _Loaded:
    if spec.hf is not None:
        return _read_hf(label, spec)
    files = _input_files(Path(spec.path))
    if files[0].suffix in PARQUET_SUFFIXES:
        return _read_parquet(files, spec)
    return _read_json_rows(label, files, spec, skips)


@dataclass(frozen=True, kw_only=True)
class SourceArgs(StageArgs):
    """``stages/sources.py``'s arguments (dvc.yaml passes them): the source's params entry (``agent``, or
    ``evaluate.sets.gsm8k``: :func:`~draftline.core.source_spec.load_source`), its raw folder."""

    source: str
    out: Path

    @property
    def label(self) -> str:
        return f"sources@{entry_name(self.source)}"


def run_source(spec: SourceSpec, args: SourceArgs, stage: StageRun) -> None:
    """Load source ``args.source`` into ``args.out/data.parquet``; a source that gives no row is refused."""
    stage.skips.strict = bool(spec.strict)
    loaded = load_source(args.label, spec, stage.skips)
    if loaded.table.num_rows == 0:
        raise MissingInput(f"{args.label} ({spec.origin}) gave no rows; check its path/split (and max_rows)")
    write_raw(loaded.table, args.out)
    stage.headline.update(rows=loaded.table.num_rows)
    stage.details.update(origin=spec.origin, adapter=spec.adapter, files=len(loaded.files), rows_read=loaded.rows_read,
                         rows_written=loaded.table.num_rows, broken=loaded.broken, columns=loaded.table.column_names,
                         json_columns=json_columns(loaded.table.schema))
    log.info("%s: %d rows written (%d read, %d broken) from %s", args.label, loaded.table.num_rows,
             loaded.rows_read, stage.skips.total, spec.origin)
