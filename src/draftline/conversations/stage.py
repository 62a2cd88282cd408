"""The ``conversations@<name>`` stage: one source's raw folder -> its folder of conversations.

The folder holds ``conversations.jsonl`` (one :class:`Conversation` per readable row, answers included, in raw
row order) and ``stats.json`` (rows read, skips by reason, media parts dropped), written together or not at all.
Every row the adapter cannot read is a counted skip (``conversations.strict`` stops at the first instead); a
source that yields no conversation is logged as a warning. The adapter and its options come from
``sources.<name>``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from draftline.conversations.adapters import iter_conversations, make_adapter
from draftline.conversations.params import ConversationsSettings
from draftline.core.errors import MissingInput
from draftline.core.files import atomic_path, write_json
from draftline.core.logs import get_logger
from draftline.core.raw import RAW_FILE
from draftline.core.records import CONVERSATIONS_FILE, CONVERSATIONS_STATS_FILE
from draftline.core.runner import StageArgs, StageRun
from draftline.core.source_spec import entry_name


@dataclass(frozen=True, kw_only=True)
class ConversationsArgs(StageArgs):
    """``stages/conversations.py``'s arguments (dvc.yaml passes them); ``source`` is the params entry, as for
    ``stages/sources.py``."""

    source: str
    raw: Path
    out: Path

    @property
    def label(self) -> str:
        return f"conversations@{entry_name(self.source)}"


def run_conversations(p: ConversationsSettings, args: ConversationsArgs, stage: StageRun) -> None:
    """Adapt every row of the source into ``args.out`` (conversations and their reading counts)."""
    spec, params, name = p.spec, p.params, entry_name(args.source)
    log = get_logger(args.label)
    make_adapter(spec.adapter, spec.options, params.multimodal)  # a bad adapter or option fails before any work
    if not (args.raw / RAW_FILE).is_file():
        raise MissingInput(f"{args.raw / RAW_FILE} is missing: run `dvc repro sources@{name}` first")
    stage.skips.strict = params.strict
    counts: Counter[str] = Counter()
    convs = iter_conversations(name, spec.adapter, args.raw, stage.skips, options=spec.options,
                               multimodal=params.multimodal, stats=counts)
    written = 0
    with atomic_path(args.out) as tmp:
        tmp.mkdir()
        with open(tmp / CONVERSATIONS_FILE, "w", encoding="utf-8") as f:
            for conv in tqdm(convs, desc=args.label, unit=" rows", mininterval=2.0):
                f.write(conv.to_json() + "\n")
                written += 1
        if not written:
            # Not an error: a blend may give the source weight 0; the prompt stage's table shows it at zero too.
            log.warning("source %s gave no conversations with adapter %r (%d rows read, skipped: %s); check the "
                        "adapter and its options", name, spec.adapter, counts["rows"], stage.skips.as_dict())
        # Data the prompt stage reads (its per-source table), written with the folder.
        write_json(tmp / CONVERSATIONS_STATS_FILE, {
            "adapter": spec.adapter, "rows_read": counts["rows"], "conversations": written,
            "skipped": stage.skips.as_dict(), "media_parts_dropped": counts["media_parts_dropped"]})
    stage.headline.update(rows=written)
    stage.details.update(adapter=spec.adapter, rows_read=counts["rows"], conversations=written,
                         media_parts_dropped=counts["media_parts_dropped"])
    log.info("%s: %d conversations from %d rows (skipped %s)", args.label, written, counts["rows"],
             stage.skips.as_dict())
