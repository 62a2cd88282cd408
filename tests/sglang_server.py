"""A loopback stand-in for SGLang's OpenAI-compatible server, for tests (SGLang itself needs a GPU).

It answers ``POST /v1/chat/completions`` with the bytes SGLang sends, as defined in SGLang's source
(sgl-project/sglang, python/sglang/srt/entrypoints/openai/):
- protocol.py ``ChatCompletionResponse``: ``id, object="chat.completion", created, model, choices, usage,
  metadata`` (``sglext`` dropped when None); ``ChatCompletionResponseChoice``: ``index, message, logprobs,
  finish_reason, matched_stop`` (hidden_states / token ids / meta_info dropped when None); ``ChatMessage``:
  ``role, content, reasoning_content, tool_calls``; ``UsageInfo``: ``prompt_tokens, total_tokens,
  completion_tokens, prompt_tokens_details, reasoning_tokens``;
- serving_chat.py ``_build_chat_response``: ``content=text if text else None``, ``reasoning_content`` only
  when a reasoning parser runs and ``chat_template_kwargs.enable_thinking`` (default True) is on, ``id`` from
  the request's meta_info id, ``model`` echoed from the request;
- serving_base.py ``create_error_response``: errors are ``{"object": "error", "message", "type", "param",
  "code"}`` with the HTTP status as ``code`` (``BadRequestError`` 400 by default), sent as compact JSON
  (ORJSONResponse), as are successful answers.

Faults on demand, per prompt id (the part of ``X-Request-Id`` before the first "."): ``faults[id]`` is a list
of actions taken by its successive requests: "400", "429", "500", "503" (error bodies as above), "drop"
(connection closed with no answer), "cut" (the body stops half-way), "notjson" (a 200 with an HTML page), "nochoices"
(a 200 with an empty ``choices``), "othermodel" (a reply naming another model), "ok". ``truncate`` holds ids answered
with ``finish_reason: "length"``. ``delay_s`` delays every answer. Every request is logged in ``requests``.
``api_key`` makes it answer as ``--api-key`` does: 401 ``{"error": "Unauthorized"}`` without ``Bearer <key>``.
``spec_accept_length`` makes it answer as a server run with ``--speculative-algorithm``: a request that asks
``return_meta_info`` gets the choice's ``meta_info`` with ``spec_verify_ct``, the verification steps its
completion tokens took (``completion_tokens / spec_accept_length``, rounded up), as SGLang's scheduler counts them.

What a server says it is: ``engine`` ("sglang", the default; "vllm"; "llama.cpp") decides the ``owned_by`` of its
``GET /v1/models`` entries (SGLang's and vLLM's ModelCard: "sglang", "vllm"; llama.cpp's tools/server
server-context.cpp ``get_res_model_info``: "llamacpp") and the route that reports ``version``: SGLang's
http_server.py ``GET /server_info`` (``GET /get_server_info`` its deprecated alias; both the server args, the
scheduler info, ``internal_states`` and ``version``), vLLM's api_server ``GET /version`` (``{"version"}``),
llama-server's ``GET /props`` (``build_info``: ``b<build number>-<commit>``, beside ``model_path``, ``total_slots``,
``chat_template``, ...). ``version=None`` leaves that route out (404), as a server that does not report it.

Run as a script (``python tests/sglang_server.py --port 30000``) it serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import threading
import time
import uuid
from typing import Any

from aiohttp import web

EOS_ID = 151645  # <|im_end|>: SGLang reports it as matched_stop when generation stops on it
WORDS = ("the", "answer", "is", "simple", "first", "we", "note", "that", "each", "step", "holds", "so", "done")
ERROR_TYPES = {400: "BadRequestError", 429: "TooManyRequestsError", 500: "InternalServerError",
               503: "ServiceUnavailableError"}


def compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def error_body(status: int, message: str) -> bytes:
    return compact({"object": "error", "message": message, "type": ERROR_TYPES[status], "param": None,
                    "code": status})


def reply_for(body: dict[str, Any]) -> tuple[str, str]:
    """A deterministic (reasoning, answer) for a request: the same request always gets the same reply."""
    key = compact([body.get("messages"), body.get("tools"), body.get("chat_template_kwargs")])
    h = hashlib.sha256(key).digest()
    answer = " ".join(WORDS[b % len(WORDS)] for b in h[: 3 + h[0] % 8])
    reasoning = "Let me think: " + " ".join(WORDS[b % len(WORDS)] for b in h[8 : 10 + h[1] % 6])
    return reasoning, f"[{h.hex()[:8]}] {answer}."


class FakeSGLang:
    def __init__(self, model: str = "default", delay_s: float = 0.0, reasoning_parser: bool = True,
                 faults: dict[str, list[str]] | None = None, truncate: set[str] | frozenset = frozenset(),
                 api_key: str | None = None, spec_accept_length: float | None = None, engine: str = "sglang",
                 version: str | None = "0.5.4", tool_calls: dict[str, list[dict[str, Any]]] | None = None):
        self.model = model
        # Per prompt id, the `tool_calls` its reply carries, as SGLang's tool-call parser returns them.
        self.tool_calls = tool_calls or {}
        self.engine = engine
        self.version = version
        self.spec_accept_length = spec_accept_length
        self.api_key = api_key
        self.delay_s = delay_s
        self.reasoning_parser = reasoning_parser
        self.faults = {k: list(v) for k, v in (faults or {}).items()}
        self.truncate = set(truncate)
        self.requests: list[dict[str, Any]] = []
        self.port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        if self.version is not None:
            routes = {"sglang": ["/server_info", "/get_server_info"], "vllm": ["/version"], "llama.cpp": ["/props"]}
            for route in routes[self.engine]:
                app.router.add_get(route, self.info)
        return app

    async def info(self, request: web.Request) -> web.Response:
        """The version route of ``engine``, in its shape (a few of the other fields beside it)."""
        if self.engine == "vllm":
            body: dict[str, Any] = {"version": self.version}
        elif self.engine == "llama.cpp":
            body = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1, "model_alias": self.model,
                    "model_path": "/models/target.gguf", "chat_template": "", "build_info": self.version,
                    "is_sleeping": False}
        else:
            body = {"model_path": self.model, "tp_size": 1, "dp_size": 1, "max_total_num_tokens": 65536,
                    "internal_states": [{"avg_spec_accept_length": None}], "version": self.version}
        return web.Response(body=compact(body), content_type="application/json")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        data = {"object": "list", "data": [{"id": self.model, "object": "model", "created": int(time.time()),
                                            "owned_by": {"llama.cpp": "llamacpp"}.get(self.engine, self.engine),
                                            "root": self.model, "parent": None,
                                            "max_model_len": 4096}]}
        return web.Response(body=compact(data), content_type="application/json")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            # SGLang's --api-key middleware (srt/utils add_api_key_middleware): 401 {"error": "Unauthorized"}.
            return web.Response(status=401, body=compact({"error": "Unauthorized"}), content_type="application/json")
        rid = request.headers.get("X-Request-Id", "")
        pid = rid.split(".", 1)[0]
        queue = self.faults.get(pid)
        action = queue.pop(0) if queue else "ok"
        entry = {"rid": rid, "id": pid, "action": action, "t": time.monotonic()}
        self.requests.append(entry)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if action.isdigit():
            status = int(action)
            msg = {400: "Requested token count exceeds the model's maximum context length of 4096 tokens.",
                   429: "Too many requests", 500: "Internal server error: CUDA error",
                   503: "The server is overloaded; retry later"}[status]
            return web.Response(status=status, body=error_body(status, msg), content_type="application/json")
        if action == "drop":
            request.transport.abort()
            raise asyncio.CancelledError
        if action == "notjson":  # a proxy's error page with status 200
            return web.Response(status=200, body=b"<html><body>502 Bad Gateway</body></html>", content_type="text/html")
        if action == "nochoices":
            return web.Response(body=compact({"id": uuid.uuid4().hex, "object": "chat.completion", "choices": []}),
                                content_type="application/json")
        try:
            body = json.loads(await request.read())
            entry["body"] = body
            if not isinstance(body.get("messages"), list) or not body["messages"]:
                raise ValueError("messages: Field required")
        except ValueError as e:
            return web.Response(status=400, body=error_body(400, str(e)), content_type="application/json")
        answer = self.response(body, truncated=pid in self.truncate, tool_calls=self.tool_calls.get(pid))
        if action == "othermodel":
            answer["model"] = "another-model"
        payload = compact(answer)
        if action == "cut":
            resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            resp.content_length = len(payload)
            await resp.prepare(request)
            await resp.write(payload[: len(payload) // 2])
            request.transport.abort()
            raise asyncio.CancelledError
        return web.Response(body=payload, content_type="application/json")

    def response(self, body: dict[str, Any], truncated: bool,
                 tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        reasoning, answer = reply_for(body)
        thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
        max_tokens = int(body.get("max_tokens") or 128)
        if truncated:  # cut inside the think block: all of it reads as reasoning, the answer is empty
            text, reasoning_text, n_out = None, reasoning, max_tokens
            finish, matched = "length", None
            if not (thinking and self.reasoning_parser):
                text, reasoning_text = ("<think>\n" + reasoning if thinking else answer), None
        else:
            n_out = len(answer.split()) + (len(reasoning.split()) if thinking else 0) + 1
            finish, matched = "stop", EOS_ID
            if thinking and self.reasoning_parser:
                text, reasoning_text = answer, reasoning + "\n"
            elif thinking:
                text, reasoning_text = f"<think>\n{reasoning}\n</think>\n\n{answer}", None
            else:
                text, reasoning_text = answer, None
        n_prompt = len(compact(body["messages"])) // 4
        choice_meta = None
        if self.spec_accept_length and body.get("return_meta_info"):
            choice_meta = {"id": uuid.uuid4().hex, "finish_reason": {"type": finish}, "prompt_tokens": n_prompt,
                           "completion_tokens": n_out, "cached_tokens": 0,
                           "spec_verify_ct": -(-n_out // self.spec_accept_length)}
        return {
            "id": uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "default"),
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text or None, "reasoning_content": reasoning_text,
                            "tool_calls": tool_calls},
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": matched,
                **({"meta_info": choice_meta} if choice_meta else {}),
            }],
            "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_out, "completion_tokens": n_out,
                      "prompt_tokens_details": None, "reasoning_tokens": 0},
            "metadata": None,
        }

    # --- running it beside a test -------------------------------------------------------------------------
    def start(self, port: int = 0) -> "FakeSGLang":
        self._thread = threading.Thread(target=self._serve, args=(port,), daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake SGLang server did not start")
        return self

    def _serve(self, port: int) -> None:
        self._loop = asyncio.new_event_loop()
        runner = web.AppRunner(self.app(), access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", port)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> "FakeSGLang":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--delay", type=float, default=0.0)
    args = ap.parse_args()
    web.run_app(FakeSGLang(delay_s=args.delay).app(), host="127.0.0.1", port=args.port, access_log=None,
                print=None)
