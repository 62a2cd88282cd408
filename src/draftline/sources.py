"""The ``sources`` stage: read one dataset (a hub dataset or a local file/folder) and keep it as Parquet.

Every later stage reads ``data/raw/<name>/`` through :func:`read_raw`, never the original files, so the
prompt adapters see exactly the rows the dataset published, whatever their shape.

Real data has columns with no single Arrow type (a chat ``content`` that is a string in one row and a list of
parts in the next; a request body that is an object here and ``null`` beside its raw text there). Such a column
is stored as JSON text, one value per cell, and its name is recorded in the Parquet schema metadata
(``draftline`` key, ``json_columns``); :func:`read_raw` decodes it, so readers get the original Python values.
A column is stored natively only when Arrow gives back exactly the values it was given, so nothing is ever
silently widened (an int turned float) or padded (a missing key turned ``None``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from draftline.files import atomic_path, iter_jsonl, write_json
from draftline.logs import get_logger
from draftline.params import check_keys
from draftline.skips import Skips

log = get_logger(__name__)

RAW_FILE = "data.parquet"
META_KEY = b"draftline"
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
# Small row groups let read_raw stream a large source without holding it all in memory.
ROW_GROUP_SIZE = 10_000
# Enough broken lines in the metrics to find them by hand; the count is always complete.
MAX_REPORTED_BROKEN = 100


@dataclass(frozen=True)
class SourceSpec:
    """One entry of ``params.yaml: sources``. Exactly one of ``hf`` and ``path`` is set."""

    name: str
    adapter: str
    hf: str | None = None
    revision: str | None = None
    config: str | None = None
    split: str = "train"
    streaming: bool = False
    path: str | None = None
    max_rows: int | None = None
    strict: bool = False

    @classmethod
    def from_params(cls, name: str, params: dict[str, Any]) -> "SourceSpec":
        check_keys(params, cls, f"sources.{name}", exclude=("name",))
        if "adapter" not in params:
            raise ValueError(f"sources.{name}: set `adapter` (how the prompt stage reads its rows)")
        if (params.get("hf") is None) == (params.get("path") is None):
            raise ValueError(f"sources.{name}: set exactly one of `hf: <dataset id>` and `path: <file or folder>`")
        if params.get("hf") is not None and not params.get("revision"):
            raise ValueError(
                f"sources.{name}: a hub source needs `revision` (a commit sha of {params['hf']}), "
                "otherwise the data can change while DVC thinks nothing did"
            )
        max_rows = params.get("max_rows")
        if max_rows is not None and (not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows < 1):
            raise ValueError(f"sources.{name}: max_rows must be a positive integer or null, not {max_rows!r}")
        return cls(name=name, **params)

    @property
    def origin(self) -> str:
        if self.hf is not None:
            return f"hf:{self.hf}@{self.revision}" + (f"/{self.config}" if self.config else "") + f":{self.split}"
        return f"path:{self.path}"


@dataclass
class _Loaded:
    table: pa.Table
    files: list[str]
    rows_read: int
    broken: list[dict[str, Any]]


# ---------------------------------------------------------------- rows -> Arrow, with JSON text where needed


def _canonical(value: Any) -> str:
    # sort_keys: key order carries no meaning; allow_nan: a NaN that Python parsed from the source stays a NaN.
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _has_empty_struct(t: pa.DataType) -> bool:
    # Parquet cannot store a struct with no fields (an always-empty object): keep those as JSON text.
    if pa.types.is_struct(t):
        return t.num_fields == 0 or any(_has_empty_struct(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_empty_struct(t.value_type)
    return False


def _native_array(values: list[Any]) -> pa.Array | pa.ChunkedArray | None:
    """Arrow's inferred array for ``values`` if it gives back exactly ``values``; None otherwise."""
    try:
        arr = pa.array(values)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return None
    if _has_empty_struct(arr.type):
        return None
    for original, back in zip(values, arr.to_pylist()):
        if original is not back and _canonical(original) != _canonical(back):
            return None
    return arr


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Columns are the union of the rows' keys in first-seen order; a key a row lacks reads back as None."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    arrays, json_columns = [], []
    for name in names:
        values = [row.get(name) for row in rows]
        arr = _native_array(values)
        if arr is None:
            arr = pa.array([None if v is None else _json_text(v) for v in values], pa.string())
            json_columns.append(name)
        arrays.append(arr)
    table = pa.table(arrays, names=list(names)) if names else pa.table({})
    return _with_json_columns(table, json_columns)


def _with_json_columns(table: pa.Table, json_columns: list[str]) -> pa.Table:
    meta = dict(table.schema.metadata or {})
    meta[META_KEY] = json.dumps({"json_columns": json_columns}).encode()
    return table.replace_schema_metadata(meta)


def json_columns(schema: pa.Schema) -> list[str]:
    """Names of the columns stored as JSON text (see the module docstring)."""
    meta = (schema.metadata or {}).get(META_KEY)
    return json.loads(meta)["json_columns"] if meta else []


# ---------------------------------------------------------------- readers


def _input_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist; fix `path` in params.yaml: sources")
    files = sorted(
        p for p in path.rglob("*")
        if p.is_file() and p.suffix in JSON_SUFFIXES + PARQUET_SUFFIXES and not p.name.startswith(".")
    )
    if not files:
        raise FileNotFoundError(f"{path} holds no {', '.join(JSON_SUFFIXES + PARQUET_SUFFIXES)} files")
    kinds = {p.suffix in PARQUET_SUFFIXES for p in files}
    if len(kinds) > 1:
        raise ValueError(f"{path} mixes Parquet and JSON files; point `path` at a folder of one kind")
    return files


