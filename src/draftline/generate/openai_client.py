"""An async client for OpenAI-compatible ``/v1/chat/completions`` servers (SGLang, its router, vLLM, llama.cpp).

Several endpoints, ``concurrency`` requests in flight on each, every request sent to the least-busy endpoint
with a free slot. Transport errors, timeouts, 429 and 5xx are retried with exponential backoff and jitter, and
an endpoint that just failed that way cools down so that its siblings take the load; any other 4xx (a prompt
longer than the context, say) fails at once, because sending it again cannot help. What no retry can get past stops
the stage (:class:`StageStop`): a refused API key, servers that stay down, a reply from another model. Each reply
carries the engine and version its server reported when the client opened (:func:`server_engine`), asked once per
endpoint over the engines' own routes; a server that does not say is recorded as null, never refused.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from draftline.core.errors import Refusal
from draftline.core.llama_cpp import spec_stats as llama_cpp_spec_stats
from draftline.core.logs import get_logger
from draftline.core.params import ParamsError
from draftline.generate.params import GenerateParams

log = get_logger(__name__)


@dataclass
class ChatResult:
    """One assistant reply as the server returned it."""

    message: dict[str, Any]  # {"role": "assistant", "content", "reasoning_content"?, "tool_calls"?}
    finish_reason: str | None
    usage: dict[str, int]
    # With a drafter: verification steps and the tokens they produced (the prefill's first token not counted);
    # from the local loop, SGLang's meta_info (spec_verify_ct) or llama.cpp's timings. None without one.
    speculative: dict[str, int] | None = None
    # What answered: {"name", "version", ...} (:func:`server_engine` for a server); None where it is not known.
    engine: dict[str, Any] | None = None


class RequestFailed(Exception):
    """A request that did not produce a reply; ``reason`` is the short tag counted in the metrics."""

    def __init__(self, reason: str, detail: str = "", retryable: bool = False, retry_after: float | None = None):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.retryable = retryable
        self.retry_after = retry_after


class StageStop(Refusal):
    """A fault no retry or other prompt can get past: the stage stops (the journal keeps what was done), printing
    its message, which names the endpoint and what to change."""


class ServersDown(StageStop):
    """Every try of a request found no server listening: the servers are down, so the stage stops."""


class WrongModel(StageStop):
    """A reply names another model than the one asked for: keeping it would mix targets in one dataset."""


class AuthError(StageStop):
    """The server refused our credentials (401/403): no request can succeed, so the stage stops at once.

    The message names the endpoint and the setting to fix, never the token."""


@dataclass
class Endpoint:
    url: str
    in_flight: int = 0
    sent: int = 0
    cool_until: float = 0.0
    failures: int = field(default=0)
    engine: dict[str, Any] | None = None  # what the server said it is, when the client opened


# The engine a server names as the ``owned_by`` of its ``/v1/models`` entries (SGLang's, vLLM's and llama.cpp's
# ModelCard), and where each reports its version: SGLang's ``/server_info`` (``/get_server_info`` before it was
# renamed) and vLLM's ``/version`` give ``version``, llama-server's ``/props`` its ``build_info`` (``b<build>-<commit>``).
ENGINES = {"sglang": "sglang", "vllm": "vllm", "llamacpp": "llama.cpp"}
VERSION_ROUTES = {"sglang": (("/server_info", "version"), ("/get_server_info", "version")),
                  "vllm": (("/version", "version"),), "llama.cpp": (("/props", "build_info"),)}


def parse_reply(body: dict[str, Any]) -> ChatResult:
    """Read the first choice of a chat completion; ``reasoning_content`` stays apart from ``content``."""
    choice = body["choices"][0]
    msg = choice["message"]
    message: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
    # SGLang and older vLLM say `reasoning_content`; vLLM >= 0.10 says `reasoning`.
    if reasoning := msg.get("reasoning_content") or msg.get("reasoning"):
        message["reasoning_content"] = reasoning
    if msg.get("tool_calls"):
        message["tool_calls"] = [
            {"type": "function", "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
            for c in msg["tool_calls"]
        ]
    usage = body.get("usage") or {}
    completion = int(usage.get("completion_tokens") or 0)
    return ChatResult(
        message=message,
        finish_reason=choice.get("finish_reason"),
        usage={"prompt_tokens": int(usage.get("prompt_tokens") or 0), "completion_tokens": completion},
        speculative=(_spec_stats(choice.get("meta_info") or body.get("meta_info"), completion)
                     or llama_cpp_spec_stats(body.get("timings"))),
    )


def _spec_stats(meta: dict[str, Any] | None, completion_tokens: int) -> dict[str, int] | None:
    """SGLang's per-request speculative counts (``meta_info``, sent when a request asks ``return_meta_info``):
    ``spec_verify_ct`` verification steps for ``completion_tokens`` tokens, the first from the prefill."""
    steps = (meta or {}).get("spec_verify_ct")
    if not isinstance(steps, int) or steps < 1 or completion_tokens < 1:
        return None
    return {"steps": steps, "tokens": completion_tokens - 1}


@dataclass(frozen=True)
class Transport:
    """How requests are sent: ``generate``'s transport params, none of which changes a reply (not in the journal
    key). Built from the params by :meth:`of`; the client holds no default of its own."""

    concurrency: int  # requests in flight per endpoint
    timeout_s: float  # per request
    retries: int  # of transport errors, timeouts, 429 and 5xx
    backoff_s: float  # first retry delay, doubling each try
    backoff_max_s: float  # cap on a retry delay
    seed: int  # of the retry jitter only
    api_key: str | None = field(repr=False)  # the bearer token (from $generate.api_key_env), never shown

    @classmethod
    def of(cls, s: GenerateParams) -> Transport:
        """From ``params.yaml: generate`` (reads ``$<api_key_env>``: an unset variable is a :class:`ParamsError`)."""
        return cls(s.concurrency, s.timeout_s, s.retries, s.backoff_s, s.backoff_max_s, s.seed, s.api_key())


class ChatClient:
    """Use as ``async with ChatClient(endpoints, transport) as c: result = await c.chat(body, request_id)``.

    Every reply names the engine of the endpoint that gave it: ``engine`` where the caller knows it (a server it
    started from a pinned build), else what each server says when the client opens (:func:`server_engine`)."""

    def __init__(self, endpoints: list[str], transport: Transport, engine: dict[str, Any] | None = None):
        if not endpoints:
            raise ParamsError("params.yaml: generate.endpoints is empty: list at least one server URL, "
                              "e.g. http://127.0.0.1:30000")
        self.endpoints = [Endpoint(u.rstrip("/"), engine=engine) for u in endpoints]
        self.concurrency = transport.concurrency
        self.timeout = aiohttp.ClientTimeout(total=transport.timeout_s)
        self.retries = transport.retries
        self.backoff_s = transport.backoff_s
        self.backoff_max_s = transport.backoff_max_s
        self._rng = random.Random(transport.seed)  # jitter only: it never changes a result
        self._cond = asyncio.Condition()
        self._session: aiohttp.ClientSession | None = None
        self.retried = 0
        # Sent as SGLang's and vLLM's --api-key expect it; kept out of every log line and error message.
        self._headers = {"Authorization": f"Bearer {transport.api_key}"} if transport.api_key else {}

    async def __aenter__(self) -> "ChatClient":
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=self.concurrency)
        unknown = [e for e in self.endpoints if e.engine is None]
        # A session of its own: a connection it left open would let the first request overtake the others.
        async with aiohttp.ClientSession(timeout=self.timeout) as probe:
            engines = await asyncio.gather(*(server_engine(probe, e.url, self._headers) for e in unknown))
        for ep, engine in zip(unknown, engines):
            ep.engine = engine
            log.info("%s serves with %s %s", ep.url, engine["name"] or "an engine it does not name",
                     engine["version"] or "(version not reported)")
        self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        return self

    async def __aexit__(self, *exc) -> None:
        if self._session is not None:
            await self._session.close()

    async def _acquire(self, avoid: Endpoint | None = None) -> Endpoint:
        """A slot on the least-busy endpoint that is not cooling down after a failure.

        A retry goes to another endpoint than the one that just failed it, where there is another. When every
        endpoint is cooling down, the free ones are probed anyway rather than stalling the run.
        """
        async with self._cond:
            while True:
                now = time.monotonic()
                free = [e for e in self.endpoints if e.in_flight < self.concurrency and e is not avoid]
                ready = [e for e in free if e.cool_until <= now]
                if not ready and all(e.cool_until > now for e in self.endpoints):
                    ready = free
                if ready:
                    ep = min(ready, key=lambda e: (e.in_flight, e.sent))
                    ep.in_flight += 1
                    ep.sent += 1
                    return ep
                cooling = [e.cool_until - now for e in self.endpoints if e.cool_until > now]
                try:
                    await asyncio.wait_for(self._cond.wait(), min(cooling) if cooling else None)
                except asyncio.TimeoutError:
                    pass

    async def _release(self, ep: Endpoint) -> None:
        async with self._cond:
            ep.in_flight -= 1
            self._cond.notify_all()  # waiters differ in what they may take (a retry avoids its endpoint)

    async def chat(self, body: dict[str, Any], request_id: str) -> ChatResult:
        """Send one request, retrying what may succeed later; raise :class:`RequestFailed` when out of tries."""
        ep = None
        for attempt in range(self.retries + 1):
            ep = await self._acquire(avoid=ep if len(self.endpoints) > 1 else None)
            try:
                result = await self._post(ep, body, f"{request_id}-{attempt}")
                ep.failures = 0
                return result
            except RequestFailed as e:
                if e.reason == "connection" and attempt == self.retries:
                    raise ServersDown(
                        f"{e.detail}; no server answered any of {self.retries + 1} tries: the servers are down. "
                        "Finished results are in the journal: rerun the stage when they are back"
                    ) from e
                if not e.retryable or attempt == self.retries:
                    raise
                err = e
                ep.failures += 1
                ep.cool_until = time.monotonic() + self._delay(ep.failures - 1)
            finally:
                await self._release(ep)
            # Back off without a slot, so that other requests keep the servers busy meanwhile.
            self.retried += 1
            await asyncio.sleep(max(self._delay(attempt), err.retry_after or 0.0))
        raise AssertionError("unreachable")

    def _delay(self, attempt: int) -> float:
        return min(self.backoff_max_s, self.backoff_s * 2**attempt) * (0.5 + 0.5 * self._rng.random())

    async def _post(self, ep: Endpoint, body: dict[str, Any], request_id: str) -> ChatResult:
        assert self._session is not None, "use ChatClient as an async context manager"
        try:
            async with self._session.post(
                ep.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": request_id, **self._headers}
            ) as resp:
                raw = await resp.read()
                status = resp.status
                retry_after = resp.headers.get("Retry-After")
        except asyncio.TimeoutError as e:
            raise RequestFailed("timeout", f"{ep.url}: no answer within {self.timeout.total}s", True) from e
        except aiohttp.ClientError as e:
            raise RequestFailed("connection", f"{ep.url}: {type(e).__name__}: {e}", True) from e
        if status in (401, 403):
            raise AuthError(
                f"{ep.url} answered {status} ({_error_message(raw)}): it wants an API key, or another one; set "
                "generate.api_key_env to the name of an environment variable holding the server's --api-key"
            )
        if status != 200:
            detail = _error_message(raw)
            retryable = status == 429 or status >= 500
            after = float(retry_after) if retry_after and retry_after.isdigit() else None
            raise RequestFailed(f"http_{status}", f"{ep.url}: {detail}", retryable, after)
        try:
            reply = json.loads(raw)
            result = parse_reply(reply)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            raise RequestFailed("bad_response", f"{ep.url}: {type(e).__name__}: {e}", True) from e
        if reply.get("model") not in (None, body.get("model")):
            raise WrongModel(
                f"{ep.url} answered as model {reply['model']!r} to a request for {body.get('model')!r}: a router or "
                "gateway sent it to another model; point generate.endpoints at servers of the target alone"
            )
        if result.finish_reason == "abort":
            raise RequestFailed("abort", f"{ep.url}: the server aborted the request", True)
        result.engine = ep.engine
        return result


async def server_engine(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> dict[str, Any]:
    """``{"name", "version"}`` of the server at ``url`` as it reports them (:data:`ENGINES`, :data:`VERSION_ROUTES`);
    null where it does not (another server, a route it lacks, no answer): the stage goes on, the rows say unknown."""
    models = await _get_json(session, url + "/v1/models", headers)
    owned = next((m.get("owned_by") for m in (models or {}).get("data") or [] if isinstance(m, dict)), None)
    name = ENGINES.get(owned, owned) if isinstance(owned, str) else None
    for route, key in VERSION_ROUTES.get(name, ()):
        info = await _get_json(session, url + route, headers)
        if info and info.get(key):
            return {"name": name, "version": str(info[key])}
    return {"name": name, "version": None}


async def _get_json(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> dict[str, Any] | None:
    """The JSON object a GET of ``url`` answers with; None for anything else (an error, no answer, not JSON)."""
    try:
        async with session.get(url, headers=headers) as resp:
            body = json.loads(await resp.read()) if resp.status == 200 else None
    except (asyncio.TimeoutError, aiohttp.ClientError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def _error_message(raw: bytes) -> str:
    """The ``message`` of an OpenAI/SGLang error body (``{"object": "error", "message", ...}``), the text of an
    ``{"error": "..."}`` (the --api-key middlewares'), else the raw text."""
    try:
        body = json.loads(raw)
        err = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:500]
        if isinstance(err, str):
            return err[:500]
    except ValueError:
        pass
    return raw[:500].decode("utf-8", errors="replace")
