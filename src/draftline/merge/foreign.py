"""A base in another trainer's format (the export stage's, or one such a trainer's tools wrote), read as a legacy
base: ``input_ids`` + ``loss_mask`` (+ ``id`` / ``source`` where it has them). Every legacy guard then applies.

Formats, recognised by the ``export.json`` beside them or by their content:

- ``specforge``: a folder holding ``*.jsonl`` whose records carry ``input_ids`` and a 0/1 ``loss_mask`` (read into
  memory: JSON lines cannot be memory-mapped);
- ``speculators``: a ``save_to_disk`` folder with ``seq_len`` beside the ids and mask (``seq_len`` must equal each
  row's length: it is checked, then dropped);
- ``hf``: a ``save_to_disk`` folder with ``labels`` (ids where supervised, -100 elsewhere) instead of ``loss_mask``
  (the mask is ``labels != -100``; a label that is not its row's token is refused).

A draftline ``export.json`` names the tokenizer fingerprint the rows were made with: that is the base's tokenizer
claim (merge's guards still re-encode a sample under the target's tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from draftline.core import dataset as fmt
from draftline.core.jsonl import iter_jsonl
from draftline.merge.guards import MergeGuardError


def export_claim(folder: Path) -> dict[str, Any] | None:
    """The draftline ``export.json`` beside a dataset, if there is one."""
    path = folder / fmt.EXPORT_FILE
    if not path.is_file():
        return None
    claim = json.loads(path.read_text(encoding="utf-8"))
    if claim.get("producer") != "draftline" or not isinstance(claim.get("tokenizer_fingerprint"), str):
        raise MergeGuardError(f"{path} is not a draftline export manifest (no producer / tokenizer_fingerprint)")
    return claim


def foreign_format(folder: Path, claim: dict[str, Any] | None) -> str | None:
    """``specforge`` / ``speculators`` / ``hf`` for a base in one of those formats, None for a plain one."""
    if claim is not None:
        return claim["format"]
    if not (folder / "state.json").is_file():
        return "specforge" if any(folder.glob("*.jsonl")) else None
    columns = set(json.loads((folder / "dataset_info.json").read_text(encoding="utf-8"))["features"])
    if "seq_len" in columns and "num_tokens" not in columns:
        return "speculators"
    if "labels" in columns and "loss_mask" not in columns:
        return "hf"
    return None


def read_specforge(folder: Path, where: str) -> list[pa.Table]:
    rows: dict[str, list] = {"id": [], "source": [], "input_ids": [], "loss_mask": []}
    for file in sorted(folder.glob("*.jsonl")):
        for lineno, value, error in iter_jsonl(file):
            at = f"{where}: {file.name}:{lineno}"
            if error or not isinstance(value, dict) or not {"input_ids", "loss_mask"} <= set(value):
                raise MergeGuardError(f"{at}: not a pre-tokenized record (input_ids and loss_mask): {error or value!r:.80}")
            rows["input_ids"].append(value["input_ids"])
            rows["loss_mask"].append(value["loss_mask"])
            rows["id"].append(value.get("id"))
            rows["source"].append(value.get("source"))
    cols = {k: v for k, v in rows.items() if k in ("input_ids", "loss_mask") or all(x is not None for x in v)}
    types = {"input_ids": pa.list_(pa.int64()), "loss_mask": pa.list_(pa.int64()), "id": pa.string(), "source": pa.string()}
    try:
        return [pa.table({k: pa.array(v, types[k]) for k, v in cols.items()})]
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise MergeGuardError(f"{where}: a record's input_ids or loss_mask is not a list of integers: {e}") from None


def from_speculators(table: pa.Table, where: str) -> pa.Table:
    lengths = pc.list_value_length(table.column("input_ids")).cast(pa.int64())
    if not pc.all(pc.equal(lengths, table.column("seq_len").cast(pa.int64()))).as_py():
        raise MergeGuardError(f"{where}: column 'seq_len' disagrees with the rows' lengths")
    return table.drop_columns(["seq_len"])


def from_hf(table: pa.Table, where: str) -> pa.Table:
    ids, labels = table.column("input_ids").combine_chunks(), table.column("labels").combine_chunks()
    if not pc.all(pc.equal(pc.list_value_length(ids), pc.list_value_length(labels))).as_py():
        raise MergeGuardError(f"{where}: columns 'input_ids' and 'labels' differ in length on some rows")
    tokens = pc.list_flatten(ids).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(labels).to_numpy(zero_copy_only=False)
    supervised = flat != fmt.IGNORE_INDEX
    if not np.array_equal(flat[supervised], tokens[supervised]):
        raise MergeGuardError(f"{where}: some labels are not their row's token (shifted labels?): not a loss mask")
    mask = pa.ListArray.from_arrays(ids.offsets, pa.array(supervised, pa.bool_()))
    return pa.table({"input_ids": ids, "loss_mask": mask})


def read_foreign(folder: Path, kind: str, where: str) -> list[pa.Table]:
    """The base's rows as legacy tables (see the module docstring)."""
    if kind == "specforge":
        return read_specforge(folder, where)
    tables = fmt.mapped_shards(folder, fmt.verified_shard_files(folder)[1])
    convert = {"speculators": from_speculators, "hf": from_hf}[kind]
    return [convert(t.replace_schema_metadata(None), f"{where}") for t in tables]
