"""One arm's server and its runs: the requests decoded by the engine turn by turn, as evaluate decodes them.

An arm is a server started with ``generate.launch``'s own command line (:func:`draftline.core.launch.server_command`:
the DFlash flags and block convention the generate stage uses): ``target`` (no speculation), ``drafter``, or a
training-free mode of llama.cpp (``--spec-type ngram-*``). Each arm serves greedy with one request in flight (the
speed, the steps, the turn-by-turn comparison) and greedy with ``slots`` in flight; the drafter also at evaluate's
sampled setting with one in flight. A turn's prompt is evaluate's render of its messages (ids); a later turn of a
multi-turn request follows the engine's own reply, as evaluate's follows the target's; every turn has evaluate's
seed (:func:`draftline.core.requests.turn_seed`).

The target alone is served again after every other arm, and its turns are the two runs' means
(:func:`mean_run`): each arm is measured after a different stretch of the machine's day, and on a shared 2-core
VM the first server measured decoded up to 20% slower than the same server measured last
(bench/results/2026-12-07-smollm2-served/), which a target measured only first turns into a speed-up for every arm.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from draftline.core.launch import Draft, LaunchParams, LlamaCppParams, Server, launch_env, server_command
from draftline.core.requests import Request, render_prompt, turn_seed
from draftline.serve.engines import EXACT, Engine
from draftline.serve.params import NGRAM_MODES, Judged, ServeParams

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0}


@dataclass
class Turn:
    """One served turn: what the engine returned and how long it took."""

    key: str  # "<id>#<turn>", as evaluate's per-step file names it
    source: str
    tokens: list[int]
    steps: int | None
    seconds: float  # the request's wall time, prompt processing included
    decode_s: float | None  # the engine's own time after the first token, where it says


@dataclass
class Run:
    turns: list[Turn]
    wall_s: float


@dataclass(frozen=True)
class Decoding:
    """How every turn is decoded: the tokenizer and thinking mode of evaluate's render, and evaluate's settings."""

    tokenizer: Any
    thinking: bool | None
    judged: Judged


async def decode(engine: Engine, req: Request, how: Decoding, sampling: dict, setting: str) -> list[Turn]:
    """Every turn of ``req``; a turn too long for evaluate ends the request, as it does in evaluate."""
    messages, turns = list(req.prefix), []
    for i, user in enumerate(req.turns):
        messages.append(user)
        ids = render_prompt(how.tokenizer, messages, req.tools, how.thinking)
        if len(ids) > how.judged.max_prompt_tokens:
            break
        started = time.perf_counter()
        seed = turn_seed(how.judged.seed, setting, req, i) % 2**31
        r = await engine.complete(ids, sampling, seed, how.judged.max_new_tokens)
        turns.append(Turn(f"{req.id}#{i}", req.source, r.tokens, r.steps, time.perf_counter() - started, r.decode_s))
        messages.append({"role": "assistant", "content": how.tokenizer.decode(r.tokens, skip_special_tokens=True)})
    return turns


async def run(engine: Engine, requests: list[Request], how: Decoding, sampling: dict, setting: str,
              in_flight: int) -> Run:
    """Every request with ``in_flight`` at a time; the turns in request order."""
    gate = asyncio.Semaphore(in_flight)

    async def one(req: Request) -> list[Turn]:
        async with gate:
            return await decode(engine, req, how, sampling, setting)

    engine.serial = in_flight == 1
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as engine.session:
        started = time.perf_counter()
        done = await asyncio.gather(*(one(r) for r in requests))
        return Run([t for turns in done for t in turns], time.perf_counter() - started)


def mean_run(first: Run | None, last: Run | None) -> Run | None:
    """The target's two runs as one: each turn's seconds (and the engine's decode seconds) the mean of both; its
    tokens the first run's (greedy, so the same wherever the engine is deterministic)."""
    if first is None or last is None:
        return first or last
    turns = [Turn(a.key, a.source, a.tokens, a.steps, (a.seconds + b.seconds) / 2,
                  (a.decode_s + b.decode_s) / 2 if a.decode_s and b.decode_s else a.decode_s)
             for a, b in zip(first.turns, last.turns, strict=True)]
    return Run(turns, (first.wall_s + last.wall_s) / 2)


def arm_server(p: ServeParams, arm: str, served: str, draft: Draft, model: str, log: Path) -> Server:
    """The arm's server: generate.launch's command line and environment, the arm's training-free mode, the
    drafter's ``draft_max``, and (``exact``, llama.cpp) float32 caches without flash attention."""
    extra = EXACT if p.exact and p.engine == "llama.cpp" else []
    launch = LaunchParams(p.engine, None, 1, 1, "127.0.0.1", p.port, extra, p.health_timeout_s,
                          LlamaCppParams(servers=1, threads=p.threads, slots=p.slots, context=p.context,
                                         gguf_type=p.gguf_type))
    cmd = server_command(served, launch, False, draft if arm == "drafter" else None, alias=model)
    cmd += ["--spec-type", arm] if arm in NGRAM_MODES else []
    if arm == "drafter" and p.draft_max is not None:  # the last of a repeated flag wins
        cmd += ["--spec-draft-n-max", str(min(p.draft_max, draft.block_size - 1))]
    return Server(cmd, f"http://127.0.0.1:{p.port}", log, health_timeout_s=p.health_timeout_s, env=launch_env(launch))


def measure_arm(p: ServeParams, arm: str, served: str, draft: Draft, engine: Engine, requests: list[Request],
                how: Decoding, log: Path) -> dict[str, Run | None]:
    """The arm's runs: greedy one at a time (after one request to warm the server), greedy ``slots`` at a time (with
    one slot, that same run), and for the drafter, sampled one at a time (where ``sampled`` and evaluate has a
    sampled setting)."""
    with arm_server(p, arm, served, draft, engine.model, log):
        asyncio.run(run(engine, requests[:1], how, GREEDY, "greedy", 1))
        greedy = asyncio.run(run(engine, requests, how, GREEDY, "greedy", 1))
        busy = asyncio.run(run(engine, requests, how, GREEDY, "greedy", p.slots)) if p.slots > 1 else greedy
        sampled = None
        if arm == "drafter" and p.sampled and how.judged.sampled:
            sampled = asyncio.run(run(engine, requests, how, how.judged.sampled, "sampled", 1))
    return {"greedy": greedy, "busy": busy, "sampled": sampled}
