"""A target from a GGUF file: converted once into a Hugging Face folder that every later stage loads as it loads any
checkpoint (``AutoTokenizer`` / ``AutoModelForCausalLM``, local files only).

Invariants:
- Converted once, by the target stage, into ``model/`` of its folder, written at once or not at all (a temporary
  sibling renamed into place): a later stage never reads a GGUF, and a half-written folder never exists.
- Fingerprinted by the GGUF's bytes: the record (file name, sha256 streamed over every byte, size, dtype) goes to
  ``target.json: gguf``, and the sha256 is mixed into the model fingerprint, so another file gives another
  fingerprint even where its converted weights would come out the same (a metadata byte the conversion ignores).
- Conversion is byte-identical on rerun: the same GGUF, dtype and library versions give the same files.
- What transformers cannot load is refused in one line before any weight is read: the architecture is read with
  the ``gguf`` package's reader first. The ``gguf`` and ``accelerate`` packages come with ``pip install -e
  '.[gguf]'``; without them the conversion stops in one line naming that command.

transformers loads a GGUF dequantized (to the dtype asked for) but refuses to ``save_pretrained`` a model it loaded
from one (it keeps a GGUF "quantizer" on it); the weights are plain tensors by then, so the quantizer is dropped
before saving. Where transformers can keep the weights packed (5.x), the load asks for a dense model.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from draftline.core.errors import MissingInput, Refusal
from draftline.core.files import atomic_path
from draftline.core.fingerprint import sha256_file

SUFFIX = ".gguf"
DTYPES = ("float32", "bfloat16", "float16")
EXTRA = "pip install -e '.[gguf]'"
# Architecture names llama.cpp writes that transformers' GGUF loader reads under another name
# (transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint renames them the same way).
ARCHITECTURE_ALIASES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss",
                        "minimax-m2": "minimax_m2"}
# Sections of transformers' GGUF mapping that are not architectures.
NOT_ARCHITECTURES = ("general", "tokenizer")


@dataclass(frozen=True)
class GgufRecord:
    """``target.json: gguf``: which file the converted folder came from, and in which dtype."""

    file: str
    sha256: str
    bytes: int
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gguf_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(SUFFIX))


def find_gguf(path: str | os.PathLike) -> Path:
    """The GGUF file ``path`` names: the file itself, or the one ``.gguf`` in the folder ``path``."""
    path = Path(path)
    if path.is_file():
        if not path.name.endswith(SUFFIX):
            raise Refusal(f"target.path {path} is a file but not a {SUFFIX} file; give a GGUF file or a folder")
        return path
    if not path.is_dir():
        raise MissingInput(f"target.path {path} does not exist")
    found = gguf_files(path)
    if not found:
        raise MissingInput(f"target.path {path} holds no {SUFFIX} file")
    if len(found) > 1:
        raise Refusal(f"target.path {path} holds {len(found)} {SUFFIX} files ({', '.join(p.name for p in found)}); "
                      "name the one to use")
    return found[0]


def gguf_target(path: str | os.PathLike) -> Path | None:
    """The GGUF file when ``target.path`` names one: a path ending in ``.gguf``, or a folder holding ``.gguf`` files
    and no ``config.json`` (a Hugging Face folder is used in place, even one that ships a GGUF beside its weights).
    None otherwise."""
    path = Path(path)
    if path.name.endswith(SUFFIX):
        return find_gguf(path)
    if path.is_dir() and not (path / "config.json").is_file() and gguf_files(path):
        return find_gguf(path)
    return None


def _require_extra() -> None:
    for module in ("gguf", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            raise Refusal(f"a GGUF target needs the {module!r} package: {EXTRA}") from None


def gguf_architecture(file: str | os.PathLike) -> str:
    """``general.architecture`` of a GGUF file, read with the ``gguf`` package's reader (no tensor is read)."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(file).fields.get("general.architecture")
    except (ValueError, OSError) as e:
        raise Refusal(f"{file} is not a readable GGUF file ({e})") from None
    if field is None:
        raise Refusal(f"{file} has no general.architecture: not a model GGUF")
    return str(field.contents())


def check_architecture(file: str | os.PathLike) -> str:
    """The file's architecture, or a one-line refusal when transformers cannot load it."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = gguf_architecture(file)
    supported = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in NOT_ARCHITECTURES]
    if arch not in supported and ARCHITECTURE_ALIASES.get(arch) not in supported:
        raise Refusal(f"{Path(file).name}: GGUF architecture {arch!r} is not one transformers can load "
                      f"(it reads {', '.join(sorted(supported))}); convert the model to a Hugging Face folder another way")
    return arch


def _dense_kwargs() -> dict[str, Any]:
    """transformers 5 may keep GGUF weights packed (``GgufConfig(dequantize=False)``): ask for a dense model."""
    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers always dequantize
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _drop_quantizer(model) -> None:
    """Forget that the (already dequantized) model came from a GGUF, so that ``save_pretrained`` writes it."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)


def convert_gguf(gguf_file: str | os.PathLike, out_dir: str | os.PathLike, dtype: str) -> GgufRecord:
    """Write ``out_dir`` (at once or not at all): config, safetensors weights in ``dtype``, tokenizer and chat
    template of ``gguf_file``, as ``AutoModelForCausalLM`` / ``AutoTokenizer`` load them."""
    if dtype not in DTYPES:
        raise Refusal(f"target.gguf_dtype must be one of {list(DTYPES)}, not {dtype!r}")
    _require_extra()
    file = Path(gguf_file)
    arch = check_architecture(file)
    record = GgufRecord(file=file.name, sha256=sha256_file(file), bytes=file.stat().st_size, dtype=dtype)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, where = str(file.parent), dict(gguf_file=file.name, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(folder, **where)
    if not tok.chat_template:
        raise Refusal(f"{file.name} carries no chat template (tokenizer.chat_template): the stages render every "
                      "prompt with it")
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, **where, dtype=getattr(torch, dtype), **_dense_kwargs())
    except ValueError as e:  # e.g. an encoder-only architecture: no causal-LM class for it
        raise Refusal(f"{file.name}: transformers cannot load GGUF architecture {arch!r} as a causal LM "
                      f"({str(e).splitlines()[0]})") from None
    _drop_quantizer(model)
    with atomic_path(out_dir, "the converted GGUF target") as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return record


def gguf_model_fingerprint(model_fingerprint: str, gguf_sha256: str) -> str:
    """The converted folder's model fingerprint with the GGUF's sha256 mixed in."""
    return hashlib.sha256(f"{model_fingerprint}\0gguf={gguf_sha256}".encode("ascii")).hexdigest()
