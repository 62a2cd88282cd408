"""The generate stage: prompts -> the target's completions, resumable to the row.

1. read the prompts and the target's description; 2. open the journal keyed by what decides a result;
3. send only prompts without a result (SGLang/vLLM over HTTP, or the target in-process), journaling each
result as it finishes; 4. write the shards and failures from the journal in prompt order; 5. write metrics.
"""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import time
from concurrent.futures import Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from tqdm import tqdm

from draftline.core.chat import template_kwargs
from draftline.core.files import write_json
from draftline.core.fingerprint import code_digest
from draftline.core.logs import get_logger
from draftline.core.records import PromptRecord, TargetInfo, dumps, read_prompts
from draftline.core.scratch import scratch_dir
from draftline.core.skips import Skips
from draftline.core.target import load_target
from draftline.core.threads import torch_threads
from draftline.generate.journal import FAILED, OK, PARTIAL, Journal, start_at
from draftline.generate.launcher import Server, launch_env, sglang_command
from draftline.generate.openai_client import ChatClient, ChatResult, RequestFailed
from draftline.generate.params import GenerateParams
from draftline.generate.report import summarize
from draftline.generate.shards import write_outputs
from draftline.generate.turns import dispatch_order, request_messages, split_turns

log = get_logger(__name__)

def prefix_group(p: PromptRecord) -> str:
    """What a server's prefix cache can share between prompts: the leading system turn(s) and the tools."""
    lead = []
    for m in p.messages:
        if m["role"] == "user":
            break
        lead.append(m)
    return hashlib.sha256(dumps([lead, p.tools]).encode("utf-8")).hexdigest()


