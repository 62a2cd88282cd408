"""The generate stage: prompts -> the target's completions, resumable to the row.

Order of work: 1. read the prompts and the target's description; 2. open the journal keyed by what decides a result
(:mod:`~draftline.generate.key`); 3. send only prompts without a result, in dispatch order
(:mod:`~draftline.generate.order`), with the configured backend's driver: SGLang/vLLM over HTTP
(:mod:`~draftline.generate.remote`), the target in-process (:mod:`~draftline.generate.batches`) or the dataset's
own answers (:mod:`~draftline.generate.dataset`; the prompts without one are skips), each journaling every result as
it finishes; 4. stop, writing nothing, when too many replies were cut at ``max_tokens``
(:func:`~draftline.generate.report.check_truncated`); 5. write the shards and failures from the journal in prompt
order (:mod:`~draftline.generate.shards`); 6. fill the headline, the report (:mod:`~draftline.generate.report`) and
the run's figures (:mod:`~draftline.generate.progress`), which the stage runner writes, warning of each source whose
tool rows mostly end without a valid tool call.
"""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftline.core.gguf import served_drafter, served_target
from draftline.core.launch import Draft, Server, launch_env, launches, server_command
from draftline.core.llama_cpp import VERSION as LLAMA_CPP_VERSION
from draftline.core.logs import get_logger
from draftline.core.records import TargetInfo, read_prompts
from draftline.core.runner import StageArgs, StageRun
from draftline.core.scratch import scratch_dir
from draftline.core.target_loader import load_target
from draftline.core.tracked import require_tracked
from draftline.drafter.fit import check_fits
from draftline.generate.batches import generate_local
from draftline.generate.dataset import answerable, generate_dataset
from draftline.generate.journal import OK, Journal, start_at
from draftline.generate.key import journal_decides
from draftline.generate.order import dispatch_order, prefix_group
from draftline.generate.params import GenerateParams
from draftline.generate.progress import Progress
from draftline.generate.remote import generate_remote
from draftline.generate.report import check_truncated, headline, summarize, warn_few_valid_tool_calls
from draftline.generate.shards import write_outputs
from draftline.generate.work import Plan, Work

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class GenerateArgs(StageArgs):
    """``stages/generate.py``'s paths (dvc.yaml passes them)."""

    prompts: Path  # the prompts file (train.jsonl)
    target: Path  # the target's target.json
    out: Path  # the completions folder
    metrics: Path
    drafters: Path  # where earlier rounds' drafters and evaluations live (a dependency of the stage)


def dispatch(work: Work, s: GenerateParams, info: TargetInfo, target_json: Path, server_log: Path | None) -> dict[str, int]:
    """Generate ``work``'s pending prompts with the configured backend (starting an SGLang, vLLM or llama.cpp server
    when ``launch`` is set, its output appended to ``server_log``). Returns the requests sent and their retries."""
    if not work.plan.pending:
        return {"requests": 0, "retries": 0}
    if s.backend == "local":
        return generate_local(work, s, info)
    if s.backend == "dataset":
        return generate_dataset(work, s, info)
    model = s.model or info.path
    if s.launch is None:
        return asyncio.run(generate_remote(work, s, s.endpoints, model))
    cfg = s.launch
    served, draft, engine = info.path, Draft.of(s.draft_model) if s.draft_model else None, None
    if cfg.engine == "llama.cpp":
        # The pinned build: its own /props says b0-unknown (an sdist carries no git history to number it by).
        engine = {"name": "llama.cpp", "version": LLAMA_CPP_VERSION}
        served = str(served_target(target_json, cfg.llama_cpp.gguf_type))
        if draft is not None:
            draft = Draft(str(served_drafter(s.draft_model, info, cfg.llama_cpp.gguf_type)), draft.block_size)
    urls = []
    with ExitStack() as servers:
        for one in launches(cfg):
            urls.append(f"http://{one.host}:{one.port}")
            servers.enter_context(Server(server_command(served, one, s.enable_thinking, draft, alias=model), urls[-1],
                                         server_log, health_timeout_s=cfg.health_timeout_s, env=launch_env(cfg)))
        return asyncio.run(generate_remote(work, s, urls, model, engine))


def run_generate(p: GenerateParams, args: GenerateArgs, stage: StageRun) -> None:
    """The whole stage: completions for every prompt of ``args.prompts`` not already in the journal."""
    require_tracked(p.draft_model, args.drafters, "generate.draft_model")
    if p.backend == "sglang":
        p.api_key()  # an unset key variable fails here, before any work
    stage.skips.strict = p.strict
    prompts = read_prompts(args.prompts, stage.skips)
    # The prompts the backend can answer; the others are counted skips, and the report still has every prompt read.
    todo = answerable(prompts, stage.skips) if p.backend == "dataset" else prompts
    info = load_target(args.target)
    if p.draft_model is not None and p.backend != "dataset":
        check_fits(p.draft_model, info)  # a drafter of another target is refused before any server starts
    decides = journal_decides(p, info, prompts, args.target)
    folder = scratch_dir("generate", decides)
    journal = Journal(folder)
    entries = journal.load()
    if journal.torn:
        log.warning("journal %s: %d torn or damaged line(s) ignored, their prompts are sent again",
                    journal.path, journal.torn)
    resumed = sum(1 for q in prompts if entries.get(q.id, {}).get("status") == OK)
    order = dispatch_order([prefix_group(q) for q in todo])
    ordered = [todo[i] for i in order]
    plan = Plan(ordered, [q for q in ordered if entries.get(q.id, {}).get("status") != OK])
    if slot := journal.join():
        log.info("another generate process writes journal %s: this one (writer %d) starts at prompt %d of %d",
                 journal.path, slot, start_at(len(plan.pending), slot), len(plan.pending))
    log.info("%d prompts: %d already in the journal %s, %d to generate with %s",
             len(prompts), resumed, folder, len(plan.pending), p.backend)

    server_log = args.report.with_name(f"generate.{p.launch.engine}.log") if p.launch else None
    progress = Progress(len(plan.pending))
    try:
        sent = dispatch(Work(plan, journal, entries, progress), p, info, args.target, server_log)
        entries = journal.refresh()  # with what another writer of a shared journal recorded meanwhile
    finally:
        progress.close()
        journal.close()

    check_truncated(prompts, entries, p.max_truncated_share, p.max_tokens)  # before anything is written
    # sampling: null where nothing was sampled; each row adds the engine its journal entry names
    generation: dict[str, Any] = {"backend": p.backend, **decides["target"], "sampling": decides.get("sampling"),
                                  "enable_thinking": p.enable_thinking}
    records, n_failed = write_outputs(args.out, prompts, entries, generation, p)
    stage.details.update(summarize(prompts, entries, records))
    stage.headline.update(headline(stage.details))
    if p.backend != "dataset":  # the datasets' answers are text, never structured calls: no target to warn about
        warn_few_valid_tool_calls(stage.headline)
    stage.run.update(journal=str(folder), resumed=resumed, **progress.figures(), **sent,
                     **({"server_log": str(server_log)} if server_log else {}))
    log.info("%d completions written to %s, %d failed (see failures.jsonl), %d truncated",
             len(records), args.out, n_failed, stage.headline["truncated"])
