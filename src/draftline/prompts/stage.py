"""The ``prompts`` stage: ``data/raw/*`` -> ``data/prompts/{train,eval}.jsonl`` + metrics + the mix plot.

Order of work: adapt and cut every row (bad rows counted per reason), exact dedup, near dedup, eval split,
blend. Every check that can fail (config, feasibility of the blend) runs before anything is written, and
the two JSONL files appear together or not at all.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tqdm import tqdm

from draftline.files import atomic_path, write_csv, write_json
from draftline.logs import get_logger
from draftline.records import PromptRecord
from draftline.skips import Skips
from draftline.sources import RAW_FILE
from draftline.target import load_target, load_tokenizer

from .adapters import RowError, iter_conversations, make_adapter
from .blend import UNITS, BlendError, Pool, hash_rank, select, source_plan, split_eval
from .canonical import TURNS, cut_prompt, user_text
from .costs import token_costs
from .dedup import MinHasher, NearParams, exact_duplicates, near_duplicates, number_key, survivor_order
from .report import SourceReport, build_metrics, format_table, plot_rows

log = get_logger("draftline.prompts")


def _check_config(sources: Mapping[str, Any], prompts: Mapping[str, Any], dedup: Mapping[str, Any], blend: Mapping[str, Any]) -> None:
    """Fail on a bad setting before reading a row."""
    if prompts.get("turns", "first") not in TURNS:
        raise ValueError(f"prompts.turns must be one of {TURNS}, not {prompts.get('turns')!r}")
    options = prompts.get("adapter_options") or {}
    for name in set(options) - set(sources):
        raise ValueError(f"prompts.adapter_options names {name!r}, which is not in params.yaml: sources")
    for name, cfg in sources.items():
        make_adapter(cfg.get("adapter", name), options.get(name), prompts.get("multimodal", "drop"))
    for key in ("priority", "near.exact_numbers"):
        names = dedup.get(key) if "." not in key else (dedup.get("near") or {}).get(key.split(".")[1])
        unknown = sorted(set(names or []) - set(sources))
        if unknown:
            raise ValueError(f"dedup.{key} names {unknown}, which are not in params.yaml: sources")
    if blend.get("unit", "samples") not in UNITS:
        raise BlendError(f"blend.unit must be one of {UNITS}, not {blend.get('unit')!r}")
    for key in ("total", "eval_per_source", "seed"):
        value = blend.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BlendError(f"blend.{key} must be a non-negative integer, not {value!r}")


def collect(
    sources: Mapping[str, Any], prompts: Mapping[str, Any], raw_root: str | os.PathLike
) -> tuple[list[PromptRecord], dict[str, SourceReport]]:
    """Every source's rows as prompt records; skipped rows counted per reason in the reports."""
    records: list[PromptRecord] = []
    reports = {name: SourceReport() for name in sources}
    options = prompts.get("adapter_options") or {}
    for name, cfg in sources.items():
        raw_dir = Path(raw_root) / name
        if not (raw_dir / RAW_FILE).exists():
            raise FileNotFoundError(f"{raw_dir / RAW_FILE} is missing: run `dvc repro sources@{name}` first")
        skips = Skips(get_logger(f"draftline.prompts.{name}"), strict=bool(prompts.get("strict") or cfg.get("strict")))
        stats: Counter[str] = Counter()
        convs = iter_conversations(
            name, cfg, str(raw_dir), skips,
            adapter_options=options.get(name), multimodal=prompts.get("multimodal", "drop"), stats=stats,
        )
        before = len(records)
        for conv in tqdm(convs, desc=f"prompts {name}", unit=" rows", mininterval=2.0):
            try:
                records.append(cut_prompt(conv, prompts.get("turns", "first")))
            except RowError as e:
                skips.add(e.reason, f"{name} row {conv.row}", e.detail)
        r = reports[name]
        r.rows_read, r.skipped, r.media_parts_dropped = stats["rows"], skips.counts, stats["media_parts_dropped"]
        r.prompts = len(records) - before
        if r.prompts == 0:
            log.warning("source %s gave no usable prompts (%d rows read, skipped: %s)", name, r.rows_read, skips.as_dict())
    return records, reports


