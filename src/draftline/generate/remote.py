"""The ``sglang`` backend's driver: the pending prompts sent over HTTP to OpenAI-compatible servers.

Invariants:

- **One worker per slot** (``concurrency`` x endpoints) takes the next prompt from one shared walk through the
  pending prompts in dispatch order; writer ``n`` of a shared journal starts that walk at
  :func:`~draftline.generate.journal.start_at`, and a prompt another writer has finished meanwhile is skipped.
- **Every result is journaled** (group commit, :class:`JournalWriter`) as it finishes, an unfinished multi-turn
  conversation as ``partial`` after each turn; once the journal fails (a full disk) no further request is sent.
- **Every request carries the same fields** (:func:`request_body`): the sampling params and the thinking switch;
  the transport settings (:class:`~draftline.generate.openai_client.Transport`) never change a reply.
"""

from __future__ import annotations

import asyncio
from typing import Any

from draftline.core.chat import template_kwargs
from draftline.core.records import PromptRecord
from draftline.generate.journal import Journal, start_at
from draftline.generate.openai_client import ChatClient, RequestFailed, Transport
from draftline.generate.params import GenerateParams
from draftline.generate.regeneration import Regeneration
from draftline.generate.work import Work


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
    if s.draft_model is not None:
        # SGLang's per-request speculative counts (meta_info.spec_verify_ct); vLLM ignores the field and reports
        # acceptance only server-wide, in its /metrics counters (vllm:spec_decode_num_accepted_tokens_total).
        body["return_meta_info"] = True
    return body


async def generate_remote(work: Work, s: GenerateParams, endpoints: list[str], model: str,
                          engine: dict[str, Any] | None = None) -> dict[str, int]:
    """Send ``work``'s pending prompts to ``endpoints`` asking for ``model``; journal every result with the engine
    that answered it (``engine`` where the caller knows it, else what each server reports). Returns the requests
    sent and the retries they took."""
    pending = work.plan.pending
    first = start_at(len(pending), work.journal.join())
    pending = pending[first:] + pending[:first]
    prior = {p.id: work.entries[p.id] for p in pending if p.id in work.entries}
    base = request_body(s, model)
    writer = JournalWriter(work.journal)
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
        writer.put(entry)
        work.record(entry)

    async def worker() -> None:
        for p in it:  # one shared iterator: each worker takes the next prompt in dispatch order
            if not work.journal.done(p.id):  # another writer of a shared journal may have finished it meanwhile
                await converse(p)

    async with ChatClient(endpoints, Transport.of(s), engine) as client:
        try:
            n_workers = min(len(pending), s.concurrency * len(endpoints))
            await asyncio.gather(*(worker() for _ in range(n_workers)))
        finally:
            await writer.close()
        return {"requests": sent, "retries": client.retried}
