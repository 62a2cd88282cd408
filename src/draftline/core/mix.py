"""The content mix of a tokenized dataset (a base, a merged set): domain and language of every row, counted per
shard, recorded once and carried.

A row is labelled from its prompt decoded from its tokens (those before its first supervised token, chat template
included: :func:`draftline.core.classify.classify_rendered`). A prompt longer than :data:`HEAD` + :data:`TAIL`
tokens is read by its first :data:`HEAD` tokens (the system prompt, where tools are offered) and its last
:data:`TAIL` (the last user turn, what the reply answers): decoding stays bounded by the row count, not the
tokens.

Records, both keyed by the shard file's xxh3-128 checksum (the one ``draftline.json`` records), so a shard that is
carried byte-identical into a later round keeps its labels without being read again:

- ``<dataset folder>/mix.json`` (:data:`MIX_FILE`): per shard, rows and tokens per domain and rows per language.
  The merge stage writes it into the merged folder (carried shards' entries copied, new shards' counted), so a
  merged set used as the next round's base answers "what is in it" in milliseconds.
- ``<cache>/mix/<checksum>-<classifier>.npz``: per shard, every row's domain and language (one byte each), for a
  shard with no ``mix.json`` entry (a legacy base): labelled the first time any stage needs it (the prompt stage,
  aiming ``blend.target_mix``), reused by the next (the merge stage, which re-cuts a legacy base into new shards and
  counts those from the same per-row labels instead of decoding the base a second time). ``<cache>`` is
  :func:`draftline.core.scratch.cache_root`.

:func:`classifier_fingerprint` is part of both: a hash of the code that produces a label (core/classify.py's rules and
tables, the text this module hands it, the language model's version), so changing a rule invalidates every record and
cached label, with no version to bump by hand.
Memory is flat in the row count: shards are memory-mapped and read :data:`draftline.core.dataset.BATCH_ROWS` rows
at a time, their pages dropped after each shard; what is kept is two bytes a row.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from draftline.core import classify
from draftline.core import dataset as fmt
from draftline.core.classify import DOMAINS, UNDETERMINED, classify_rendered
from draftline.core.files import atomic_path, write_json
from draftline.core.fingerprint import file_xxh3_128
from draftline.core.logs import get_logger
from draftline.core.scratch import cache_root

log = get_logger(__name__)

MIX_FILE = "mix.json"
HEAD, TAIL = 256, 768


@dataclass
class Mix:
    """Rows and tokens per domain, rows per language: a shard's, a folder's, or a blend's."""

    rows: Counter[str] = field(default_factory=Counter)
    tokens: Counter[str] = field(default_factory=Counter)
    languages: Counter[str] = field(default_factory=Counter)

    def __add__(self, other: "Mix") -> "Mix":
        return Mix(self.rows + other.rows, self.tokens + other.tokens, self.languages + other.languages)

    def amounts(self, unit: str) -> dict[str, int]:
        """Per domain, in ``unit`` (samples: rows, tokens: tokens), every domain present."""
        src = self.rows if unit == "samples" else self.tokens
        return {d: int(src.get(d, 0)) for d in DOMAINS}

    def to_dict(self) -> dict[str, Any]:
        return {"rows": dict(sorted(self.rows.items())), "tokens": dict(sorted(self.tokens.items())),
                "languages": dict(sorted(self.languages.items()))}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Mix":
        return cls(Counter(d["rows"]), Counter(d["tokens"]), Counter(d["languages"]))

    @classmethod
    def of_labels(cls, domains: Iterable[str], langs: Iterable[str], tokens: Iterable[int]) -> "Mix":
        m = cls()
        for d, g, t in zip(domains, langs, tokens):
            m.rows[d] += 1
            m.tokens[d] += int(t)
            m.languages[g] += 1
        return m


def shares(amounts: dict[str, int | float]) -> dict[str, float]:
    total = sum(amounts.values())
    return {k: round(v / total, 4) if total else 0.0 for k, v in amounts.items()}


