"""GGUF files written by the pinned llama.cpp's own converter: a target's Hugging Face folder, a DFlash drafter.

``convert_hf_to_gguf.py`` (:func:`draftline.core.llama_cpp.converter`) runs unchanged in a child process; a
drafter is converted with ``--target-model-dir`` (its tokenizer, embeddings and head are the target's).

The one thing this module adds is how a BPE tokenizer's pre-tokenizer is named. The converter recognises it by a
hash of the token ids it gives a fixed text, so a tokenizer with a vocabulary of its own (the embedded target's,
learned on the samples) is unknown to it even when it splits text by a rule llama.cpp implements. Where the hash is
unknown, the pre-tokenizer the tokenizer itself declares (``tokenizer.json``) is read, and named only when it is
exactly one llama.cpp knows (:data:`KNOWN_SPLITS`: the split regex word for word, then byte-level with no regex of
its own); anything else stays the converter's refusal. Whether llama.cpp then tokenizes as transformers does is
tested on rendered prompts (tests/core/test_gguf.py).

What llama.cpp serves (:func:`served_target`, :func:`served_drafter`): a GGUF target's own file, else the target's
folder and the drafter converted once into the scratch cache (:mod:`draftline.core.scratch`), keyed by their
content, the type and the llama.cpp version, each beside its sha256.

Invariants: an output is written under a temporary name and renamed when complete; a converter failure leaves
nothing behind and is raised with the end of its log; a cached conversion whose bytes no longer match its sha256 is
made again, never served.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

from draftline.core.errors import Refusal
from draftline.core.files import atomic_path
from draftline.core.fingerprint import sha256_file
from draftline.core.records import TargetInfo
from draftline.core.scratch import scratch_dir
from draftline.core.target_loader import load_target, source_gguf

# The split rules llama.cpp implements, by the regex their tokenizer.json declares, and the name the converter
# writes for them (tokenizer.ggml.pre). Qwen2's is also Qwen3's and the embedded target's.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
KNOWN_SPLITS = {QWEN2_SPLIT: "qwen2"}
OUTTYPES = ("f32", "f16", "bf16", "q8_0")
EXTRA = "pip install -e '.[llama]'"


def declared_pre_tokenizer(tokenizer_json: dict) -> str | None:
    """llama.cpp's name for the pre-tokenizer ``tokenizer.json`` declares, if it is exactly a known one: a
    ``Split`` by a regex of :data:`KNOWN_SPLITS` (isolated, not inverted), then ``ByteLevel`` without a regex."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return None
    split, byte_level = steps
    if (split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert")
            or byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex", True)
            or byte_level.get("add_prefix_space")):
        return None
    return KNOWN_SPLITS.get((split.get("pattern") or {}).get("Regex"))


def convert(model_dir: str | os.PathLike, out: str | os.PathLike, outtype: str,
            target_dir: str | os.PathLike | None = None) -> Path:
    """``model_dir`` (a Hugging Face folder; a drafter with ``target_dir``, its target's folder) as the GGUF file
    ``out`` in ``outtype`` (:data:`OUTTYPES`), by the pinned converter."""
    from draftline.core.llama_cpp import converter

    if outtype not in OUTTYPES:
        raise Refusal(f"GGUF type {outtype!r} is not one of {', '.join(OUTTYPES)}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        cmd = [sys.executable, "-m", "draftline.core.gguf", str(converter()), str(model_dir), "--outfile", str(tmp),
               "--outtype", outtype]
        if target_dir is not None:
            cmd += ["--target-model-dir", str(target_dir)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not Path(tmp).is_file():
            if "No module named" in done.stderr:
                raise Refusal(f"the GGUF converter lacks a package ({done.stderr.strip().splitlines()[-1]}): {EXTRA}")
            raise Refusal(f"converting {model_dir} to GGUF failed; the converter's log ends:\n{done.stderr[-2000:]}")
    return out


def _cached(model_dir: str | os.PathLike, decides: dict, outtype: str,
            target_dir: str | os.PathLike | None = None) -> Path:
    """``model_dir`` converted once into the scratch cache under ``decides`` (with the type and llama.cpp's
    version); reused while its bytes match the sha256 written beside it."""
    from draftline.core.llama_cpp import VERSION

    folder = scratch_dir("gguf", {**decides, "outtype": outtype, "llama_cpp": VERSION})
    out, digest = folder / "model.gguf", folder / "model.gguf.sha256"
    if out.is_file() and digest.is_file() and digest.read_text().strip() == sha256_file(out):
        return out
    convert(model_dir, out, outtype, target_dir)
    digest.write_text(sha256_file(out) + "\n")
    return out


def served_target(target_json: str | os.PathLike, outtype: str) -> Path:
    """The GGUF llama.cpp serves as the target: a GGUF target's own file (checked), else its folder converted."""
    if (own := source_gguf(target_json)) is not None:
        return own
    info = load_target(target_json)
    if info.model_fingerprint is None:
        raise Refusal(f"{info.path} holds no model weights (only a tokenizer): llama.cpp needs the whole target")
    return _cached(info.path, {"target": info.model_fingerprint, "tokenizer": info.tokenizer_fingerprint}, outtype)


def served_drafter(checkpoint: str | os.PathLike, info: TargetInfo, outtype: str) -> Path:
    """The drafter in ``checkpoint`` as the GGUF llama.cpp speculates with beside ``info``'s target (the caller
    checks that it fits the target first)."""
    checkpoint = Path(checkpoint)
    files = {f.name: sha256_file(f) for f in sorted(checkpoint.iterdir()) if f.is_file()}
    return _cached(checkpoint, {"drafter": files, "target": info.model_fingerprint}, outtype, target_dir=info.path)


def _run_converter(converter: Path, argv: list[str]) -> None:
    """Run ``converter`` as ``__main__`` with ``argv``, its own gguf-py first on the path (as it does itself), and
    an unknown BPE hash answered by :func:`declared_pre_tokenizer`."""
    sys.path[:0] = [str(converter.parent / "gguf-py"), str(converter.parent)]
    from conversion.base import TextModel

    by_hash = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return by_hash(self, tokenizer)
        except NotImplementedError:
            name = declared_pre_tokenizer(json.loads(tokenizer.backend_tokenizer.to_str()))
            if name is None:
                raise
            print(f"draftline: pre-tokenizer {name!r}, as the tokenizer declares it", file=sys.stderr)
            return name

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [str(converter), *argv]
    runpy.run_path(str(converter), run_name="__main__")


if __name__ == "__main__":
    _run_converter(Path(sys.argv[1]), sys.argv[2:])
