"""The ``prompts`` stage: every source's conversations -> ``train.jsonl`` + ``eval.jsonl``, metrics and the mix plot.

Order of work: cut a prompt out of every conversation (bad ones counted per reason), exact dedup, near dedup,
eval split, blend. Every check that can fail (config, feasibility of the blend) runs before anything is written,
and the two JSONL files appear together or not at all. Sources are taken in ``params.yaml: sources`` order, which
also breaks ties in dedup priority; token costs render prompts as generation will (``generate.enable_thinking``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from draftline.core.errors import MissingInput
from draftline.core.files import atomic_path, write_csv
from draftline.core.logs import get_logger
from draftline.core.params import ParamsError
from draftline.core.records import (
    CONVERSATIONS_FILE,
    CONVERSATIONS_STATS_FILE,
    EVAL_FILE,
    TRAIN_FILE,
    PromptRecord,
    read_conversations,
)
from draftline.core.runner import StageArgs, StageRun
from draftline.core.skips import RowError, Skips
from draftline.core.target import load_target, load_tokenizer
from draftline.prompts.blend import Pool, hash_rank, select, source_plan, split_eval
from draftline.prompts.canonical import cut_prompt, user_text
from draftline.prompts.costs import token_costs
from draftline.prompts.dedup import MinHasher, exact_duplicates, near_duplicates, number_key, survivor_order
from draftline.prompts.params import BlendParams, DedupParams, PromptsParams, PromptsSettings
from draftline.prompts.report import SourceReport, build_metrics, format_table, plot_rows

log = get_logger("draftline.prompts")


def _check_names(sources: Sequence[str], dedup: DedupParams, blend: BlendParams) -> None:
    """Sources named in dedup and blend must be in ``params.yaml: sources``: fail before reading a row."""
    source_plan(sources, blend.sources)
    for key, names in (("priority", dedup.priority), ("near.exact_numbers", dedup.near.exact_numbers)):
        unknown = sorted(set(names) - set(sources))
        if unknown:
            raise ParamsError(f"params.yaml: dedup.{key} names {unknown}, which are not in params.yaml: sources")


def collect(
    sources: Sequence[str], prompts: PromptsParams, conversations_root: str | os.PathLike
) -> tuple[list[PromptRecord], dict[str, SourceReport]]:
    """A prompt cut out of every source's conversations; reading and cutting skips counted in the reports."""
    records: list[PromptRecord] = []
    reports = {name: SourceReport() for name in sources}
    for name in sources:
        folder = Path(conversations_root) / name
        if not (folder / CONVERSATIONS_FILE).is_file():
            raise MissingInput(f"{folder / CONVERSATIONS_FILE} is missing: run `dvc repro conversations@{name}`")
        read = json.loads((folder / CONVERSATIONS_STATS_FILE).read_text(encoding="utf-8"))
        skips = Skips(get_logger(f"draftline.prompts.{name}"), strict=prompts.strict)
        skips.counts.update(read["skipped"])
        before = len(records)
        for conv in tqdm(read_conversations(folder / CONVERSATIONS_FILE, skips), desc=f"prompts {name}",
                         unit=" rows", mininterval=2.0):
            try:
                records.append(cut_prompt(conv, prompts.turns))
            except RowError as e:
                skips.add(e.reason, f"{name} row {conv.row}", e.detail)
        r = reports[name]
        r.rows_read, r.skipped, r.media_parts_dropped = read["rows_read"], skips.counts, read["media_parts_dropped"]
        r.prompts = len(records) - before
        if r.prompts == 0:
            log.warning("source %s gave no usable prompts (%d rows read, skipped: %s)", name, r.rows_read, skips.as_dict())
    return records, reports


def deduplicate(
    records: list[PromptRecord], reports: dict[str, SourceReport], dedup: DedupParams, source_order: Sequence[str]
) -> list[PromptRecord]:
    """Exact, then near-duplicate removal; counts per source; survivors in input order."""
    priority = list(dedup.priority) + [s for s in source_order if s not in dedup.priority]
    names = [r.source for r in records]
    ids = [r.id for r in records]
    gone = set(exact_duplicates(names, ids, [r.row for r in records], priority))
    for i in gone:
        reports[names[i]].exact_duplicates += 1
    kept = [r for i, r in enumerate(records) if i not in gone]
    near = dedup.near
    if not near.enabled or not kept:
        return kept
    exact_numbers = set(near.exact_numbers)
    hasher = MinHasher(near)
    shingles, keys = [], []
    for r in tqdm(kept, desc="near-dup signatures", unit=" prompts", mininterval=2.0):
        text = user_text(r)
        shingles.append(hasher.shingles(text, normalize_numbers=r.source not in exact_numbers))
        keys.append(number_key(text) if r.source in exact_numbers else b"")
    sigs = hasher.signatures(shingles)
    order = survivor_order([r.source for r in kept], [r.id for r in kept], [r.row for r in kept], priority)
    dup_of = near_duplicates(sigs, [len(s) > 0 for s in shingles], keys, order, near.threshold)
    for i in dup_of:
        reports[kept[i].source].near_duplicates += 1
    return [r for i, r in enumerate(kept) if i not in dup_of]