# --- labelling rows from their tokens --------------------------------------------------------------------------
def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets from 0, values)`` of a one-chunk list column: the values a view over the shard's memory map
    where Arrow allows (int ids), so that only the slices read are paged in."""
    arr = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])).to_numpy(zero_copy_only=False)
    return offsets - offsets[0], values


def _prompt_spans(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(starts, ends, tokens)``: row i's prompt is ``tokens[starts[i]:ends[i]]`` (before its first supervised
    token; ``loss_mask``, else ``labels != -100``, else the whole row). Of the tokens only the mask (bit-packed) is
    read whole; the ids are a view, read by the prompts' slices alone."""
    offsets, tokens = _flat(table.column("input_ids"))
    if "loss_mask" in table.column_names:
        mask = _flat(table.column("loss_mask"))[1].astype(bool, copy=False)
    elif "labels" in table.column_names:
        mask = _flat(table.column("labels"))[1] != fmt.IGNORE_INDEX
    else:
        mask = np.zeros(len(tokens), bool)
    masked = np.append(np.flatnonzero(mask), offsets[-1])
    first = np.minimum(masked[np.searchsorted(masked, offsets[:-1])], offsets[1:])
    return offsets[:-1], first, tokens


# Pieces (of BATCH_ROWS rows) between two drops of a shard's pages from the resident set: memory stays at most this
# many pieces' pages, whatever the shard's or the dataset's size.
DROP_EVERY = 8


def label_table(table: pa.Table, tokenizer: Any) -> tuple[list[str], list[str]]:
    """Every row's (domain, language), from its decoded prompt. ``tokenizer``: a ``tokenizers.Tokenizer`` or a
    transformers tokenizer (its Rust backend is used)."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    domains: list[str] = []
    langs: list[str] = []
    for k, piece in enumerate(fmt.pieces(table)):
        starts, ends, tokens = _prompt_spans(piece)
        spans = []
        for s, e in zip(starts.tolist(), ends.tolist()):
            if e - s > HEAD + TAIL:
                spans.append(np.concatenate([tokens[s : s + HEAD], tokens[e - TAIL : e]]).tolist())
            else:
                spans.append(tokens[s:e].tolist())
        for text in backend.decode_batch(spans, skip_special_tokens=False):
            label = classify_rendered(text)
            domains.append(label.domain)
            langs.append(label.lang)
        if k % DROP_EVERY == DROP_EVERY - 1:
            fmt.drop_pages(table)
    return domains, langs


def fingerprint_of(sources: Iterable[str]) -> str:
    """xxh3-64 of texts, each length-prefixed (no two lists of texts hash alike by concatenation)."""
    h = xxhash.xxh3_64()
    for text in sources:
        data = text.encode("utf-8")
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


@lru_cache(maxsize=1)
def classifier_fingerprint() -> str:
    """What a label depends on: core/classify.py whole (rules, cue tables, thresholds), the code here that picks
    the text it reads (:func:`_prompt_spans`, :func:`label_table`, :data:`HEAD` / :data:`TAIL`) and py3langid's
    version (its model ships in the package)."""
    return fingerprint_of([inspect.getsource(classify), inspect.getsource(_prompt_spans), inspect.getsource(label_table),
                           f"{HEAD},{TAIL}", importlib.metadata.version("py3langid")])


# --- per-row labels cache (a shard with no recorded mix) -------------------------------------------------------
def _cache_file(checksum: str, cache: Path | None) -> Path:
    return Path(cache or cache_root()) / "mix" / f"{checksum}-{classifier_fingerprint()}.npz"


def _lang_codes(langs: list[str]) -> tuple[np.ndarray, list[str]]:
    codes = sorted(set(langs))
    index = {c: i for i, c in enumerate(codes)}
    return np.array([index[g] for g in langs], np.uint8), codes


def shard_labels(checksum: str, table: pa.Table, tokenizer: Any, cache: Path | None = None
                 ) -> tuple[list[str], list[str], bool]:
    """Every row's (domains, languages) of the shard file with checksum ``checksum`` (holding ``table``): from the
    cache, else labelled and cached. The last value says whether it was labelled here."""
    f = _cache_file(checksum, cache)
    if f.is_file():
        with np.load(f, allow_pickle=False) as z:
            if int(z["rows"]) == table.num_rows:
                codes = [str(c) for c in z["lang_codes"]]
                return [DOMAINS[i] for i in z["domain"]], [codes[i] for i in z["lang"]], False
    domains, langs = label_table(table, tokenizer)
    lang, codes = _lang_codes(langs or [UNDETERMINED])
    f.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(f) as tmp, open(tmp, "wb") as out:
        np.savez(out, rows=np.int64(table.num_rows), domain=np.array([DOMAINS.index(d) for d in domains], np.uint8),
                 lang=lang[: len(langs)], lang_codes=np.array(codes))
    return domains, langs, True


# --- a folder's recorded mix -----------------------------------------------------------------------------------
def read_record(folder: str | os.PathLike) -> dict[str, Mix]:
    """``mix.json`` of a dataset folder: shard checksum -> Mix; empty when absent or of another classifier."""
    path = Path(folder) / MIX_FILE
    if not path.is_file():
        return {}
    d = json.loads(path.read_text(encoding="utf-8"))
    if d.get("classifier") != classifier_fingerprint():
        return {}
    return {k: Mix.from_dict(v) for k, v in d["shards"].items()}


def write_record(folder: str | os.PathLike, entries: dict[str, Mix]) -> None:
    write_json(Path(folder) / MIX_FILE, {"classifier": classifier_fingerprint(),
                                         "shards": {k: entries[k].to_dict() for k in sorted(entries)}})


@dataclass
class FolderMix:
    """A dataset folder's mix: per shard (in row order) its checksum and Mix, and how each was obtained."""

    checksums: list[str]
    shards: list[Mix]
    recorded: int = 0  # from the folder's mix.json
    cached: int = 0  # from per-row labels cached by an earlier stage
    labelled: int = 0  # decoded and classified here
    rows_labelled: int = 0

    @property
    def total(self) -> Mix:
        out = Mix()
        for m in self.shards:
            out = out + m
        return out

    def entries(self) -> dict[str, Mix]:
        return dict(zip(self.checksums, self.shards))


