"""The ``prompts`` stage: every source's conversations -> ``train.jsonl`` + ``eval.jsonl``, metrics and the mix plot.

Order of work: cut a prompt out of every conversation (bad ones counted per reason), exact dedup, near dedup,
eval split, blend (by source weights, or aimed at ``blend.target_mix`` for the merged set, counting the recorded
mix of ``merge.base``), the ``blend.max_domain_share`` guard. Every prompt kept gets a domain and a language
(:mod:`draftline.core.classify`); the report gives them per source, for the base, the new rows and the merged set. Every check that can fail (config, feasibility of the blend) runs before anything is written,
and the two JSONL files appear together or not at all. Sources are taken in ``params.yaml: sources`` order, which
also breaks ties in dedup priority; token costs render prompts as generation will (``generate.enable_thinking``).
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
from draftline.core.errors import MissingInput
from draftline.core.files import atomic_path, write_csv
from draftline.core.logs import get_logger
from draftline.core.mix import Mix, folder_mix
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
from draftline.core.splits import DEV, split_of
from draftline.core.target import load_target, load_tokenizer
from draftline.core.tracked import require_tracked
from draftline.prompts.aim import aim, check_max_share
from draftline.prompts.blend import Pool, Selection, hash_rank, select, source_plan, split_eval
from draftline.prompts.canonical import cut_prompt, user_text
from draftline.prompts.costs import token_costs
from draftline.prompts.dedup import MinHasher, exact_duplicates, near_duplicates, number_key, survivor_order
from draftline.prompts.params import BlendParams, DedupParams, PromptsParams, PromptsSettings, SteerParams
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
from draftline.prompts.steer import base_prompt_ids, check_prompt_set, read_evaluation, steer_factors

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


def _by_domain(pools: list[Pool], labels: Labels) -> dict[str, list[Pool]]:
    """Each source's pool cut into one pool per domain, selection order kept."""
    out: dict[str, list[Pool]] = {d: [] for d in DOMAINS}
    for p in pools:
        for d in DOMAINS:
            keep = [i for i, id_ in enumerate(p.ids) if labels(id_).domain == d]
            out[d].append(Pool(p.name, [p.ids[i] for i in keep], [p.costs[i] for i in keep], whole=p.whole,
                               weight=p.weight))
    return out


def _aimed_selection(pools: list[Pool], blend: BlendParams, labels: Labels, base: dict[str, int]
                     ) -> tuple[Selection, dict[str, int]]:
    """``blend.target_mix``: the amount of each domain (:func:`draftline.prompts.aim.aim`), then per domain the
    usual whole / weighted selection among the sources' rows of that domain."""
    per_domain = _by_domain(pools, labels)
    floor = {d: sum(p.capacity for p in per_domain[d] if p.whole) for d in DOMAINS}
    cap = {d: floor[d] + sum(p.capacity for p in per_domain[d] if not p.whole and p.weight > 0) for d in DOMAINS}
    target = blend.requested_mix()
    assert target is not None
    amounts = aim(target, base, floor, cap, blend.total, blend.unit)
    train = {p.name: [] for p in pools}
    requested = {p.name: 0 for p in pools}
    achieved = {p.name: 0 for p in pools}
    for d in DOMAINS:
        sel = select(per_domain[d], amounts[d], blend.unit)
        for name in train:
            train[name] += sel.train_ids[name]
            requested[name] += sel.requested[name]
            achieved[name] += sel.achieved[name]
    rank = {id_: i for p in pools for i, id_ in enumerate(p.ids)}
    train = {name: sorted(ids, key=rank.__getitem__) for name, ids in train.items()}
    return Selection({p.name: p.eval_ids for p in pools}, train, requested, achieved), amounts


def blend_rows(
    kept: list[PromptRecord], reports: dict[str, SourceReport], blend: BlendParams, order: Sequence[str], cost: Costs,
    labels: Labels | None = None, base: dict[str, int] | None = None, in_base: frozenset[str] = frozenset(),
    factors: dict[str, float] | None = None,
) -> Blend:
    """The eval split and the blend's train rows, each in source order then row order; with ``blend.target_mix``
    aimed at it (``base``: the base's amount per domain, in ``blend.unit``). Prompts ``in_base`` are left out of
    the train pool (after the eval split, which therefore never depends on the base); ``factors`` scale the
    weighted sources' weights (``blend.steer``)."""
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
        if in_base:
            fresh = [i for i in train_ids if i not in in_base]
            reports[name].in_base, train_ids = len(train_ids) - len(fresh), fresh
        costs = cost(train_ids) if blend.unit == "tokens" else [1] * len(train_ids)
        pools.append(Pool(name, train_ids, costs, eval_ids=eval_ids, **plan[name]))
        reports[name].available, reports[name].eval_rows = len(ranked), Counter(map(split_of, eval_ids))
    aimed = None
    if blend.target_mix is None:
        selection = select(pools, blend.total, blend.unit)
    else:
        selection, aimed = _aimed_selection(pools, blend, labels or Labels(kept), base or dict.fromkeys(DOMAINS, 0))
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
    drafters: Path  # where earlier rounds' drafters and evaluations live (a dependency of the stage)


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