def deduplicate(
    records: list[PromptRecord], reports: dict[str, SourceReport], dedup: Mapping[str, Any], source_order: list[str]
) -> list[PromptRecord]:
    """Exact, then near-duplicate removal; counts per source; survivors in input order."""
    listed = list(dedup.get("priority") or [])
    priority = listed + [s for s in source_order if s not in listed]
    names = [r.source for r in records]
    ids = [r.id for r in records]
    gone = set(exact_duplicates(names, ids, [r.row for r in records], priority))
    for i in gone:
        reports[names[i]].exact_duplicates += 1
    kept = [r for i, r in enumerate(records) if i not in gone]
    near = dedup.get("near") or {}
    if not near.get("enabled", True) or not kept:
        return kept
    params = NearParams(
        threshold=float(near.get("threshold", 0.8)),
        num_perm=int(near.get("num_perm", 128)),
        ngram=int(near.get("ngram", 5)),
        seed=int(near.get("seed", 0)),
    )
    exact_numbers = set(near.get("exact_numbers") or [])
    hasher = MinHasher(params)
    shingles, keys = [], []
    for r in tqdm(kept, desc="near-dup signatures", unit=" prompts", mininterval=2.0):
        text = user_text(r)
        shingles.append(hasher.shingles(text, normalize_numbers=r.source not in exact_numbers))
        keys.append(number_key(text) if r.source in exact_numbers else b"")
    sigs = hasher.signatures(shingles)
    order = survivor_order([r.source for r in kept], [r.id for r in kept], [r.row for r in kept], priority)
    dup_of = near_duplicates(sigs, [len(s) > 0 for s in shingles], keys, order, params.threshold)
    for i in dup_of:
        reports[kept[i].source].near_duplicates += 1
    return [r for i, r in enumerate(kept) if i not in dup_of]


def _write_outputs(out_dir: Path, train: list[PromptRecord], eval_: list[PromptRecord]) -> None:
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        for fname, rows in (("train.jsonl", train), ("eval.jsonl", eval_)):
            with open(tmp / fname, "w", encoding="utf-8") as f:
                for r in rows:
                    f.write(r.to_json() + "\n")


def run_prompts(
    sources: Mapping[str, Any],
    prompts: Mapping[str, Any],
    dedup: Mapping[str, Any],
    blend: Mapping[str, Any],
    *,
    raw_root: str | os.PathLike = "data/raw",
    target_dir: str | os.PathLike = "data/target",
    out_dir: str | os.PathLike = "data/prompts",
    metrics_path: str | os.PathLike = "metrics/prompts.json",
    plots_path: str | os.PathLike = "plots/prompts_mix.csv",
) -> dict[str, Any]:
    """Run the whole stage; returns the metrics. Raises before writing anything when the blend is infeasible."""
    _check_config(sources, prompts, dedup, blend)
    order = list(sources)
    records, reports = collect(sources, prompts, raw_root)
    kept = deduplicate(records, reports, dedup, order)
    unit, total, seed = blend.get("unit", "samples"), int(blend["total"]), int(blend.get("seed", 0))
    plan = source_plan(order, blend)
    by_source: dict[str, list[PromptRecord]] = {name: [] for name in order}
    for r in kept:
        by_source[r.source].append(r)
    tokenizer = load_tokenizer(load_target(target_dir))
    by_id = {r.id: r for r in kept}
    tokens: dict[str, int] = {}

    def cost(ids: list[str]) -> list[int]:
        todo = [by_id[i] for i in ids if i not in tokens]
        for r, p, ref in zip(todo, *token_costs(todo, tokenizer)):
            tokens[r.id] = p + ref
        return [tokens[i] for i in ids]

    pools = []
    for name in order:
        ranked = sorted(by_source[name], key=lambda r: (hash_rank(seed, r.id), r.id))
        eval_ids, train_ids = split_eval([r.id for r in ranked], int(blend.get("eval_per_source", 0)))
        costs = cost(train_ids) if unit == "tokens" else [1] * len(train_ids)
        pools.append(Pool(name, train_ids, costs, eval_ids=eval_ids, **plan[name]))
        reports[name].available, reports[name].eval_rows = len(ranked), len(eval_ids)
    selection = select(pools, total, unit)
    train: list[PromptRecord] = []
    for pool in pools:
        chosen = selection.train_ids[pool.name]
        reports[pool.name].requested = selection.requested[pool.name]
        reports[pool.name].train_rows = len(chosen)
        reports[pool.name].train_tokens = sum(cost(chosen))
        train += [by_id[i] for i in chosen]
    eval_ = [by_id[i] for name in order for i in selection.eval_ids[name]]
    position = {name: i for i, name in enumerate(order)}
    train.sort(key=lambda r: (position[r.source], r.row))
    eval_.sort(key=lambda r: (position[r.source], r.row))
    _write_outputs(Path(out_dir), train, eval_)
    metrics = build_metrics(reports, unit, total)
    write_json(metrics_path, metrics)
    write_csv(plots_path, plot_rows(metrics))
    print(format_table(metrics), flush=True)
    log.info("wrote %d train and %d eval prompts to %s", len(train), len(eval_), out_dir)
    return metrics
