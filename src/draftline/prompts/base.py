"""The base the new rows will be merged onto (``merge.base``), as the prompt stage sees it: its recorded content mix
(what a target mix and the domain cap count) and its rows' prompt ids.

Its prompt ids leave the train pool after the eval split, so that the eval prompts are those of every round (the
split never depends on the base) and no new prompt repeats one the base already holds (the merge would drop it: a
wasted generation). Both readers open the base through the one verified path (``core.dataset``): a damaged base is
refused before any of it is read.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from draftline.core.dataset import mapped_shards, verified_shard_files
from draftline.core.errors import MissingInput
from draftline.core.logs import get_logger
from draftline.core.mix import Mix, folder_mix
from draftline.core.runner import StageRun

log = get_logger("draftline.prompts")


def base_mix(base: str | None, tokenizer: Any, stage: StageRun, needed: bool) -> Mix:
    """The recorded mix of ``merge.base`` (labelled here, once, where nothing is recorded); empty without a base.
    A base that is not a ``save_to_disk`` folder (another trainer's export) has no shards to key a record by: it
    is left out of the report, and refused where ``needed`` (a target mix or a domain cap counts it)."""
    if base is None:
        return Mix()
    if not (Path(base) / "state.json").is_file():
        if needed:
            raise MissingInput(f"merge.base {base} is not a datasets save_to_disk folder, so its mix is unknown to "
                               "blend.target_mix and blend.max_domain_share: merge it once (its merged folder "
                               "records its mix) and use that as merge.base, or set both to null")
        log.warning("merge.base %s is not a save_to_disk folder: the report's mix leaves it out", base)
        return Mix()
    started = time.perf_counter()
    fm, _ = folder_mix(base, tokenizer)
    stage.run["base_mix"] = {"shards_recorded": fm.recorded, "shards_cached": fm.cached, "shards_labelled": fm.labelled,
                             "rows_labelled": fm.rows_labelled, "seconds": round(time.perf_counter() - started, 2)}
    log.info("merge.base %s: mix of %d shards (%d recorded, %d cached, %d labelled now)", base, len(fm.checksums),
             fm.recorded, fm.cached, fm.labelled)
    return fm.total


def base_prompt_ids(base: str | None) -> frozenset[str]:
    """The prompt ids of ``merge.base``'s rows (a row's id is its prompt's); empty without a base, or for a base in
    another trainer's layout (no ids: the merge still drops its prompts by content)."""
    if base is None or not (Path(base) / "draftline.json").is_file():
        return frozenset()
    _, files = verified_shard_files(base)  # a damaged base is refused here, as by every reader of a dataset
    return frozenset(i for t in mapped_shards(base, files) for i in t.column("id").to_pylist())
