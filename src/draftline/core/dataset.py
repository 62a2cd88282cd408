"""The on-disk contract of tokenized and merged datasets, shared by the tokenize, merge and train stages.

A dataset folder is what ``datasets.Dataset.save_to_disk`` writes, so ``datasets.load_from_disk`` opens it
memory-mapped, plus ``draftline.json`` (:class:`DatasetMeta`): what the rows were made with.

    <folder>/data-00000-of-00002.arrow   Arrow IPC stream shards, each at most ``max_shard_bytes``
    <folder>/data-00001-of-00002.arrow
    <folder>/state.json                  lists the shards in order (``datasets`` reads only those)
    <folder>/dataset_info.json           the ``datasets`` features
    <folder>/draftline.json              DatasetMeta: tokenizer, template, thinking mode, counts, shards
    <folder>/order.npy                   a merged (training) set only: the seeded training order of its rows

Rows (:data:`FEATURES`): ``id``, ``source`` (strings), ``input_ids`` (list<int32>: Qwen ids need 32 bits),
``loss_mask`` (list<bool>: Arrow bit-packs it, 1/8 byte per token, so a row costs ~4.13 bytes per token),
``num_tokens``, ``num_loss_tokens`` (int32). Columns are built from numpy buffers and list offsets
(:func:`build_table`), never from Python lists of ints.

Shards are written once and never rewritten, so a merge can carry old shards byte-identical beside new ones
(DVC then stores only the new data): :class:`ShardWriter` writes shards, :func:`write_folder_index` writes
``state.json`` + ``dataset_info.json`` for any list of shard files, :func:`shard_files` lists them.

Corruption is detected, never consumed: ``draftline.json`` records each shard's size and xxh3-128, and
:func:`verify_shards` checks them wherever a dataset is read as input, refusing a truncated, bit-flipped or swapped
shard by name before any row of it is read: every reader opens a folder through :func:`verified_shard_files` (merge's
new rows and base, the prompt stage's base mix and base ids, export) or :func:`load_training_set` (training), and a
folder another tool saved, which records no checksum, has each shard refused by name when it is not a whole Arrow
stream (:func:`mapped_shards`).

Every shard written here has a sidecar ``data-0000i-of-0000N.keys`` beside it: each row's prompt key
(:func:`prompt_key_digests`, 16 bytes a row, in row order), its size and xxh3-128 recorded in the shard's
:class:`ShardInfo` and verified with it. A merge matches new rows against a base by these keys without reading a
token. A sidecar, not a column: the shard files keep exactly the schema that ``datasets``, SpecForge and
speculators read, and a shard written before keys were recorded is still the same file (it gains a sidecar,
hashed once, when it is next carried).

How each shard's rows were made (target, engine, sampling, thinking mode) is recorded the same way, beside the
rows and not in them: as runs in its :class:`ShardInfo` (:mod:`draftline.core.provenance`), carried with the shard.

A training set (``data/merged``) adds ``order.npy``, an int64 permutation of its rows (row ``order[k]`` is
trained k-th): :func:`training_order` makes it, :func:`load_training_set` reads the folder and checks it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from draftline.core.errors import MissingInput, Refusal
from draftline.core.files import atomic_path, write_json
from draftline.core.fingerprint import file_xxh3_128, folder_fingerprint
from draftline.core.logs import get_logger
from draftline.core.provenance import runs

log = get_logger(__name__)

# Bump when the columns or their meaning change; readers refuse other versions instead of misreading them.
SCHEMA_VERSION = 1

FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        "source": datasets.Value("string"),
        "input_ids": datasets.List(datasets.Value("int32")),
        "loss_mask": datasets.List(datasets.Value("bool")),
        "num_tokens": datasets.Value("int32"),
        "num_loss_tokens": datasets.Value("int32"),
    }
)
# Carries the ``huggingface`` features metadata, so each shard file describes itself to ``datasets``.
SCHEMA: pa.Schema = FEATURES.arrow_schema

META_FILE = "draftline.json"
ORDER_FILE = "order.npy"
# Other trainers' layouts, written by the export stage and read back by merge as a base: the lineage file beside
# each (the tokenizer fingerprint, thinking mode, ... the rows were made with), and the label losses ignore.
EXPORT_FILE = "export.json"
IGNORE_INDEX = -100
MAX_SHARD_BYTES = 500 * 1000 * 1000
# Rows per Arrow record batch inside a shard: fixed, so the bytes never depend on how the input was chunked.
BATCH_ROWS = 1024
# Bytes a shard spends outside its rows (the schema with its ``huggingface`` metadata, the end-of-stream marker).
SHARD_HEADER_BYTES = 4096
# A shard's prompt-key sidecar: its name with this suffix for ``.arrow``; one xxh3-128 digest per row.
KEYS_SUFFIX = ".keys"
KEY_BYTES = 16

# Fields of DatasetMeta that must agree before two datasets may be concatenated or trained on together.
COMPAT_FIELDS = (
    "schema_version",
    "tokenizer_fingerprint",
    "chat_template_sha256",
    "enable_thinking",
    "mask_token_id",
    "end_of_turn_token_id",
)


@dataclass
class ShardInfo:
    """One shard file and its counts (listed in ``draftline.json`` so a merge need not reopen old shards)."""

    filename: str
    num_rows: int
    num_tokens: int
    num_loss_tokens: int
    num_bytes: int
    # xxh3-128 of the file's bytes; None only in folders written by draftline before checksums were recorded.
    xxh3_128: str | None = None
    # The smallest and largest token id in the shard (None when empty or not recorded): a merge checks a base
    # against the target's vocabulary from these, without reading a token.
    token_id_min: int | None = None
    token_id_max: int | None = None
    # xxh3-128 of the shard's prompt-key sidecar (:func:`keys_path`); None where none was recorded.
    keys_xxh3_128: str | None = None
    # How its rows were made, as runs in row order (:mod:`draftline.core.provenance`); None where none was recorded.
    provenance: list[dict[str, Any]] | None = None

    @classmethod
    def of(cls, table: pa.Table, path: Path, provenance: Sequence[str | None] | None = None) -> "ShardInfo":
        """The info of shard file ``path`` holding ``table``: counted from the table, hashed from the file; its
        prompt keys are written beside it (:func:`keys_path`) and their checksum recorded; ``provenance`` (one
        encoded provenance per row, or None) recorded as runs."""
        keys = prompt_key_digests(table).tobytes()
        with atomic_path(keys_path(path)) as tmp:
            tmp.write_bytes(keys)
        return cls(
            filename=path.name,
            num_rows=table.num_rows,
            num_tokens=int(pc.sum(table.column("num_tokens")).as_py() or 0),
            num_loss_tokens=int(pc.sum(table.column("num_loss_tokens")).as_py() or 0),
            num_bytes=path.stat().st_size,
            xxh3_128=file_xxh3_128(path),
            **token_id_range(table),
            keys_xxh3_128=xxhash.xxh3_128_hexdigest(keys),
            provenance=None if provenance is None or all(p is None for p in provenance)
            else runs(provenance, table.column("num_tokens").to_numpy()),
        )


class CorruptShardError(Refusal, ValueError):
    """A shard whose size or bytes differ from what ``draftline.json`` records: never read, always refused."""


@dataclass
class DatasetMeta:
    """``draftline.json``: what every row of the folder was made with, and its totals."""

    tokenizer_fingerprint: str
    chat_template_sha256: str
    # The generation run's thinking mode; None when the rows mix both modes.
    enable_thinking: bool | None
    max_len: int
    mask_token_id: int
    end_of_turn_token_id: int
    schema_version: int = SCHEMA_VERSION
    num_rows: int = 0
    num_tokens: int = 0
    num_loss_tokens: int = 0
    shards: list[ShardInfo] = field(default_factory=list)

    def set_shards(self, shards: list[ShardInfo]) -> None:
        """Record the shards and recompute the totals from them, so the two can never disagree."""
        self.shards = list(shards)
        self.num_rows = sum(s.num_rows for s in shards)
        self.num_tokens = sum(s.num_tokens for s in shards)
        self.num_loss_tokens = sum(s.num_loss_tokens for s in shards)

    def compat_key(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in COMPAT_FIELDS}

    def check_compatible(self, other: "DatasetMeta", what: str = "datasets") -> None:
        """Raise a clear error naming every field on which two datasets disagree."""
        a, b = self.compat_key(), other.compat_key()
        diff = {k: (a[k], b[k]) for k in COMPAT_FIELDS if a[k] != b[k]}
        if diff:
            raise Refusal(
                f"{what} were made differently and cannot be combined: "
                + ", ".join(f"{k} {x!r} != {y!r}" for k, (x, y) in diff.items())
                + "; re-tokenize them with the same target and generation settings"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DatasetMeta":
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        kw["shards"] = [ShardInfo(**s) for s in kw.get("shards", [])]
        return cls(**kw)


def build_table(
    ids: list[str],
    sources: list[str],
    offsets: np.ndarray,
    input_ids: np.ndarray,
    loss_mask: np.ndarray,
) -> pa.Table:
    """Rows from flat buffers: row ``i`` is ``input_ids[offsets[i]:offsets[i+1]]`` (and the same of ``loss_mask``).

    ``offsets`` has ``len(ids) + 1`` entries starting at 0; the token buffers are zero-copied into Arrow.
    """
    offsets = np.ascontiguousarray(offsets, dtype=np.int32)
    input_ids = np.ascontiguousarray(input_ids, dtype=np.int32)
    loss_mask = np.ascontiguousarray(loss_mask, dtype=np.bool_)
    if len(offsets) != len(ids) + 1 or len(sources) != len(ids) or offsets[0] != 0:
        raise ValueError("build_table: offsets must have one entry per row plus a leading 0")
    if not (len(input_ids) == len(loss_mask) == offsets[-1]):
        raise ValueError("build_table: input_ids and loss_mask must both hold offsets[-1] tokens")
    pa_offsets = pa.array(offsets, type=pa.int32())
    lengths = np.diff(offsets).astype(np.int32)
    # Per-row sums without a running sum over every token (8 bytes a token, page-faulted in a fresh process).
    loss_counts = np.zeros(len(ids), dtype=np.int32)
    nonempty = lengths > 0
    if nonempty.any():
        loss_counts[nonempty] = np.add.reduceat(loss_mask.view(np.uint8), offsets[:-1][nonempty], dtype=np.int32)
    return pa.Table.from_arrays(
        [
            pa.array(ids, type=pa.string()),
            pa.array(sources, type=pa.string()),
            pa.ListArray.from_arrays(pa_offsets, pa.array(input_ids, type=pa.int32())),
            pa.ListArray.from_arrays(pa_offsets, pa.array(loss_mask, type=pa.bool_())),
            pa.array(lengths),
            pa.array(loss_counts),
        ],
        schema=SCHEMA,
    )


def token_id_range(table: pa.Table) -> dict[str, int | None]:
    """``{"token_id_min", "token_id_max"}`` of a table's ``input_ids`` (None for a table without tokens)."""
    lo, hi = pc.min_max(pc.list_flatten(table.column("input_ids"))).values()
    return {"token_id_min": lo.as_py(), "token_id_max": hi.as_py()}