class Costs:
    """Token costs of prompts (prompt + reference under the target tokenizer), each computed once, on demand."""

    def __init__(self, records: list[PromptRecord], tokenizer: Any, enable_thinking: bool):
        self.by_id = {r.id: r for r in records}
        self.tokenizer, self.enable_thinking = tokenizer, enable_thinking
        self.tokens: dict[str, int] = {}

    def __call__(self, ids: list[str]) -> list[int]:
        todo = [self.by_id[i] for i in ids if i not in self.tokens]
        for r, p, ref in zip(todo, *token_costs(todo, self.tokenizer, self.enable_thinking)):
            self.tokens[r.id] = p + ref
        return [self.tokens[i] for i in ids]


def blend_rows(
    kept: list[PromptRecord], reports: dict[str, SourceReport], blend: BlendParams, order: Sequence[str], cost: Costs
) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """``(train, eval)``: the eval split and the blend's train rows, each in source order then row order."""
    plan = source_plan(order, blend.sources)
    by_source: dict[str, list[PromptRecord]] = {name: [] for name in order}
    for r in kept:
        by_source[r.source].append(r)
    pools = []
    for name in order:
        ranked = sorted(by_source[name], key=lambda r: (hash_rank(blend.seed, r.id), r.id))
        eval_ids, train_ids = split_eval([r.id for r in ranked], blend.eval_per_source)
        costs = cost(train_ids) if blend.unit == "tokens" else [1] * len(train_ids)
        pools.append(Pool(name, train_ids, costs, eval_ids=eval_ids, **plan[name]))
        reports[name].available, reports[name].eval_rows = len(ranked), len(eval_ids)
    selection = select(pools, blend.total, blend.unit)
    train: list[PromptRecord] = []
    for pool in pools:
        chosen = selection.train_ids[pool.name]
        reports[pool.name].requested = selection.requested[pool.name]
        reports[pool.name].train_rows = len(chosen)
        reports[pool.name].train_tokens = sum(cost(chosen))
        train += [cost.by_id[i] for i in chosen]
    eval_ = [cost.by_id[i] for name in order for i in selection.eval_ids[name]]
    position = {name: i for i, name in enumerate(order)}
    train.sort(key=lambda r: (position[r.source], r.row))
    eval_.sort(key=lambda r: (position[r.source], r.row))
    return train, eval_


def _write_outputs(out_dir: Path, train: list[PromptRecord], eval_: list[PromptRecord]) -> None:
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        for fname, rows in ((TRAIN_FILE, train), (EVAL_FILE, eval_)):
            with open(tmp / fname, "w", encoding="utf-8") as f:
                for r in rows:
                    f.write(r.to_json() + "\n")


@dataclass(frozen=True, kw_only=True)
class PromptsArgs(StageArgs):
    """``stages/prompts.py``'s paths (dvc.yaml passes them)."""

    conversations: Path
    target: Path
    out: Path
    metrics: Path
    plot: Path


def run_prompts(p: PromptsSettings, args: PromptsArgs, stage: StageRun) -> None:
    """The whole stage over ``p.sources`` (names, in params.yaml order). Raises before writing anything when the
    blend is infeasible."""
    order = list(p.sources)
    _check_names(order, p.dedup, p.blend)
    records, reports = collect(order, p.prompts, args.conversations)
    kept = deduplicate(records, reports, p.dedup, order)
    cost = Costs(kept, load_tokenizer(load_target(args.target)), p.enable_thinking)
    train, eval_ = blend_rows(kept, reports, p.blend, order, cost)
    _write_outputs(args.out, train, eval_)
    details = build_metrics(reports, p.blend.unit, p.blend.total)
    for r in reports.values():
        stage.skips.counts.update(r.skipped)
    stage.details.update(details)
    stage.headline.update(rows=details["train_rows"], tokens=details["train_tokens"], eval_rows=details["eval_rows"],
                          duplicates=sum(r.exact_duplicates + r.near_duplicates for r in reports.values()))
    write_csv(args.plot, plot_rows(details))
    print(format_table(details), flush=True)
    log.info("wrote %d train and %d eval prompts to %s", len(train), len(eval_), args.out)