@dataclass(frozen=True)
class Steering:
    """``blend.steer`` read: the previous round's dev figures and, per weighted source, its acceptance and factor."""

    dev: dict[str, Any]
    sources: dict[str, dict[str, Any]]

    def check_prompts(self, steer: SteerParams, eval_: list[PromptRecord]) -> None:
        dev_ids = {r.id for r in eval_ if split_of(r.id) == DEV}
        check_prompt_set(self.dev, steer.setting, dev_ids, Path(steer.eval))


def steering(blend: BlendParams, order: Sequence[str], tokenizer_fingerprint: str) -> Steering | None:
    """``blend.steer``'s acceptance and weight factor per weighted source (:mod:`draftline.prompts.steer`)."""
    if blend.steer is None:
        return None
    plan = source_plan(order, blend.sources)
    weights = {name: x["weight"] for name, x in plan.items() if not x["whole"] and x["weight"] > 0}
    dev = read_evaluation(blend.steer.eval, tokenizer_fingerprint)
    factors = steer_factors(weights, dev, blend.steer.setting, blend.steer.strength, Path(blend.steer.eval))
    return Steering(dev, {name: {"weight": weights[name], **factors[name]} for name in weights})


def steer_shares(steer: SteerParams, steering: Steering, details: dict[str, Any]) -> dict[str, Any]:
    """What steered (the evaluation, its split, the setting) and per steered source: its acceptance and factor, and
    its share of the weighted sources' rows as requested (the weights), steered (the weights x factors) and
    achieved (the rows chosen)."""
    sources = steering.sources
    steered = {s: x["weight"] * x["factor"] for s, x in sources.items()}
    rows = {s: details["sources"][s]["achieved_rows"] for s in sources}
    w, sw, n = sum(x["weight"] for x in sources.values()), sum(steered.values()), sum(rows.values())
    return {"eval": steer.eval, "split": DEV, "setting": steer.setting, "strength": steer.strength, "sources": {
        s: {"acceptance": x["acceptance"], "factor": x["factor"], "requested": round(x["weight"] / w, 4),
            "steered": round(steered[s] / sw, 4), "achieved": round(rows[s] / n, 4) if n else 0.0}
        for s, x in sources.items()}}


def format_steer(steer: dict[str, Any]) -> str:
    lines = [f"blend.steer ({steer['eval']}, {steer['split']} split, {steer['setting']}): shares of the weighted "
             "sources' rows",
             f"{'source':<20} {'acceptance':>10} {'factor':>7} {'requested':>9} {'steered':>8} {'achieved':>8}"]
    for s, x in steer["sources"].items():
        a = "-" if x["acceptance"] is None else f"{x['acceptance']:.2f}"
        lines.append(f"{s:<20} {a:>10} {x['factor']:>7.2f} {x['requested']:>9.1%} {x['steered']:>8.1%} "
                     f"{x['achieved']:>8.1%}")
    return "\n".join(lines)


def run_prompts(p: PromptsSettings, args: PromptsArgs, stage: StageRun) -> None:
    """The whole stage over ``p.sources`` (names, in params.yaml order). Raises before writing anything when the
    blend is infeasible, the target mix out of reach, or a domain over ``blend.max_domain_share``."""
    order = list(p.sources)
    _check_names(order, p.dedup, p.blend)
    require_tracked(p.blend.steer.eval if p.blend.steer else None, args.drafters, "blend.steer.eval")
    records, reports = collect(order, p.prompts, args.conversations)
    kept = deduplicate(records, reports, p.dedup, order)
    target = load_target(args.target)
    tokenizer = load_tokenizer(target)
    cost = Costs(kept, tokenizer, p.enable_thinking)
    base = base_mix(p.base, tokenizer, stage, p.blend.target_mix is not None or p.blend.max_domain_share is not None)
    labels = Labels(kept)
    steer = steering(p.blend, order, target.tokenizer_fingerprint)
    blend = blend_rows(kept, reports, p.blend, order, cost, labels, base.amounts(p.blend.unit),
                       base_prompt_ids(p.base), {s: x["factor"] for s, x in steer.sources.items()} if steer else None)
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
