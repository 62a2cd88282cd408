"""The raw format: one source's rows as Parquet (``data/raw/<name>/data.parquet``), values exactly as published.

Written by the ``sources`` stage (:func:`rows_to_table`, :func:`write_raw`); read by the ``conversations`` stage
(:func:`read_raw`), never the original files, so the adapters see exactly the rows the dataset published.

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
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from draftline.core.files import atomic_path

RAW_FILE = "data.parquet"
META_KEY = b"draftline"
# Small row groups let read_raw stream a large source without holding it all in memory.
ROW_GROUP_SIZE = 10_000


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
    return with_json_columns(table, json_columns)


def with_json_columns(table: pa.Table, json_columns: list[str]) -> pa.Table:
    meta = dict(table.schema.metadata or {})
    meta[META_KEY] = json.dumps({"json_columns": json_columns}).encode()
    return table.replace_schema_metadata(meta)


def json_columns(schema: pa.Schema) -> list[str]:
    """Names of the columns stored as JSON text (see the module docstring)."""
    meta = (schema.metadata or {}).get(META_KEY)
    return json.loads(meta)["json_columns"] if meta else []


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
