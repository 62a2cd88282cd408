"""The serve stage: how much faster the target serves with the drafter, measured in a real engine.

Order of work: 1. off where ``serve.engine`` is null (empty figures, at once); 2. the drafter checked against the
target (:func:`draftline.drafter.fit.check_fits`); 3. evaluate's requests of ``serve.split``
(:func:`draftline.core.requests.load_requests`, evaluate's params); 4. what the engine loads: for llama.cpp the
export stage's GGUF files where they were made from this drafter and target and are intact, else both converted
(:mod:`draftline.core.gguf`, cached); for SGLang and vLLM the target's folder and the checkpoint; 5. one server per
arm (:mod:`draftline.serve.measure`); 6. the figures (:mod:`draftline.serve.report`), the plot.

The one stage whose figures are times: its metrics and report change from run to run (and with the machine's load:
``reports/serve.run.json`` says how loaded it was), where every other stage's are byte-identical. Its comparisons
with evaluate (equal ids, equal steps) are exact where ``serve.exact`` makes llama.cpp compute as evaluate does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from draftline.core.files import write_csv
from draftline.core.fingerprint import sha256_file
from draftline.core.gguf import served_drafter, served_target
from draftline.core.launch import Draft
from draftline.core.logs import get_logger
from draftline.core.records import TargetInfo
from draftline.core.requests import load_requests, stop_token_ids
from draftline.core.runner import StageArgs, StageRun
from draftline.core.target_loader import load_target, load_tokenizer
from draftline.core.threads import idle_cores
from draftline.drafter.checkpoint import WEIGHTS_FILE
from draftline.drafter.fit import check_fits
from draftline.serve.engines import Engine
from draftline.serve.measure import Decoding, mean_run, measure_arm
from draftline.serve.params import ServeParams, ServeSettings
from draftline.serve.report import PLOT_COLUMNS, arm_row, decode_rate, headline, plot_rows

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class ServeArgs(StageArgs):
    """``stages/serve.py``'s paths (dvc.yaml passes them)."""

    checkpoint: Path  # the drafter (the train stage's output)
    target: Path  # the target's target.json
    prompts: Path  # the held-out prompts (eval.jsonl)
    sets: Path  # the benchmark sets' conversations
    export: Path  # the export stage's folder (its gguf/ where export.formats has gguf)
    steps: Path  # evaluate's per-step file: its turns, compared with the served ones
    metrics: Path
    plot: Path


def served_files(p: ServeParams, info: TargetInfo, args: ServeArgs) -> tuple[str, Draft]:
    """The target and the drafter as the engine loads them."""
    if p.engine != "llama.cpp":
        return info.path, Draft.of(args.checkpoint)
    folder = args.export / "gguf"
    if (folder / "export.json").is_file():
        m = json.loads((folder / "export.json").read_text(encoding="utf-8"))
        drafter, target = folder / m["drafter"]["file"], folder / m["target"]["file"]
        if (m["drafter"]["checkpoint_sha256"] == sha256_file(args.checkpoint / WEIGHTS_FILE)
                and m["target"]["model_fingerprint"] == info.model_fingerprint
                and drafter.is_file() and sha256_file(drafter) == m["drafter"]["sha256"]):
            if not (target.is_file() and sha256_file(target) == m["target"]["sha256"]):
                target = served_target(args.target, p.gguf_type)  # a GGUF target: its own file
            log.info("serve: the exported %s beside %s", drafter, target)
            return str(target), Draft.of(args.checkpoint, drafter)
        log.info("serve: %s was made from another drafter or target: converting them here", folder)
    return (str(served_target(args.target, p.gguf_type)),
            Draft.of(args.checkpoint, served_drafter(args.checkpoint, info, p.gguf_type)))


def run_serve(s: ServeSettings, args: ServeArgs, stage: StageRun) -> None:
    """Every arm of ``serve.arms`` served and measured; the report has every arm's figures, the headline the
    drafter's."""
    p = s.serve
    if p.engine is None:
        log.info("serve: off (serve.engine is null); set it to llama.cpp to measure the drafter as served")
        stage.details.update(engine=None)
        write_csv(args.plot, [], PLOT_COLUMNS)
        return
    info = load_target(args.target)
    lineage = check_fits(args.checkpoint, info)
    requests = [r for r in load_requests(args.prompts, args.sets, s.judged.sets, s.judged.max_prompts_per_source,
                                         stage.skips) if r.split == p.split][: p.max_requests]
    how = Decoding(load_tokenizer(info), lineage["enable_thinking"], s.judged)
    served, draft = served_files(p, info, args)
    engine = Engine(p.engine, f"http://127.0.0.1:{p.port}", info.path, sorted(stop_token_ids(info)))
    stage.run.update(idle_cores_at_start=idle_cores())
    order = [*p.arms, "target"] if len(p.arms) > 1 else p.arms  # the target again, last (measure.py)
    runs, target_runs = {}, []
    for arm in tqdm(order, desc="serve", unit="arm"):
        runs[arm] = measure_arm(p, arm, served, draft, engine, requests, how,
                                args.report.with_name(f"serve.{arm}.log"))
        if arm == "target":
            target_runs.append(runs[arm])
    first, *last = target_runs
    runs["target"] = {k: mean_run(first[k], last[0][k]) for k in first} if last else first
    stage.details["target_decode_tokens_per_s"] = [decode_rate(r["greedy"].turns) for r in target_runs]
    arms = {arm: arm_row(arm, r, runs.get("target"), s.judged, args.steps) for arm, r in runs.items()}
    stage.details.update(engine=p.engine, split=p.split, requests=len(requests),
                         turns=len(runs["target"]["greedy"].turns), threads=p.threads, slots=p.slots,
                         exact=p.exact, served={"target": Path(served).name, "drafter": Path(draft.path).name,
                                                "block_size": draft.block_size, "draft_max": p.draft_max}, arms=arms)
    stage.headline.update(headline(arms))
    write_csv(args.plot, plot_rows(arms), PLOT_COLUMNS)
    for arm, r in arms.items():
        log.info("serve %s: %s tokens/s (speed-up %s), acceptance %s", arm, r["tokens_per_s"], r.get("speed_up"),
                 (r["greedy"] or {}).get("acceptance"))
