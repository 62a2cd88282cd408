"""The ``target`` stage: describe the target model once, in its folder's ``target.json``, for every later stage.

``target.path`` is either a Hugging Face checkpoint folder, used in place (never copied; a folder with only
tokenizer files is enough for the CPU stages), a GGUF file (or a folder holding one): converted once into an HF
folder under ``model/`` in the stage's folder and fingerprinted by its bytes (``target.json: gguf``;
:mod:`draftline.target.from_gguf`), or ``embedded``: a tiny Qwen3-style target trained here from every source's
conversations and saved under ``model/`` in the stage's folder.

Later stages use :mod:`draftline.core.target_loader` (``load_target``, then ``load_tokenizer`` / ``load_model``): nothing
else needs to know where the target lives or whether it is the embedded one. The folder is written at once or
not at all.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.errors import MissingInput
from draftline.core.files import atomic_path, write_csv, write_json, write_jsonl
from draftline.core.logs import get_logger
from draftline.core.params import ParamsError
from draftline.core.records import CONVERSATIONS_FILE, Conversation, read_conversations
from draftline.core.runner import StageArgs, StageRun
from draftline.core.skips import Skips
from draftline.core.target_loader import TARGET_JSON, load_target
from draftline.target.describe import describe_target
from draftline.target.from_gguf import convert_gguf, gguf_model_fingerprint, gguf_target
from draftline.target.params import TargetParams

if TYPE_CHECKING:
    from draftline.target.embedded.build import EmbeddedBuild

log = get_logger("target")

EMBEDDED = "embedded"
MODEL_DIR = "model"
LOSS_COLUMNS = ["step", "loss", "lr", "tokens", "reply_tokens"]


def read_all_conversations(conversations_root: str | os.PathLike, skips: Skips) -> Iterator[Conversation]:
    """Every conversation of every source (``<conversations_root>/<name>/``, in name order): the embedded corpus."""
    files = sorted(Path(conversations_root).glob(f"*/{CONVERSATIONS_FILE}"))
    if not files:
        raise MissingInput(f"no */{CONVERSATIONS_FILE} under {conversations_root}: run `dvc repro conversations`")
    for file in files:
        yield from read_conversations(file, skips)


def _relative_path(path: str, target_dir: Path) -> str:
    """An absolute ``target.path`` is kept as given; a relative one is rewritten relative to ``target_dir``."""
    return path if os.path.isabs(path) else os.path.relpath(path, target_dir)


def write_target(
    params: TargetParams, target_dir: str | os.PathLike, conversations: Iterable[Conversation] = (),
    skips: Skips | None = None,
) -> EmbeddedBuild | None:
    """Write ``target_dir`` at once (or not at all): ``target.json``, and for the embedded target ``model/`` and
    ``held_out.jsonl`` (its greedy replies to the held-out prompts), trained on ``conversations`` (consumed only then);
    for a GGUF target ``model/``, converted from it, and ``target.json: gguf``. Returns the embedded build, if any.
    """
    target_dir = Path(target_dir)
    path, mask_token_id, hash_weights = params.path, params.mask_token_id, params.hash_weights
    build, extra = None, {}
    with atomic_path(target_dir) as tmp:
        tmp.mkdir()
        if path == EMBEDDED:
            # Imported here: torch costs every other stage seconds at start-up, and only this build needs it.
            from draftline.target.embedded.build import build_embedded_target

            if params.embedded is None:
                raise ParamsError("params.yaml: target.path is embedded but target.embedded is missing; add it")
            build = build_embedded_target(conversations, tmp / MODEL_DIR, params.embedded, params.seed, skips or Skips(log))
            info = describe_target(tmp / MODEL_DIR, mask_token_id, hash_weights, embedded=True)
            info.path = MODEL_DIR
            write_jsonl(tmp / "held_out.jsonl", build.samples)
        elif (gguf := gguf_target(path)) is not None:
            if params.gguf_dtype is None:
                raise ParamsError("params.yaml: target.path is a GGUF file but target.gguf_dtype is missing; add it")
            record = convert_gguf(gguf, tmp / MODEL_DIR, params.gguf_dtype)
            info = describe_target(tmp / MODEL_DIR, mask_token_id, hash_weights)
            info.model_fingerprint = gguf_model_fingerprint(info.model_fingerprint, record.sha256)
            info.path = MODEL_DIR
            # Where the file lies (as target.path is kept): what llama.cpp serves (core/target_loader.py: source_gguf).
            extra["gguf"] = {**record.to_dict(), "path": _relative_path(str(gguf), target_dir)}
        else:
            info = describe_target(path, mask_token_id, hash_weights)
            info.path = _relative_path(path, target_dir)
        write_json(tmp / TARGET_JSON, {**info.to_dict(), **extra})
    return build


@dataclass(frozen=True, kw_only=True)
class TargetArgs(StageArgs):
    """``stages/target.py``'s paths (dvc.yaml passes them)."""

    conversations: Path
    out: Path
    metrics: Path
    plot: Path


# What a build reports that depends on how fast this machine ran it, not on what it built.
RUN_FIELDS = ("train_s", "tokens_per_s", "wall_s")


def run_target(params: TargetParams, args: TargetArgs, stage: StageRun) -> None:
    """The stage: ``args.out``, its figures and the loss curve (empty for a real checkpoint)."""
    embedded = params.path == EMBEDDED
    conversations = read_all_conversations(args.conversations, stage.skips) if embedded else ()
    build = write_target(params, args.out, conversations, stage.skips)
    info = load_target(args.out / TARGET_JSON)
    results = {k: v for k, v in (build.metrics if build else {}).items() if k not in RUN_FIELDS}
    gguf = json.loads((args.out / TARGET_JSON).read_text(encoding="utf-8")).get("gguf")
    stage.details.update(results, embedded=info.embedded, num_hidden_layers=info.num_hidden_layers,
                         hidden_size=info.hidden_size, vocab_size=info.vocab_size, **({"gguf": gguf} if gguf else {}))
    stage.run.update({k: v for k, v in (build.metrics if build else {}).items() if k in RUN_FIELDS})
    if build:
        stage.headline.update(final_loss=results["final_loss"], **overall_held_out(build.samples))
    write_csv(args.plot, build.loss_curve if build else [], LOSS_COLUMNS)
    log.info("target: %s (%s layers, hidden %s, mask token %d)", info.path, info.num_hidden_layers, info.hidden_size,
             info.mask_token_id)


def overall_held_out(samples: list[dict]) -> dict[str, float]:
    """The held-out greedy replies over every source: the runaway share, and the well-formed tool-call share of those
    whose prompt offered tools."""
    tools = [s["tool_call"] for s in samples if s["tool_call"] is not None]
    return {"runaway": round(sum(s["runaway"] for s in samples) / max(1, len(samples)), 4),
            "tool_calls": round(sum(tools) / max(1, len(tools)), 4)}
