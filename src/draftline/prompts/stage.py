"""The ``prompts`` stage: every source's conversations -> ``train.jsonl`` + ``eval.jsonl``, metrics and the mix plot.

Order of work: cut a prompt out of every conversation (bad ones counted per reason; ``canonical``), exact dedup,
near dedup (``dedup``), decontamination against every evaluation prompt (``decontaminate``: the benchmark sets, the
held-out prompts, ``decontaminate.extra``; hits counted as the skip ``contaminated``), the eval split and the
blend by source weights (``blend``), or aimed at
``blend.target_mix`` for the merged set counting the recorded mix of ``merge.base`` (``aim``, ``base``), steered
by a previous round's dev figures (``steer``), then the ``blend.max_domain_share`` guard. Every prompt kept gets a
domain and a language (:mod:`draftline.core.classify`); the report gives them per source, for the base, the new rows
and the merged set (``report``). Every check that can fail (config, feasibility of the blend, the steering
evaluation) runs before anything is written, and the two JSONL files appear together or not at all. Sources are
taken in ``params.yaml: sources`` order, which also breaks ties in dedup priority; token costs render prompts as
generation will (``generate.enable_thinking``; ``costs``). What the target's chat template cannot render is settled
first (``template``): ``generate.enable_thinking`` without a thinking mode is refused before a row is read, and
prompts offering tools under a template without tools are refused or dropped (``prompts.tools_unsupported``)
before dedup, so a dropped tool prompt never displaces a duplicate that would have been kept.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from draftline.core.classify import DOMAINS, Label, classify_messages
from draftline.core.contamination import EvalPrompt, extra_prompts, set_prompts
from draftline.core.errors import MissingInput
from draftline.core.files import atomic_path, write_csv
from draftline.core.logs import get_logger
from draftline.core.mix import Mix
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
from draftline.core.splits import split_of
from draftline.core.target_loader import load_target, load_tokenizer
from draftline.core.tracked import require_tracked
from draftline.prompts.aim import aimed_selection, check_max_share
from draftline.prompts.base import base_mix, base_prompt_ids
from draftline.prompts.blend import Pool, hash_rank, select, source_plan, split_eval, unweighted
from draftline.prompts.canonical import cut_prompt, user_text
from draftline.prompts.costs import token_costs
from draftline.prompts.decontaminate import Contamination, decontaminate
from draftline.prompts.dedup import MinHasher, exact_duplicates, near_duplicates, number_key, survivor_order
from draftline.prompts.params import BlendParams, DedupParams, PromptsParams, PromptsSettings
from draftline.prompts.report import (
    SourceReport,
    build_metrics,
    format_mix,
    format_table,
    headline_mix,
    language_rows,
    mix_details,
    plot_rows,
    share_rows,
)
from draftline.prompts.steer import format_steer, steer_shares, steering
from draftline.prompts.template import ToolPrompts, check_thinking

log = get_logger("draftline.prompts")


def _check_names(sources: Sequence[str], dedup: DedupParams, blend: BlendParams) -> None:
    """Sources named in dedup and blend must be in ``params.yaml: sources``: fail before reading a row."""
    source_plan(sources, blend.sources)
    for key, names in (("priority", dedup.priority), ("near.exact_numbers", dedup.near.exact_numbers)):
        unknown = sorted(set(names) - set(sources))
        if unknown:
            raise ParamsError(f"params.yaml: dedup.{key} names {unknown}, which are not in params.yaml: sources")


def collect(
    sources: Sequence[str], prompts: PromptsParams, conversations_root: str | os.PathLike,
    tools: ToolPrompts | None = None,
) -> tuple[list[PromptRecord], dict[str, SourceReport]]:
    """A prompt cut out of every source's conversations; reading and cutting skips counted in the reports. With
    ``tools``, prompts offering tools the template cannot render are left out (counted, or refused at the end)."""
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
                record = cut_prompt(conv, prompts.turns)
            except RowError as e:
                skips.add(e.reason, f"{name} row {conv.row}", e.detail)
                continue
            if tools is None or tools.keep(record, skips):
                records.append(record)
        r = reports[name]
        r.rows_read, r.skipped, r.media_parts_dropped = read["rows_read"], skips.counts, read["media_parts_dropped"]
        r.prompts = len(records) - before
        if r.prompts == 0:
            log.warning("source %s gave no usable prompts (%d rows read, skipped: %s)", name, r.rows_read, skips.as_dict())
    if tools is not None:
        tools.check()
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


class Labels:
    """Every prompt's domain and language (:func:`draftline.core.classify.classify_messages`), each computed once,
    on demand: without ``blend.target_mix`` only the rows the blend keeps are labelled."""

    def __init__(self, records: list[PromptRecord]):
        self.by_id = {r.id: r for r in records}
        self.labels: dict[str, Label] = {}
        self.seconds = 0.0  # spent labelling (the run file's label_seconds)

    def __call__(self, id_: str) -> Label:
        if id_ not in self.labels:
            r = self.by_id[id_]
            started = time.perf_counter()
            self.labels[id_] = classify_messages(r.messages, r.tools)
            self.seconds += time.perf_counter() - started
        return self.labels[id_]


@dataclass
class Blend:
    """The blend's outcome: train and eval rows, and the per-domain amounts aimed at (None: no target_mix)."""

    train: list[PromptRecord]
    eval: list[PromptRecord]
    aimed: dict[str, int] | None = None