class Regeneration:
    """One prompt being regenerated turn by turn; ``take`` returns the journal entry once it has ended."""

    def __init__(self, prompt: PromptRecord, thinking: bool, prior: dict[str, Any] | None = None):
        self.prompt = prompt
        self.thinking = thinking
        self.head, self.turns = split_turns(prompt.messages)
        # A failed or half-done conversation resumes after its last finished turn: no finished request is resent.
        self.replies: list[dict[str, Any]] = list(prior["replies"]) if prior else []
        self.usage = dict(prior["usage"]) if prior else {"prompt_tokens": 0, "completion_tokens": 0}

    def next_request(self) -> list[dict[str, Any]]:
        return request_messages(self.head, self.turns, self.replies, len(self.replies))

    def _entry(self, status: str, finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
        return {"id": self.prompt.id, "status": status, "replies": self.replies, "finish_reason": finish_reason,
                "usage": dict(self.usage), **extra}

    def take(self, r: ChatResult) -> dict[str, Any] | None:
        for k in self.usage:
            self.usage[k] += r.usage.get(k, 0)
        truncated = r.finish_reason == "length"
        if self.thinking and not truncated:
            m = r.message
            if not (m.get("content", "").strip() or m.get("tool_calls")) or not m.get("reasoning_content", "").strip():
                return self.fail("empty", "thinking is on but the answer or the reasoning is empty")
        self.replies.append(r.message)
        if truncated or len(self.replies) == len(self.turns):
            return self._entry(OK, r.finish_reason)
        return None

    def partial(self) -> dict[str, Any]:
        return self._entry(PARTIAL)

    def fail(self, reason: str, detail: str) -> dict[str, Any]:
        return self._entry(FAILED, reason=reason, detail=detail)


class Progress:
    """A tqdm bar over conversations with output tokens/s beside completions/s and the ETA."""

    def __init__(self, total: int):
        self.bar = tqdm(total=total, unit="completion", desc="generate", dynamic_ncols=True, mininterval=0.5)
        self.t0 = time.monotonic()
        self.output_tokens = 0
        self.finished = 0
        self._shown = 0.0

    def done(self, entry: dict[str, Any]) -> None:
        self.finished += 1
        self.output_tokens += entry["usage"]["completion_tokens"]
        self.bar.update(1)
        now = time.monotonic()
        if now - self._shown > 1.0:
            self._shown = now
            self.bar.set_postfix_str(f"{self.output_tokens / max(now - self.t0, 1e-9):.0f} out tok/s", refresh=False)

    def close(self) -> None:
        self.bar.close()


class JournalWriter:
    """Journals entries from the event loop with group commit: one fsync covers every entry that queued meanwhile."""

    def __init__(self, journal: Journal):
        self.journal = journal
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            batch = [await self.queue.get()]
            while not self.queue.empty():
                batch.append(self.queue.get_nowait())
            entries = [e for e in batch if e is not None]
            await asyncio.to_thread(self.journal.append_many, entries)
            if None in batch:
                return

    def put(self, entry: dict[str, Any]) -> None:
        if self.task.done():  # the journal failed (a full disk): stop sending requests whose results would be lost
            self.task.result()
        self.queue.put_nowait(entry)

    async def close(self) -> None:
        self.queue.put_nowait(None)
        await self.task


def request_body(s: GenerateParams, model: str) -> dict[str, Any]:
    """The request fields every prompt shares: sampling params and the thinking switch."""
    body: dict[str, Any] = {"model": model, "max_tokens": s.max_tokens, "temperature": s.temperature,
                            "top_p": s.top_p}
    if s.top_k not in (None, -1, 0):
        body["top_k"] = s.top_k
    if s.temperature > 0 and s.seed is not None:
        body["seed"] = s.seed
    body["chat_template_kwargs"] = template_kwargs(s.enable_thinking)
    return body


async def generate_remote(pending: list[PromptRecord], prior: dict[str, dict[str, Any]], s: GenerateParams,
                          endpoints: list[str], model: str, journal: Journal, entries: dict[str, dict[str, Any]],
                          progress: Progress) -> dict[str, int]:
    """Send ``pending`` (already in dispatch order) through one worker per slot; journal every result."""
    base = request_body(s, model)
    writer = JournalWriter(journal)
    it = iter(pending)
    sent = 0

    async def converse(p: PromptRecord) -> None:
        nonlocal sent
        conv = Regeneration(p, s.enable_thinking, prior.get(p.id))
        entry = None
        while entry is None:
            body = {**base, "messages": conv.next_request()}
            if p.tools:
                body["tools"] = p.tools
            try:
                sent += 1
                result = await client.chat(body, f"{p.id}.{len(conv.replies)}")
            except RequestFailed as e:
                entry = conv.fail(e.reason, e.detail)
                break
            entry = conv.take(result)
            if entry is None:
                writer.put(conv.partial())
        entries[p.id] = entry
        writer.put(entry)
        progress.done(entry)

    async def worker() -> None:
        for p in it:  # one shared iterator: each worker takes the next prompt in dispatch order
            if not journal.done(p.id):  # another writer of a shared journal may have finished it meanwhile
                await converse(p)

    async with ChatClient(endpoints, s.concurrency, s.timeout_s, s.retries, s.backoff_s,
                          s.backoff_max_s, s.seed, api_key=s.api_key()) as client:
        try:
            n_workers = min(len(pending), s.concurrency * len(endpoints))
            await asyncio.gather(*(worker() for _ in range(n_workers)))
        finally:
            await writer.close()
        return {"requests": sent, "retries": client.retried}


def generate_local(ordered: list[PromptRecord], pending_ids: set[str], s: GenerateParams, info: TargetInfo,
                   journal: Journal, entries: dict[str, dict[str, Any]], progress: Progress) -> dict[str, int]:
    """Batches are fixed over ALL prompts, so a resumed run computes every batch exactly as an uninterrupted one
    (padding and batch shape change floating-point results); a batch with nothing pending is skipped. The thread
    count is fixed too (``generate.local.threads``, see :mod:`draftline.core.threads`). With ``workers`` > 1 the
    batches are dealt round-robin to that many processes (this one and spawned ones), each journaling its own: the
    same batches, the same threads, hence the same bytes as one process."""
    size, n = s.local.batch_size, s.local.workers
    starts = list(range(0, len(ordered), size))
    first = start_at(len(starts), journal.join())
    starts = starts[first:] + starts[:first]
    if n == 1:
        return {"requests": _run_batches(ordered, starts, pending_ids, s, info, journal, entries, progress), "retries": 0}
    ctx = multiprocessing.get_context("spawn")  # a fork would copy this process's torch threads and locks
    with ProcessPoolExecutor(n - 1, mp_context=ctx) as pool:
        others = [pool.submit(_local_worker, ordered, starts[k::n], pending_ids, s, info, journal.folder)
                  for k in range(1, n)]
        sent = _run_batches(ordered, starts[::n], pending_ids, s, info, journal, entries, progress, others)
        while not all(f.done() for f in others):  # count what the other workers journal while they finish
            wait(others, timeout=1.0)
            _count_others(journal, entries, progress)
        sent += sum(f.result() for f in others)  # a worker's error is raised here
    _count_others(journal, entries, progress)
    return {"requests": sent, "retries": 0}


def _local_worker(ordered: list[PromptRecord], starts: list[int], pending_ids: set[str], s: GenerateParams,
                  info: TargetInfo, folder: Path) -> int:
    """A spawned worker: its share of the batches, journaled to the shared journal (no progress bar of its own)."""
    journal = Journal(folder)
    journal.load()
    try:
        return _run_batches(ordered, starts, pending_ids, s, info, journal, {}, None)
    finally:
        journal.close()


def _run_batches(ordered: list[PromptRecord], starts: list[int], pending_ids: set[str], s: GenerateParams,
                 info: TargetInfo, journal: Journal, entries: dict[str, dict[str, Any]], progress: Progress | None,
                 others: list[Future] = ()) -> int:
    from draftline.generate.local import LocalBackend

    backend = LocalBackend(info, s.sampling, s.enable_thinking, s.local)
    sent = 0
    with torch_threads(s.local.threads):
        for start in starts:
            sent += _generate_batch(ordered[start : start + s.local.batch_size], pending_ids, s, backend, journal,
                                    entries, progress)
            if others:
                _count_others(journal, entries, progress)
    return sent


def _count_others(journal: Journal, entries: dict[str, dict[str, Any]], progress: Progress) -> None:
    """Take the results other workers have journaled into ``entries`` and the progress bar."""
    for pid, entry in journal.refresh().items():
        if pid not in entries and entry["status"] == OK:
            entries[pid] = entry
            progress.done(entry)


def _generate_batch(batch: list[PromptRecord], pending_ids: set[str], s: GenerateParams, backend: Any,
                    journal: Journal, entries: dict[str, dict[str, Any]], progress: Progress) -> int:
    """One fixed batch, turn by turn; its pending results journaled. Returns the requests it made."""
    if not any(p.id in pending_ids and not journal.done(p.id) for p in batch):
        return 0
    sent = 0
    convs = [Regeneration(p, s.enable_thinking) for p in batch]
    ended: dict[str, dict[str, Any]] = {}
    while active := [c for c in convs if c.prompt.id not in ended]:
        results = backend.generate([(c.next_request(), c.prompt.tools) for c in active])
        sent += len(active)
        for c, r in zip(active, results):
            if (entry := c.take(r)) is not None:
                ended[c.prompt.id] = entry
    new = [ended[p.id] for p in batch if p.id in pending_ids]
    journal.append_many(new)
    for e in new:
        entries[e["id"]] = e
        if progress is not None:
            progress.done(e)
    return sent


def dispatch(ordered: list[PromptRecord], pending: list[PromptRecord], entries: dict[str, dict[str, Any]],
             s: GenerateParams, info: TargetInfo, journal: Journal, folder: Path, progress: Progress) -> dict[str, int]:
    """Generate ``pending`` with the configured backend (starting an SGLang server when ``launch`` is set)."""
    if not pending:
        return {"requests": 0, "retries": 0}
    if s.backend == "local":
        return generate_local(ordered, {p.id for p in pending}, s, info, journal, entries, progress)
    first = start_at(len(pending), journal.join())
    pending = pending[first:] + pending[:first]
    prior = {p.id: entries[p.id] for p in pending if p.id in entries}
    model = s.model or info.path
    if s.launch is None:
        return asyncio.run(generate_remote(pending, prior, s, s.endpoints, model, journal, entries, progress))
    cfg = s.launch
    url = f"http://{cfg.host}:{cfg.port}"
    with Server(sglang_command(info.path, cfg, s.enable_thinking), url, folder / "sglang.log", launch_env(cfg),
                cfg.health_timeout_s):
        return asyncio.run(generate_remote(pending, prior, s, [url], model, journal, entries, progress))


def journal_decides(s: GenerateParams, info: TargetInfo) -> dict[str, Any]:
    """What decides a result: the target, the sampling, the thinking mode, the backend, and for the local backend its
    settings (``device: auto`` resolved: the device decides float results, so the key names the one actually used)
    and draftline's generation code, which then computes the replies. A server's replies do not depend on our code,
    so an edit here never throws away hours of journaled SGLang results."""
    decides: dict[str, Any] = {
        "target": {"tokenizer_fingerprint": info.tokenizer_fingerprint,
                   "model_fingerprint": info.model_fingerprint or f"path:{info.path}"},
        "sampling": s.sampling, "enable_thinking": s.enable_thinking, "backend": s.backend,
    }
    if s.backend == "local":
        local = s.local_dict()
        if local["device"] == "auto":
            import torch

            local["device"] = "cuda" if torch.cuda.is_available() else "cpu"
        decides["local"] = local
        decides["code"] = code_digest("draftline.core", "draftline.generate")
    return decides


def run_generate(params: GenerateParams, prompts_path: str | Path = "data/prompts/train.jsonl",
                 target_dir: str | Path = "data/target", out_dir: str | Path = "data/completions",
                 metrics_path: str | Path = "metrics/generate.json", strict: bool = False) -> dict[str, Any]:
    """Run the stage; returns the metrics it wrote."""
    t0 = time.monotonic()
    s = params
    if s.backend == "sglang":
        s.api_key()  # an unset key variable fails here, before any work
    skips = Skips(log, strict=strict)
    prompts = read_prompts(prompts_path, skips)
    info = load_target(target_dir)
    decides = journal_decides(s, info)
    folder = scratch_dir("generate", decides)
    journal = Journal(folder)
    entries = journal.load()
    if journal.torn:
        log.warning("journal %s: %d torn or damaged line(s) ignored, their prompts are sent again",
                    journal.path, journal.torn)
    resumed = sum(1 for p in prompts if entries.get(p.id, {}).get("status") == OK)
    order = dispatch_order([prefix_group(p) for p in prompts])
    ordered = [prompts[i] for i in order]
    pending = [p for p in ordered if entries.get(p.id, {}).get("status") != OK]
    if slot := journal.join():
        log.info("another generate process writes journal %s: this one (writer %d) starts at prompt %d of %d",
                 journal.path, slot, start_at(len(pending), slot), len(pending))
    log.info("%d prompts: %d already in the journal %s, %d to generate with %s",
             len(prompts), resumed, folder, len(pending), s.backend)

    progress = Progress(len(pending))
    try:
        stats = dispatch(ordered, pending, entries, s, info, journal, folder, progress)
        entries = journal.refresh()  # with what another writer of a shared journal recorded meanwhile
    finally:
        progress.close()
        journal.close()

    generation = {"backend": s.backend, **decides["target"], "sampling": s.sampling,
                  "enable_thinking": s.enable_thinking}
    records, n_failed = write_outputs(out_dir, prompts, entries, generation, s.shard_size, s.keep_truncated)
    run = {"stage_seconds": round(time.monotonic() - t0, 2), "resumed": resumed, "finished": progress.finished,
           "output_tokens": progress.output_tokens, "skipped_prompts": skips.as_dict(), "journal": str(folder), **stats}
    metrics = summarize(prompts, entries, records, run)
    write_json(metrics_path, metrics)
    log.info("%d completions written to %s, %d failed (see failures.jsonl), %d truncated",
             len(records), out_dir, n_failed, metrics["truncated"])
    return metrics
