"""Content fingerprints of a checkpoint folder: what decides whether data made with one target fits another.

A fingerprint depends on file names and bytes only, never on the folder's path or timestamps, so the same
tokenizer copied anywhere has the same fingerprint and a single changed merge rule gives a different one. The cheap
model fingerprint (``hash_weights=False``) reads a fixed sample of each weight file's bytes (:func:`sampled_sha256`):
the same file copied anywhere keeps it, and weights differing in a sampled byte change it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import xxhash

from draftline.core.errors import MissingInput, Refusal

# Every file transformers may read to build a tokenizer or its chat template (the rest of a folder is weights).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
)
# Named templates that transformers 5 keeps beside chat_template.jinja.
EXTRA_TEMPLATES_DIR = "additional_chat_templates"
MODEL_FILES = ("config.json", "generation_config.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def template_sha256(template: str | dict[str, str] | None) -> str:
    """sha256 of a chat template; named templates (a dict) are hashed as canonical JSON."""
    if template is None:
        raise Refusal("the tokenizer has no chat template; add chat_template.jinja to the target folder")
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True, ensure_ascii=False)
    return sha256_bytes(text.encode("utf-8"))


def _digest(entries: list[tuple[str, str]]) -> str:
    """One sha256 over ``(name, sha256)`` pairs, in name order, so that listing order never matters."""
    h = hashlib.sha256()
    for name, digest in sorted(entries):
        h.update(name.encode("utf-8") + b"\0" + digest.encode("ascii") + b"\n")
    return h.hexdigest()


def tokenizer_files(folder: str | os.PathLike) -> list[Path]:
    folder = Path(folder)
    found = [folder / n for n in TOKENIZER_FILES if (folder / n).is_file()]
    extra = folder / EXTRA_TEMPLATES_DIR
    if extra.is_dir():
        found += sorted(p for p in extra.iterdir() if p.is_file())
    return found


def tokenizer_fingerprint(folder: str | os.PathLike, chat_template: str | dict[str, str] | None) -> str:
    """sha256 over every tokenizer file of ``folder`` and the chat template the tokenizer actually uses.

    The template is hashed on its own as well because transformers can take it from several places
    (tokenizer_config.json, chat_template.jinja, chat_template.json); whichever it used is what counts.
    """
    folder = Path(folder)
    entries = [(p.relative_to(folder).as_posix(), sha256_file(p)) for p in tokenizer_files(folder)]
    if not entries:
        raise MissingInput(f"{folder} holds no tokenizer files (looked for {', '.join(TOKENIZER_FILES)})")
    entries.append(("<chat_template>", template_sha256(chat_template)))
    return _digest(entries)


def weight_files(folder: str | os.PathLike) -> list[Path]:
    folder = Path(folder)
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


# The cheap fingerprint's sample of a weight file: its first and last MiB (a safetensors or GGUF header names every
# tensor and its shape; the ends hold the first and last tensors) and SAMPLE_BLOCKS blocks spread evenly between.
# Bytes, not mtime: a copy (cp, rsync, a download) keeps them, so the same weights keep their fingerprint anywhere.
# About 6 MiB a file: a 50 GB checkpoint's sample reads in about a second, where every byte takes half a minute.
SAMPLE_EDGE = 1 << 20
SAMPLE_BLOCKS = 64
SAMPLE_BLOCK = 1 << 16


def sampled_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's size and a fixed sample of its bytes (every byte when the file is no larger than the
    sample); the sample's offsets depend on the size alone, so equal files give equal digests wherever they lie."""
    size = os.path.getsize(path)
    h = hashlib.sha256(f"size={size}\n".encode())
    middle = size - 2 * SAMPLE_EDGE
    if middle <= SAMPLE_BLOCKS * SAMPLE_BLOCK:
        return hash_file(h, path).hexdigest()
    starts = [0, *(SAMPLE_EDGE + middle * i // SAMPLE_BLOCKS for i in range(SAMPLE_BLOCKS)), size - SAMPLE_EDGE]
    lengths = [SAMPLE_EDGE, *[SAMPLE_BLOCK] * SAMPLE_BLOCKS, SAMPLE_EDGE]
    with open(path, "rb") as f:
        for start, length in zip(starts, lengths):
            f.seek(start)
            h.update(f.read(length))
    return h.hexdigest()


def model_fingerprint(folder: str | os.PathLike, hash_weights: bool = True) -> str | None:
    """sha256 over config, weight index and weights; None for a folder without weights (tokenizer only).

    ``hash_weights=False`` reads each weight file's size and a fixed sample of its bytes (:func:`sampled_sha256`)
    instead of every byte: two checkpoints whose weights differ in a sampled byte (any training run or fine-tune,
    which moves nearly every tensor) get different fingerprints; an edit confined to bytes between the samples
    (one small tensor changed) is missed, which only ``hash_weights=True`` guarantees to see.
    """
    folder = Path(folder)
    weights = weight_files(folder)
    if not weights:
        return None
    entries: list[tuple[str, Any]] = [
        (n, sha256_file(folder / n)) for n in MODEL_FILES + WEIGHT_INDEXES if (folder / n).is_file()
    ]
    for p in weights:
        entries.append((p.name, sha256_file(p) if hash_weights else f"sampled={sampled_sha256(p)}"))
    return _digest(entries)


# Files are hashed in pieces this large: few calls (xxh3 runs at many GB/s, so hashing is disk-bound), bounded memory.
READ_BYTES = 1 << 24


def hash_file(h: Any, path: str | os.PathLike) -> Any:
    """Feed a file's bytes to the hash object ``h`` (anything with ``update``), a piece at a time; returns ``h``."""
    with open(path, "rb") as f:
        while chunk := f.read(READ_BYTES):
            h.update(chunk)
    return h


def file_xxh3_128(path: str | os.PathLike) -> str:
    """xxh3-128 of a file's bytes: a shard's checksum."""
    return hash_file(xxhash.xxh3_128(), path).hexdigest()


def folder_fingerprint(folder: str | os.PathLike, filenames: list[str]) -> str:
    """xxh3-64 over the shards' names and bytes: the ``_fingerprint`` ``datasets`` keys its caches by."""
    h = xxhash.xxh3_64()
    for name in filenames:
        h.update(name.encode())
        hash_file(h, Path(folder) / name)
    return h.hexdigest()


def folder_digest(path: str | os.PathLike, suffixes: tuple[str, ...] | None = None) -> str:
    """xxh3-128 over every file's relative name and bytes, in sorted order (HF cache files and bytecode excluded);
    ``suffixes`` keeps only files ending so."""
    h = xxhash.xxh3_128()
    root = Path(path)
    files = sorted(
        p for p in root.rglob("*")
        if p.is_file() and not p.name.startswith("cache-") and "__pycache__" not in p.parts
        and (suffixes is None or p.name.endswith(suffixes))
    )
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0")
        hash_file(h, p)
    return h.hexdigest()


def code_digest(*packages: str) -> str:
    """xxh3-128 over the source of the named packages (``draftline.train``, ...): part of a scratch key, so that
    progress made by other code is never resumed (DVC reruns a stage whose code changed; its scratch must not then
    hand back the old result)."""
    import importlib

    parts = []
    for name in packages:
        (folder,) = importlib.import_module(name).__path__
        parts.append(f"{name}={folder_digest(folder, ('.py', '.jinja'))}")
    return xxhash.xxh3_128_hexdigest("\n".join(parts).encode())