def _iter_json_file(file: Path) -> Iterator[tuple[str, Any, str | None]]:
    """``(where, value, error)`` per row: JSON Lines, or a ``.json`` file holding one array of rows."""
    if file.suffix == ".json" and _first_char(file) == "[":
        try:
            with open(file, encoding="utf-8") as f:
                rows = json.load(f)
        except json.JSONDecodeError as e:
            # Unlike a JSONL line, a broken array loses every row: nothing to keep, so never skip it quietly.
            raise ValueError(f"{file}: invalid JSON array at line {e.lineno} column {e.colno}: {e.msg}") from e
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


def _read_json_rows(files: list[Path], spec: SourceSpec, skips: Skips) -> _Loaded:
    rows: list[dict[str, Any]] = []
    broken: list[dict[str, Any]] = []
    read = 0
    with tqdm(desc=f"sources@{spec.name}", unit="rows", mininterval=2) as bar:
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
        raise ValueError(f"Parquet files under {spec.path} have incompatible schemas: {e}") from e
    return _Loaded(table, [str(f) for f in files], table.num_rows, [])


def _read_hf(spec: SourceSpec) -> _Loaded:
    """The hub path: ``datasets.load_dataset`` at a pinned revision (also works on a local dataset folder)."""
    import datasets

    if spec.streaming:
        # Streaming reads only the first max_rows rows instead of downloading every file of a huge dataset.
        ds = datasets.load_dataset(spec.hf, spec.config, revision=spec.revision, split=spec.split, streaming=True)
        if spec.max_rows is not None:
            ds = ds.take(spec.max_rows)
        rows = list(tqdm(ds, desc=f"sources@{spec.name}", unit="rows", mininterval=2))
        return _Loaded(rows_to_table(rows), [spec.origin], len(rows), [])
    split = spec.split if spec.max_rows is None else f"{spec.split}[:{spec.max_rows}]"
    ds = datasets.load_dataset(spec.hf, spec.config, revision=spec.revision, split=split)
    table = ds.with_format("arrow")[:]
    return _Loaded(_with_json_columns(table, []), [spec.origin], table.num_rows, [])


def load_source(spec: SourceSpec, skips: Skips) -> _Loaded:
    if spec.hf is not None:
        return _read_hf(spec)
    files = _input_files(Path(spec.path))
    if files[0].suffix in PARQUET_SUFFIXES:
        return _read_parquet(files, spec)
    return _read_json_rows(files, spec, skips)


# ---------------------------------------------------------------- output and the reader every later stage uses


def write_raw(table: pa.Table, out_dir: str | os.PathLike) -> Path:
    """Write ``out_dir/data.parquet`` atomically (the whole folder appears at once, or not at all)."""
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        pq.write_table(table, tmp / RAW_FILE, row_group_size=ROW_GROUP_SIZE, compression="zstd")
    return Path(out_dir) / RAW_FILE


def read_raw(
    raw_dir: str | os.PathLike, columns: Iterable[str] | None = None, batch_size: int = 1024
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(row_index, row)`` for each row of ``data/raw/<name>/``, values as the dataset gave them.

    ``row_index`` counts from 0 in stored order (stable for given params), JSON-text columns come back decoded,
    and a top-level key that a row lacked comes back as None. Streams one batch at a time.
    """
    pf = pq.ParquetFile(Path(raw_dir) / RAW_FILE)
    decode = set(json_columns(pf.schema_arrow))
    cols = list(columns) if columns is not None else None
    index = 0
    for batch in pf.iter_batches(batch_size=batch_size, columns=cols):
        for row in batch.to_pylist():
            for name in decode.intersection(row):
                if row[name] is not None:
                    row[name] = json.loads(row[name])
            yield index, row
            index += 1


def run_source(
    name: str,
    params: dict[str, Any],
    raw_root: str | os.PathLike = "data/raw",
    metrics_root: str | os.PathLike = "metrics/sources",
) -> dict[str, Any]:
    """Load source ``name``, write ``raw_root/<name>/data.parquet`` and ``metrics_root/<name>.json``."""
    spec = SourceSpec.from_params(name, params)
    skips = Skips(get_logger(f"sources.{name}"), strict=spec.strict)
    loaded = load_source(spec, skips)
    if loaded.table.num_rows == 0:
        raise ValueError(f"sources.{name} ({spec.origin}) gave no rows; check its path/split (and max_rows)")
    write_raw(loaded.table, Path(raw_root) / name)
    metrics = {
        "origin": spec.origin,
        "adapter": spec.adapter,
        "files": len(loaded.files),
        "rows_read": loaded.rows_read,
        "rows_written": loaded.table.num_rows,
        "broken_rows": skips.total,
        "skipped": skips.as_dict(),
        "broken": loaded.broken,
        "columns": loaded.table.column_names,
        "json_columns": json_columns(loaded.table.schema),
    }
    write_json(Path(metrics_root) / f"{name}.json", metrics)
    log.info(
        "sources@%s: %d rows written (%d read, %d broken) from %s",
        name, metrics["rows_written"], metrics["rows_read"], metrics["broken_rows"], spec.origin,
    )
    return metrics
