"""The ``target`` stage: describe the target model once, in ``data/target/target.json``, for every later stage.

``target.path`` is either a Hugging Face checkpoint folder, used in place (never copied; a folder with only
tokenizer files is enough for the CPU stages), or ``embedded``: a tiny Qwen3-style target trained here from the
sources' conversations (``data/conversations/*``) and saved under ``data/target/model/``.

Later stages use :mod:`draftline.core.target` (``load_target``, then ``load_tokenizer`` / ``load_model``): nothing
else needs to know where the target lives or whether it is the embedded one. ``data/target`` is written at once
or not at all.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.files import atomic_path, write_csv, write_json, write_jsonl
from draftline.core.logs import get_logger
from draftline.core.params import Params, optional
from draftline.core.records import CONVERSATIONS_FILE, Conversation, TargetInfo, read_conversations
from draftline.core.skips import Skips
from draftline.core.target import TARGET_JSON, load_target
from draftline.target.describe import describe_target
from draftline.target.embedded.params import EmbeddedParams

if TYPE_CHECKING:
    from draftline.target.embedded.build import EmbeddedBuild

log = get_logger("target")

EMBEDDED = "embedded"
MODEL_DIR = "model"
LOSS_COLUMNS = ["step", "loss", "lr", "tokens", "reply_tokens"]


@dataclass(frozen=True)
class TargetParams(Params):
    """``params.yaml: target`` (documented there and in docs/target.md)."""

    path: str
    mask_token_id: int | None
    hash_weights: bool
    seed: int
    # Read only for the embedded target: a real checkpoint's params.yaml may leave it out.
    embedded: EmbeddedParams | None = optional()


def read_all_conversations(conversations_root: str | os.PathLike, skips: Skips) -> Iterator[Conversation]:
    """Every conversation of every source (``data/conversations/<name>/``, in name order): the embedded corpus."""
    files = sorted(Path(conversations_root).glob(f"*/{CONVERSATIONS_FILE}"))
    if not files:
        raise FileNotFoundError(f"no */{CONVERSATIONS_FILE} under {conversations_root}: run `dvc repro conversations`")
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
    ``held_out.jsonl`` (its greedy replies to the held-out prompts), trained on ``conversations`` (consumed only then). Returns the embedded build, if any.
    """
    target_dir = Path(target_dir)
    path, mask_token_id, hash_weights = params.path, params.mask_token_id, params.hash_weights
    build = None
    with atomic_path(target_dir) as tmp:
        tmp.mkdir()
        if path == EMBEDDED:
            # Imported here: torch costs every other stage seconds at start-up, and only this build needs it.
            from draftline.target.embedded.build import build_embedded_target

            if params.embedded is None:
                raise ValueError("params.yaml: target.path is embedded but target.embedded is missing; add it")
            build = build_embedded_target(conversations, tmp / MODEL_DIR, params.embedded, params.seed, skips or Skips(log))
            info = describe_target(tmp / MODEL_DIR, mask_token_id, hash_weights, embedded=True)
            info.path = MODEL_DIR
            write_jsonl(tmp / "held_out.jsonl", build.samples)
        else:
            info = describe_target(path, mask_token_id, hash_weights)
            info.path = _relative_path(path, target_dir)
        write_json(tmp / TARGET_JSON, info.to_dict())
    return build


def run_target(
    params: TargetParams,
    target_dir: str | os.PathLike = "data/target",
    conversations_root: str | os.PathLike = "data/conversations",
    metrics_path: str | os.PathLike = "metrics/target.json",
    plot_path: str | os.PathLike = "plots/target_loss.csv",
) -> TargetInfo:
    """The stage: ``target_dir``, its metrics and the loss curve (empty for a real checkpoint)."""
    t0 = time.perf_counter()
    skips = Skips(log)
    conversations = read_all_conversations(conversations_root, skips) if params.path == EMBEDDED else ()
    build = write_target(params, target_dir, conversations, skips)
    info = load_target(target_dir)
    metrics = dict(build.metrics) if build else {}
    metrics.update(
        embedded=info.embedded, num_hidden_layers=info.num_hidden_layers, hidden_size=info.hidden_size,
        vocab_size=info.vocab_size, skipped=skips.as_dict(), stage_seconds=round(time.perf_counter() - t0, 2),
    )
    write_json(metrics_path, metrics)
    write_csv(plot_path, build.loss_curve if build else [], LOSS_COLUMNS)
    log.info("target: %s (%s layers, hidden %s, mask token %d)", info.path, info.num_hidden_layers, info.hidden_size, info.mask_token_id)
    return info
