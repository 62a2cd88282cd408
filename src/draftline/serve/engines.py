"""The engines' own endpoints for token ids in and token ids out, and how each counts speculative steps.

Ids, not text: the served turn decodes exactly the ids evaluate decoded (a chat endpoint would render and tokenize
again, and a server's grammar for tool calls would change the text). llama.cpp ``/completion`` (``prompt`` as ids,
``return_tokens``); SGLang ``/generate`` (``input_ids``; ``meta_info.spec_verify_ct`` per request); vLLM
``/v1/completions`` (a prompt of ids, ``return_token_ids``; speculative counts only server-wide, in ``/metrics``).

Steps, as evaluate counts them (every target forward after the prefill): llama.cpp counts verification steps only
server-wide (``/metrics``, added when a slot is released, which is before it takes the next request), so with one
request in flight (:attr:`Engine.serial`) a request's steps are the counter's change, plus the plain decodes it
does not count (:func:`exact_steps`); with several in flight, the steps its ``timings`` imply
(:func:`draftline.core.llama_cpp.spec_stats`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from draftline.core.errors import Refusal
from draftline.core.llama_cpp import spec_stats

# llama.cpp computing as evaluate does in float32: no flash attention, float32 KV caches for the target and the
# drafter (its defaults, f16 caches and flash attention where it can, flip near-ties of the logits).
EXACT = ["--flash-attn", "off", "-ctk", "f32", "-ctv", "f32", "-ctkd", "f32", "-ctvd", "f32"]


class EngineFailed(Refusal, RuntimeError):
    """A server answered a request with an error: the message has its status and the start of its body."""


@dataclass
class Reply:
    tokens: list[int]  # the output ids, the stop token included
    steps: int | None  # target steps after the prefill (None: not said per request, or no speculation)
    decode_s: float | None  # the engine's own seconds after the first token (llama.cpp's predicted_ms)


@dataclass
class Engine:
    """A started server's client for one run of requests (``session`` is the run's)."""

    name: str  # llama.cpp | sglang | vllm
    url: str
    model: str
    stops: list[int]
    session: aiohttp.ClientSession | None = field(default=None, repr=False)
    serial: bool = False  # one request at a time: llama.cpp's steps from its counters, exactly

    async def complete(self, ids: list[int], sampling: dict[str, Any], seed: int, max_new: int) -> Reply:
        body, path = self.request(ids, sampling, seed, max_new)
        before = await self.verifications() if self.serial and self.name == "llama.cpp" else None
        async with self.session.post(self.url + path, json=body) as r:
            if r.status != 200:
                raise EngineFailed(f"{self.name} answered {r.status}: {(await r.text())[:300]}")
            raw = await r.json()
        reply = self.parse(raw)
        if before is not None:
            reply.steps = exact_steps(raw["timings"], int(await self.verifications() - before))
        return reply

    def request(self, ids: list[int], sampling: dict[str, Any], seed: int, max_new: int) -> tuple[dict, str]:
        if self.name == "llama.cpp":  # min_p off: the sampling evaluate does (top-k, top-p, temperature)
            return ({"prompt": ids, "n_predict": max_new, **sampling, "min_p": 0.0, "seed": seed,
                     "cache_prompt": False, "return_tokens": True}, "/completion")
        if self.name == "sglang":
            params = {"max_new_tokens": max_new, **sampling, "stop_token_ids": self.stops}
            params["top_k"] = params["top_k"] or -1
            return {"input_ids": ids, "sampling_params": params, "sampling_seed": seed}, "/generate"
        return ({"model": self.model, "prompt": ids, "max_tokens": max_new, **sampling, "seed": seed,
                 "stop_token_ids": self.stops, "return_token_ids": True, "skip_special_tokens": False},
                "/v1/completions")

    def parse(self, reply: dict[str, Any]) -> Reply:
        if self.name == "llama.cpp":
            spec = spec_stats(reply.get("timings"))
            return Reply(reply["tokens"], spec["steps"] if spec else None, reply["timings"]["predicted_ms"] / 1000)
        if self.name == "sglang":
            return Reply(reply["output_ids"], (reply.get("meta_info") or {}).get("spec_verify_ct"), None)
        return Reply(reply["choices"][0]["token_ids"], None, None)

    async def verifications(self) -> float:
        async with self.session.get(self.url + "/metrics") as r:
            return counters(await r.text())["drafts"]


def exact_steps(timings: dict[str, Any], verifications: int) -> int:
    """Every target step after the prefill, as evaluate counts them: llama.cpp's verification steps, plus its plain
    decodes, which it does not count: one token each, left over once the verified tokens (each step's accepted drafts
    and one more) are taken out. There is one where a reply reaches ``n_predict`` with a single token left to draft
    for, and every step of a reply nothing was drafted for (an n-gram mode that found no match); a reply that ends on
    an accepted draft (its end-of-turn) has no token after it, and none left over."""
    left = timings["predicted_n"] - 1 - timings.get("draft_n_accepted", 0) - verifications
    return verifications + max(0, left)


def counters(metrics_text: str) -> dict[str, float]:
    """The speculative counters of a Prometheus ``/metrics`` text (llama.cpp's ``llamacpp:``, vLLM's ``vllm:``),
    summed over label sets: accepted drafts and verification steps."""
    out = {"accepted": 0.0, "drafts": 0.0}
    for line in metrics_text.splitlines():
        m = re.match(r"\w+:spec_decode_num_(accepted_tokens|drafts)_total(?:\{[^}]*\})? ([0-9.e+]+)$", line)
        if m:
            out["accepted" if m.group(1) == "accepted_tokens" else "drafts"] += float(m.group(2))
    return out