def pieces(table: pa.Table) -> Iterator[pa.Table]:
    """``table`` as zero-copy tables of at most :data:`BATCH_ROWS` rows, in order: what reads tokens reads them a
    piece at a time, so its memory is bounded by a piece (numpy copies cost up to ~19 bytes a token)."""
    for batch in table.to_batches(max_chunksize=BATCH_ROWS):
        yield pa.Table.from_batches([batch])


def flat_tokens(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(offsets, input_ids, loss_mask)`` as numpy: int64 offsets from 0, int32 ids, bool mask."""
    ids = table.column("input_ids")
    lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = pc.list_flatten(ids).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    mask = pc.list_flatten(table.column("loss_mask")).to_numpy(zero_copy_only=False).astype(np.bool_, copy=False)
    return offsets, tokens, mask


def prompt_key_digests(table: pa.Table) -> np.ndarray:
    """Each row's prompt key, ``(rows, 16)`` uint8: the xxh3-128 digest of its prompt tokens (those before its
    first supervised token) as little-endian int32 bytes. It identifies a prompt across datasets that share no
    ids (a legacy base and new rows); ``digest.hex()`` is the hex digest legacy rows get as their id."""
    out = np.zeros((table.num_rows, KEY_BYTES), np.uint8)
    row = 0
    for piece in pieces(table):
        offsets, tokens, mask = flat_tokens(piece)
        starts = offsets[:-1]
        masked = np.append(np.flatnonzero(mask), offsets[-1])
        # First masked position at or after each row's start; past the row's end means the row is all prompt.
        first = np.minimum(masked[np.searchsorted(masked, starts)], offsets[1:])
        tokens = tokens.astype("<i4", copy=False)  # hashed as little-endian int32 on every machine
        digests = b"".join(xxhash.xxh3_128_digest(tokens[s:e]) for s, e in zip(starts, first))
        out[row : row + piece.num_rows] = np.frombuffer(digests, np.uint8).reshape(-1, KEY_BYTES)
        row += piece.num_rows
    return out


def keys_path(shard: str | os.PathLike) -> Path:
    """The prompt-key sidecar of a shard file: ``data-00000-of-00002.keys`` beside ``data-00000-of-00002.arrow``."""
    return Path(shard).with_suffix(KEYS_SUFFIX)


def rename_shard(folder: Path, info: ShardInfo, name: str) -> None:
    """Rename a shard file and its sidecar in ``folder``, and its info."""
    os.replace(folder / info.filename, folder / name)
    if info.keys_xxh3_128 is not None:
        os.replace(keys_path(folder / info.filename), keys_path(folder / name))
    info.filename = name


def read_keys(folder: str | os.PathLike, meta: DatasetMeta) -> np.ndarray | None:
    """Every row's recorded prompt key, ``(rows, 16)`` uint8 in row order, from the shards' sidecars (verified by
    :func:`verify_shards`); None when a shard has none recorded (written before keys were)."""
    if any(s.keys_xxh3_128 is None for s in meta.shards):
        return None
    parts = [np.fromfile(keys_path(Path(folder) / s.filename), np.uint8) for s in meta.shards]
    return np.concatenate(parts or [np.zeros(0, np.uint8)]).reshape(-1, KEY_BYTES)


def empty_table() -> pa.Table:
    return SCHEMA.empty_table()


def _row_bytes(table: pa.Table) -> np.ndarray:
    """Bytes each row takes in a shard (ids 4/token, mask 1/8 per token, strings, 4-byte offsets and ints).

    Computed from the row's content alone, so shard boundaries do not depend on how rows arrived in chunks.
    """
    n = table.column("num_tokens").to_numpy().astype(np.int64)
    text = sum(
        pc.binary_length(table.column(c).cast(pa.binary())).to_numpy().astype(np.int64) for c in ("id", "source")
    )
    # +1: each record batch of BATCH_ROWS rows adds well under BATCH_ROWS bytes of message headers and padding.
    return 4 * n + (n + 7) // 8 + text + 4 * 4 + 2 * 4 + 1


def _canonical(table: pa.Table) -> pa.Table:
    """Rebuild ``table`` from plain buffers: concatenated slices may carry extra validity bitmaps or offsets
    that change the file bytes, and shards must be byte-identical however the rows were chunked."""
    n = table.column("num_tokens").to_numpy()
    return build_table(
        table.column("id").to_pylist(),
        table.column("source").to_pylist(),
        np.concatenate([[0], np.cumsum(n, dtype=np.int64)]),
        pc.list_flatten(table.column("input_ids")).to_numpy(),
        pc.list_flatten(table.column("loss_mask")).to_numpy(zero_copy_only=False),
    )


def shard_name(index: int, total: int, prefix: str = "data") -> str:
    """``data-00000-of-00002.arrow``, as ``save_to_disk`` names them; a merge may use another prefix."""
    return f"{prefix}-{index:05d}-of-{total:05d}.arrow"


class ShardWriter:
    """Cuts a stream of row tables into shard files of at most ``max_shard_bytes`` in ``folder``.

    Shards are named by :func:`shard_name` once their count is known (on :meth:`close`). A single row larger
    than the limit gets a shard of its own. Write into a temporary folder (see :func:`write_dataset`).
    """

    def __init__(self, folder: str | os.PathLike, max_shard_bytes: int = MAX_SHARD_BYTES, prefix: str = "data"):
        if max_shard_bytes <= 0:
            raise ValueError("max_shard_bytes must be positive")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_shard_bytes = max_shard_bytes
        self.prefix = prefix
        self._pending: list[pa.Table] = []
        self._provenance: list[str | None] = []  # of the pending rows
        self._pending_bytes = 0
        self._written: list[ShardInfo] = []

    def add(self, table: pa.Table, provenance: Sequence[str | None] | None = None) -> None:
        """Rows to write; ``provenance``: each row's encoded provenance (:mod:`draftline.core.provenance`), or None
        where the rows recorded none."""
        if not table.schema.equals(SCHEMA):
            table = table.cast(SCHEMA)
        provenance = [None] * table.num_rows if provenance is None else list(provenance)
        if len(provenance) != table.num_rows:
            raise ValueError(f"ShardWriter.add: {len(provenance)} provenances for {table.num_rows} rows")
        sizes = _row_bytes(table)
        start = 0
        while start < len(sizes):
            room = self.max_shard_bytes - SHARD_HEADER_BYTES - self._pending_bytes
            cum = np.cumsum(sizes[start:])
            take = int(np.searchsorted(cum, room, side="right"))
            if take == 0 and not self._pending:
                take = 1
            if take:
                self._pending.append(table.slice(start, take))
                self._provenance += provenance[start : start + take]
                self._pending_bytes += int(cum[take - 1])
                start += take
            if start < len(sizes):
                self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        path = self.folder / f".{self.prefix}-{len(self._written):05d}.partial"
        # Rebuilt a record batch at a time: memory holds the pending rows and one batch, never a second copy of
        # the shard (the pending rows are slices of their sources, memory-mapped or a worker's table).
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
            for start in range(0, table.num_rows, BATCH_ROWS):
                writer.write_table(_canonical(table.slice(start, BATCH_ROWS)))
        self._written.append(ShardInfo.of(table, path, self._provenance))
        for t in self._pending:  # rows carried from a memory-mapped source: read, so no longer needed resident
            drop_pages(t)
        self._pending, self._provenance, self._pending_bytes = [], [], 0

    def close(self) -> list[ShardInfo]:
        """Write the last shard and give every shard its final name. An empty stream still gets one shard,
        so the folder always loads (as zero rows)."""
        if self._pending or not self._written:
            self._pending = self._pending or [empty_table()]
            self._flush()
        total = len(self._written)
        for i, info in enumerate(self._written):
            rename_shard(self.folder, info, shard_name(i, total, self.prefix))
        return self._written


def write_folder_index(
    folder: str | os.PathLike, filenames: list[str], fingerprint: str | None = None,
    features: datasets.Features = FEATURES, format_type: str | None = None,
) -> None:
    """Write ``state.json`` and ``dataset_info.json`` so ``datasets.load_from_disk`` reads these shards, in order.

    ``fingerprint`` replaces :func:`folder_fingerprint` (a merge derives one from its base's, so as not to read
    the carried shards again); ``features`` and ``format_type`` (e.g. ``torch``) describe folders of another layout
    (the export stage's)."""
    state = {
        "_data_files": [{"filename": f} for f in filenames],
        "_fingerprint": fingerprint or folder_fingerprint(folder, filenames),
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": format_type,
        "_output_all_columns": False,
        "_split": None,
    }
    info = {"citation": "", "description": "", "features": features.to_dict(), "homepage": "", "license": ""}
    write_json(Path(folder) / "state.json", state)
    write_json(Path(folder) / "dataset_info.json", info)


def write_meta(folder: str | os.PathLike, meta: DatasetMeta) -> None:
    write_json(Path(folder) / META_FILE, meta.to_dict())


def read_meta(folder: str | os.PathLike) -> DatasetMeta:
    """Read ``draftline.json``; a folder of another schema version is an error, never misread."""
    path = Path(folder) / META_FILE
    if not path.is_file():
        raise MissingInput(f"{path} is missing: {folder} is not a draftline dataset (run the tokenize stage)")
    meta = DatasetMeta.from_dict(json.loads(path.read_text(encoding="utf-8")))
    if meta.schema_version != SCHEMA_VERSION:
        raise Refusal(
            f"{path} has schema_version {meta.schema_version}, this draftline reads {SCHEMA_VERSION}; re-run tokenize"
        )
    return meta


def verify_shards(folder: str | os.PathLike, meta: DatasetMeta) -> None:
    """Check every shard against ``draftline.json``: the list ``state.json`` gives, each file's size and its xxh3-128.

    Raises :class:`CorruptShardError` naming the first file that differs (truncated by a bad copy, a flipped bit,
    a file swapped in by hand): a damaged dataset is refused before any of it is read. Hashing runs at disk speed.
    """
    folder = Path(folder)
    listed, recorded = shard_files(folder), [s.filename for s in meta.shards]
    if listed != recorded:
        raise CorruptShardError(f"{folder}/state.json lists shards {listed}, {META_FILE} records {recorded}: "
                                "the folder was changed by hand; restore it (dvc checkout) or re-run its stage")
    unchecked = 0
    for s in meta.shards:
        path = folder / s.filename
        fix = f"restore it (`dvc checkout {folder}`) or re-run the stage that wrote it"
        if not path.is_file():
            raise CorruptShardError(f"{path} is missing: {fix}")
        if (size := path.stat().st_size) != s.num_bytes:
            raise CorruptShardError(f"{path} is {size} bytes, {META_FILE} records {s.num_bytes}: truncated? {fix}")
        if s.xxh3_128 is None:
            unchecked += 1
        elif file_xxh3_128(path) != s.xxh3_128:
            raise CorruptShardError(f"{path}: its bytes do not match the xxh3-128 in {META_FILE}: corrupted. {fix}")
        if s.keys_xxh3_128 is not None:
            _verify_keys(keys_path(path), s, fix)
    if unchecked:
        log.warning("%s: %d shard(s) have no recorded checksum (written by an older draftline); sizes checked only",
                    folder, unchecked)


def _verify_keys(path: Path, s: ShardInfo, fix: str) -> None:
    """A shard's prompt-key sidecar against its record: present, one key per row, the recorded xxh3-128."""
    if not path.is_file():
        raise CorruptShardError(f"{path} (the prompt keys of {s.filename}) is missing: {fix}")
    if (size := path.stat().st_size) != KEY_BYTES * s.num_rows:
        raise CorruptShardError(f"{path} is {size} bytes, {s.num_rows} rows need {KEY_BYTES * s.num_rows}: {fix}")
    if file_xxh3_128(path) != s.keys_xxh3_128:
        raise CorruptShardError(f"{path}: its bytes do not match the keys_xxh3_128 in {META_FILE}: corrupted. {fix}")


def dataset_digest(folder: str | os.PathLike) -> str:
    """xxh3-128 of a dataset folder's ``draftline.json`` (which records every shard's checksum) and, for a training
    set, its ``order.npy``: names its contents without rereading its shards (run :func:`verify_shards` first)."""
    folder = Path(folder)
    h = xxhash.xxh3_128((folder / META_FILE).read_bytes())
    if (folder / ORDER_FILE).is_file():
        h.update((folder / ORDER_FILE).read_bytes())
    return h.hexdigest()


def shard_files(folder: str | os.PathLike) -> list[str]:
    """The shard file names of a dataset folder, in row order (from its ``state.json``)."""
    state = json.loads((Path(folder) / "state.json").read_text(encoding="utf-8"))
    return [f["filename"] for f in state["_data_files"]]


def verified_shard_files(folder: str | os.PathLike) -> tuple[DatasetMeta | None, list[str]]:
    """The one way a dataset folder is opened as input: its ``draftline.json`` and its shard files in row order,
    every shard verified against it first (:func:`verify_shards`: a damaged dataset is refused before any of it is
    read). A folder another tool saved (``state.json`` without ``draftline.json``) records no checksum: ``None`` and
    its files, each refused by name when it cannot be read (:func:`mapped_shards`)."""
    folder = Path(folder)
    if not (folder / META_FILE).is_file():
        return None, shard_files(folder)
    meta = read_meta(folder)
    verify_shards(folder, meta)
    return meta, [s.filename for s in meta.shards]


def mapped_shards(folder: str | os.PathLike, files: list[str]) -> list[pa.Table]:
    """Shard files of a ``save_to_disk`` folder as Arrow tables over memory maps: nothing is read into RAM. A file
    that is not a whole Arrow stream is refused, naming it (pyarrow's own error says only how many bytes it lacked).
    """
    tables = []
    for f in files:
        path = Path(folder) / f
        try:
            tables.append(pa.ipc.open_stream(pa.memory_map(str(path))).read_all())
        except (OSError, pa.ArrowInvalid) as e:
            raise CorruptShardError(f"{path} is not a whole Arrow stream ({e}): truncated by a bad copy? Restore it "
                                    "(dvc checkout) or save the dataset again") from e
    return tables


_MADV_DONTNEED = 4  # Linux: drop the pages from this process; a file mapping refaults them from the page cache


def drop_pages(table: pa.Table) -> None:
    """Take a memory-mapped table's pages out of this process's resident set once a pass over it is done.

    Reading a mapped shard leaves every page it touched resident (in RSS, and charged to the process's cgroup)
    until the mapping goes, so one pass over a base would keep the whole base resident. The table stays valid: its
    pages come back from the page cache when it is read again. Only a read-only file mapping (never written, so
    nothing of it is lost) that holds every buffer of the table is advised (/proc/self/maps says which); for any
    other table (built in memory) this does nothing, as it does off Linux."""
    buffers = [b for c in table.columns for a in c.chunks for b in a.buffers() if b is not None and b.size]
    if not buffers or not Path("/proc/self/maps").is_file():
        return
    lo, hi = min(b.address for b in buffers), max(b.address + b.size for b in buffers)
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, perms, *rest = line.split(maxsplit=5)
        start, end = (int(x, 16) for x in span.split("-"))
        if start <= lo and hi <= end:
            if perms in ("r--s", "r--p") and len(rest) == 4 and rest[3].startswith("/"):
                import ctypes

                ctypes.CDLL(None).madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED)
            return