def folder_shards(folder: str | os.PathLike) -> list[tuple[str, str | None]]:
    """``(file, recorded checksum or None)`` of every shard of a ``save_to_disk`` folder, in row order, verified
    (:func:`draftline.core.dataset.verified_shard_files`)."""
    meta, files = fmt.verified_shard_files(folder)
    return [(s.filename, s.xxh3_128) for s in meta.shards] if meta is not None else [(f, None) for f in files]


def num_tokens_of(table: pa.Table) -> np.ndarray:
    if "num_tokens" in table.column_names:
        return table.column("num_tokens").to_numpy().astype(np.int64)
    return pc.list_value_length(table.column("input_ids")).to_numpy(zero_copy_only=False).astype(np.int64)


def folder_mix(folder: str | os.PathLike, tokenizer: Any, cache: Path | None = None, keep_labels: bool = False
               ) -> tuple[FolderMix, list[tuple[list[str], list[str]]] | None]:
    """The mix of every shard of ``folder``: from its ``mix.json``, else per-row labels cached by checksum, else
    labelled now (and cached). With ``keep_labels`` also every shard's per-row labels (the record holds counts
    only, so then every shard's labels come from the cache or are labelled). ``tokenizer`` is only used to decode
    a shard that is neither recorded nor cached."""
    folder = Path(folder)
    items = [(folder / name, checksum, None) for name, checksum in folder_shards(folder)]
    return tables_mix(items, tokenizer, cache, read_record(folder), keep_labels)


def tables_mix(items: list[tuple[Path | None, str | None, pa.Table | None]], tokenizer: Any, cache: Path | None,
               record: dict[str, Mix], keep_labels: bool = False
               ) -> tuple[FolderMix, list[tuple[list[str], list[str]]] | None]:
    """:func:`folder_mix` over ``(shard file, its checksum or None, its table or None: mapped here)``; an item
    without a file (rows read from another trainer's format) is labelled without a record or a cache."""
    out = FolderMix([], [])
    labels: list[tuple[list[str], list[str]]] | None = [] if keep_labels else None
    for path, checksum, table in items:
        if path is not None and checksum is None:
            checksum = file_xxh3_128(path)
        out.checksums.append(checksum or "")
        if checksum in record and not keep_labels:
            out.shards.append(record[checksum])
            out.recorded += 1
            continue
        if table is None:
            assert path is not None
            table = fmt.mapped_shards(path.parent, [path.name])[0]
        if checksum:
            domains, langs, fresh = shard_labels(checksum, table, tokenizer, cache)
        else:
            (domains, langs), fresh = label_table(table, tokenizer), True
        out.shards.append(Mix.of_labels(domains, langs, num_tokens_of(table)))
        if fresh:
            out.labelled += 1
            out.rows_labelled += table.num_rows
        else:
            out.cached += 1
        if labels is not None:
            labels.append((domains, langs))
        fmt.drop_pages(table)
    return out, labels
