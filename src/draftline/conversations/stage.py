"""The ``conversations@<name>`` stage: ``data/raw/<name>`` -> ``data/conversations/<name>/``.

The folder holds ``conversations.jsonl`` (one :class:`Conversation` per readable row, answers included, in raw
row order) and ``stats.json`` (rows read, skips by reason, media parts dropped), written together or not at all.
Every row the adapter cannot read is a counted skip (``conversations.strict`` stops at the first instead); a
source that yields no conversation is logged as a warning. The adapter and its options come from
``sources.<name>``.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

from draftline.conversations.adapters import iter_conversations, make_adapter
from draftline.core.files import atomic_path, write_json
from draftline.core.logs import get_logger
from draftline.core.params import Params
from draftline.core.raw import RAW_FILE
from draftline.core.records import CONVERSATIONS_FILE, CONVERSATIONS_STATS_FILE
from draftline.core.skips import Skips
from draftline.core.source_spec import SourceSpec


@dataclass(frozen=True)
class ConversationsParams(Params):
    """``params.yaml: conversations`` (documented there and in docs/conversations.md)."""

    multimodal: Literal["drop", "skip"]
    strict: bool


def run_conversations(
    name: str,
    spec: SourceSpec,
    params: ConversationsParams,
    raw_root: str | os.PathLike = "data/raw",
    out_root: str | os.PathLike = "data/conversations",
    metrics_root: str | os.PathLike = "metrics/conversations",
) -> dict[str, Any]:
    """Adapt every row of source ``name``; write its folder and ``metrics_root/<name>.json``; return the stats."""
    started = time.perf_counter()
    log = get_logger(f"conversations.{name}")
    make_adapter(spec.adapter, spec.options, params.multimodal)  # a bad adapter or option fails before any work
    raw_dir = Path(raw_root) / name
    if not (raw_dir / RAW_FILE).is_file():
        raise FileNotFoundError(f"{raw_dir / RAW_FILE} is missing: run `dvc repro sources@{name}` first")
    skips = Skips(log, strict=params.strict)
    counts: Counter[str] = Counter()
    convs = iter_conversations(name, spec.adapter, raw_dir, skips, options=spec.options,
                               multimodal=params.multimodal, stats=counts)
    written = 0
    with atomic_path(Path(out_root) / name) as tmp:
        tmp.mkdir()
        with open(tmp / CONVERSATIONS_FILE, "w", encoding="utf-8") as f:
            for conv in tqdm(convs, desc=f"conversations@{name}", unit=" rows", mininterval=2.0):
                f.write(conv.to_json() + "\n")
                written += 1
        if not written:
            # Not an error: a blend may give the source weight 0; the prompt stage's table shows it at zero too.
            log.warning("source %s gave no conversations with adapter %r (%d rows read, skipped: %s); check the "
                        "adapter and its options", name, spec.adapter, counts["rows"], skips.as_dict())
        stats = {"adapter": spec.adapter, "rows_read": counts["rows"], "conversations": written,
                 "skipped": skips.as_dict(), "media_parts_dropped": counts["media_parts_dropped"]}
        write_json(tmp / CONVERSATIONS_STATS_FILE, stats)
    # The time goes to the metrics only: the folder's stats.json is data, the same bytes on every run.
    write_json(Path(metrics_root) / f"{name}.json", {**stats, "stage_seconds": round(time.perf_counter() - started, 2)})
    log.info("conversations@%s: %d conversations from %d rows (skipped %s)", name, written, counts["rows"],
             skips.as_dict())
    return stats