def write_dataset(
    path: str | os.PathLike,
    tables: Iterable[pa.Table | tuple[pa.Table, Sequence[str | None]]],
    meta: DatasetMeta,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> DatasetMeta:
    """Write a whole dataset folder atomically: shards, ``state.json``, ``dataset_info.json``, ``draftline.json``.

    ``tables``: row tables, or ``(table, provenance)`` with each row's encoded provenance (:meth:`ShardWriter.add`).
    The folder appears only when complete (written under a temporary name, then renamed). Returns ``meta``
    with its shards and totals filled in.
    """
    with atomic_path(path) as tmp:
        writer = ShardWriter(tmp, max_shard_bytes)
        for item in tables:
            table, provenance = item if isinstance(item, tuple) else (item, None)
            writer.add(table, provenance)
        meta.set_shards(writer.close())
        write_folder_index(tmp, [s.filename for s in meta.shards])
        write_meta(tmp, meta)
    return meta


def load(path: str | os.PathLike) -> datasets.Dataset:
    """Open a dataset folder memory-mapped (never read into RAM), after checking its schema version and shards."""
    verify_shards(path, read_meta(path))
    return datasets.load_from_disk(str(path), keep_in_memory=False)


def training_order(num_rows: int, seed: int) -> np.ndarray:
    """The seeded permutation the trainer walks: same seed and row count, same order, on any machine."""
    return np.random.default_rng(seed).permutation(num_rows).astype(np.int64)


def load_training_set(path: str | os.PathLike) -> tuple[datasets.Dataset, np.ndarray, DatasetMeta]:
    """A training set (memory-mapped, its shards verified), its order, checked to be a permutation of its rows,
    and its metadata."""
    meta = read_meta(path)
    verify_shards(path, meta)
    ds = datasets.load_from_disk(str(path), keep_in_memory=False)
    order = np.load(Path(path) / ORDER_FILE, allow_pickle=False)
    if order.dtype != np.int64 or order.shape != (len(ds),) or not np.array_equal(np.sort(order), np.arange(len(ds))):
        raise Refusal(f"{Path(path) / ORDER_FILE} is not a permutation of the {len(ds)} rows: re-run the merge stage")
    return ds, order, meta