def blend_rows(
    kept: list[PromptRecord], reports: dict[str, SourceReport], blend: BlendParams, order: Sequence[str], cost: Costs,
    labels: Labels | None = None, base: dict[str, int] | None = None, in_base: frozenset[str] = frozenset(),
    factors: dict[str, float] | None = None, contaminated: frozenset[str] = frozenset(),
) -> Blend:
    """The eval split and the blend's train rows, each in source order then row order; with ``blend.target_mix``
    aimed at it (``base``: the base's amount per domain, in ``blend.unit``). Prompts ``in_base`` are left out of
    the train pool (after the eval split, which therefore never depends on the base); ``factors`` scale the
    weighted sources' weights (``blend.steer``). Prompts ``contaminated`` leave both sides after the split (which
    therefore never depends on the evaluation sets: a held-out prompt that is a benchmark's is dropped, not replaced)."""
    plan = source_plan(order, blend.sources)
    for name, factor in (factors or {}).items():
        plan[name]["weight"] *= factor
    by_source: dict[str, list[PromptRecord]] = {name: [] for name in order}
    for r in kept:
        by_source[r.source].append(r)
    pools = []
    for name in order:
        ranked = sorted(by_source[name], key=lambda r: (hash_rank(blend.seed, r.id), r.id))
        eval_ids, train_ids = split_eval([r.id for r in ranked], blend.eval)
        if contaminated:
            eval_ids = [i for i in eval_ids if i not in contaminated]
            train_ids = [i for i in train_ids if i not in contaminated]
        if in_base:
            fresh = [i for i in train_ids if i not in in_base]
            reports[name].in_base, train_ids = len(train_ids) - len(fresh), fresh
        costs = cost(train_ids) if blend.unit == "tokens" else [1] * len(train_ids)
        pools.append(Pool(name, train_ids, costs, eval_ids=eval_ids, **plan[name]))
        reports[name].available, reports[name].eval_rows = len(ranked), Counter(map(split_of, eval_ids))
    labels = labels or Labels(kept)
    if blend.target_mix is None:
        selection, aimed = select(pools, blend.total, blend.unit), None
    else:
        selection, aimed = aimed_selection(pools, blend, lambda i: labels(i).domain, base or dict.fromkeys(DOMAINS, 0))
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
    return Blend(train, eval_, aimed)


def held_out_ids(kept: list[PromptRecord], blend: BlendParams, order: Sequence[str]) -> set[str]:
    """The ids :func:`blend_rows` sets aside for evaluation (the same rank and split), known before the blend."""
    held: set[str] = set()
    for name in order:
        ranked = sorted((r for r in kept if r.source == name), key=lambda r: (hash_rank(blend.seed, r.id), r.id))
        held.update(split_eval([r.id for r in ranked], blend.eval)[0])
    return held


def check_contamination(p: PromptsSettings, sets_dir: Path, stage: StageRun) -> list[EvalPrompt] | None:
    """The evaluation prompts of ``evaluate.sets`` and ``decontaminate.extra`` (None: the check is off), read
    before any source row so that a missing set stops the stage at once."""
    if p.decontaminate is None or not p.decontaminate.enabled:
        return None
    for path in p.decontaminate.extra:
        require_tracked(path, sets_dir, "decontaminate.extra")
    return set_prompts(p.sets, sets_dir, stage.skips) + [
        e for path in p.decontaminate.extra for e in extra_prompts(path, stage.skips)]


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
    plot_shares: Path
    plot_languages: Path
    drafters: Path  # where earlier rounds' evaluations live (a dependency of the stage)
    bases: Path  # where merge.base lives (a dependency of the stage)
    sets: Path = Path()  # the benchmark sets' conversations, <sets>/<name>/ (decontaminate checks against them)


