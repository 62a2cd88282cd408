"""The journal key: what decides a result, hashed into the name of the journal's scratch folder.

Invariants:

- **Exactly what decides a result, nothing else.** The target (its tokenizer and model fingerprints; its path when
  it has no model fingerprint), the sampling params, the thinking mode and the backend; for the ``local`` backend
  also its settings but ``workers`` (``device: auto`` resolved: the device decides float results, so the key names
  the one actually used) and draftline's generation code, which then computes the replies; for a launched
  llama.cpp the engine, its version and the GGUF it serves (a GGUF target's sha256, else the type the target's
  folder is converted to: a quantised file answers otherwise than the float weights). Transport settings
  (endpoints, concurrency, retries, timeouts, the API key) never enter it: changing them resumes the same journal.
- **The ``dataset`` backend's key** holds no sampling (nothing is sampled) but a digest of every prompt's id and
  reference: its reply is the reference, which a prompt's id does not cover (the same prompt may come from another
  row of another source in another blend), and an ok journal entry is final, so another reference must mean another
  journal. The target stays in it: its tokenizer counts the tokens, and a backend in the key keeps a dataset run
  and a target run from ever reading each other's entries.
- **Its content never changes for the same settings.** A changed key orphans the users' journals (hours of SGLang
  results); a server's replies do not depend on draftline's code, so no edit of it throws them away.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import xxhash

from draftline.core.fingerprint import code_digest
from draftline.core.jsonl import dumps
from draftline.core.llama_cpp import VERSION as LLAMA_CPP_VERSION
from draftline.core.provenance import model_identity
from draftline.core.records import PromptRecord, TargetInfo
from draftline.generate.params import GenerateParams


def journal_decides(s: GenerateParams, info: TargetInfo, prompts: Sequence[PromptRecord],
                    target_json: str | os.PathLike | None = None) -> dict[str, Any]:
    """The journal key's content (``key.json`` beside the journal records it); ``prompts`` enter it only for the
    ``dataset`` backend, the served GGUF (``target_json``'s) only for a launched llama.cpp."""
    target = {"tokenizer_fingerprint": info.tokenizer_fingerprint,
              "model_fingerprint": model_identity(info)}
    if s.backend == "dataset":
        pairs = sorted([(p.id, p.reference) for p in prompts], key=lambda pair: pair[0])
        references = xxhash.xxh3_128_hexdigest(dumps(pairs).encode("utf-8"))
        return {"target": target, "enable_thinking": s.enable_thinking, "backend": s.backend,
                "references": references}
    decides: dict[str, Any] = {
        "target": target, "sampling": s.sampling, "enable_thinking": s.enable_thinking, "backend": s.backend,
    }
    if s.launch is not None and s.launch.engine == "llama.cpp" and target_json is not None:
        # llama.cpp serves a GGUF: a quantised target's own file, or the folder converted to gguf_type.
        decides["served"] = {"engine": "llama.cpp", "version": LLAMA_CPP_VERSION,
                             "gguf": source_gguf_sha256(target_json) or s.launch.llama_cpp.gguf_type}
    if s.backend == "local":
        local = s.local_dict()
        if local["device"] == "auto":
            import torch

            local["device"] = "cuda" if torch.cuda.is_available() else "cpu"
        decides["local"] = local
        decides["code"] = code_digest("draftline.core", "draftline.generate")
    return decides


def source_gguf_sha256(target_json: str | os.PathLike) -> str | None:
    """The sha256 ``target.json`` records for a GGUF target's file (None: a Hugging Face target)."""
    record = json.loads(open(target_json, encoding="utf-8").read()).get("gguf")
    return record["sha256"] if record else None