def run_prompts(p: PromptsSettings, args: PromptsArgs, stage: StageRun) -> None:
    """The whole stage over ``p.sources`` (names, in params.yaml order). Raises before writing anything when the
    blend is infeasible, the target mix out of reach, or a domain over ``blend.max_domain_share``."""
    order = list(p.sources)
    _check_names(order, p.dedup, p.blend)
    require_tracked(p.blend.steer.eval if p.blend.steer else None, args.drafters, "blend.steer.eval")
    require_tracked(p.base, args.bases, "merge.base")
    target = load_target(args.target)
    tokenizer = load_tokenizer(target)
    check_thinking(tokenizer, p.enable_thinking)
    outside = check_contamination(p, args.sets, stage)
    tools = ToolPrompts(tokenizer, p.prompts.tools_unsupported, unweighted(order, p.blend.sources))
    records, reports = collect(order, p.prompts, args.conversations, tools)
    kept = deduplicate(records, reports, p.dedup, order)
    contamination: Contamination | None = None
    if outside is not None:
        # Its own counter logs the first hits; the counts join each source's skips (the stage's, at the end).
        dropped, contamination = decontaminate(kept, held_out_ids(kept, p.blend, order), outside, p.decontaminate,
                                               Skips(get_logger("draftline.prompts.decontaminate")))
        for name, n in contamination.by_source.items():
            reports[name].skipped["contaminated"] += n
    else:
        dropped = frozenset()
    cost = Costs(kept, tokenizer, p.enable_thinking)
    base = base_mix(p.base, tokenizer, stage, p.blend.target_mix is not None or p.blend.max_domain_share is not None)
    labels = Labels(kept)
    steer = steering(p.blend, order, target)
    blend = blend_rows(kept, reports, p.blend, order, cost, labels, base.amounts(p.blend.unit),
                       base_prompt_ids(p.base), {s: x["factor"] for s, x in steer.sources.items()} if steer else None,
                       dropped)
    if steer:
        steer.check_prompts(p.blend.steer, blend.eval)
    train_labels = [labels(r.id) for r in blend.train]
    for r, label in zip(blend.train, train_labels):
        reports[r.source].domains[label.domain] += 1
        reports[r.source].languages[label.lang] += 1
    new = Mix.of_labels([x.domain for x in train_labels], [x.lang for x in train_labels], cost([r.id for r in blend.train]))
    stage.run.update(label_seconds=round(labels.seconds, 2), prompts_labelled=len(labels.labels))
    mix = mix_details(base, new, p.blend.unit, p.blend.requested_mix(), blend.aimed)
    check_max_share(mix["merged_amounts"], p.blend.max_domain_share, p.blend.unit, mix["base_amounts"])
    _write_outputs(args.out, blend.train, blend.eval)
    details = build_metrics(reports, p.blend.unit, p.blend.total)
    details["mix"] = mix
    if contamination is not None:
        details["decontamination"] = contamination.report(p.decontaminate)
        stage.headline["contaminated"] = contamination.headline()
        stage.run["decontaminate_seconds"] = round(contamination.seconds, 2)
    if steer:
        details["steer"] = steer_shares(p.blend.steer, steer, details)
        print(format_steer(details["steer"]), flush=True)
    for r in reports.values():
        stage.skips.counts.update(r.skipped)
    stage.details.update(details)
    stage.headline.update(rows=details["train_rows"], tokens=details["train_tokens"], eval_rows=sum(details["eval_rows"].values()),
                          duplicates=sum(r.exact_duplicates + r.near_duplicates for r in reports.values()),
                          **headline_mix(mix))
    write_csv(args.plot, plot_rows(details))
    write_csv(args.plot_shares, share_rows(mix))
    write_csv(args.plot_languages, language_rows(mix))
    print(format_table(details), flush=True)
    print(format_mix(details), flush=True)
    log.info("wrote %d train and %d eval prompts to %s", len(blend.train), len(blend.eval), args.out)
