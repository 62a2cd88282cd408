"""The HTTP client against the loopback SGLang stand-in: replies, retries, immediate 4xx failure, load sharing."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest
from generate_helpers import gen_params
from sglang_server import FakeSGLang, reply_for

from draftline.generate.openai_client import (
    ChatClient,
    RequestFailed,
    ServersDown,
    Transport,
    WrongModel,
    parse_reply,
    server_engine,
)

BODY = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "temperature": 0.0,
        "chat_template_kwargs": {"enable_thinking": True}}


def transport(**kw) -> Transport:
    """params.yaml's transport settings with quick retries and ``kw`` (the client has no defaults of its own)."""
    return Transport.of(gen_params({"backoff_s": 0.01, "backoff_max_s": 0.05, **kw}))


def chat(urls, body=BODY, rid="p1.0", **kw):
    async def go():
        async with ChatClient(urls, transport(**kw)) as c:
            return await c.chat(body, rid), c.retried

    return asyncio.run(go())


def test_reply_parsed_with_reasoning_apart():
    with FakeSGLang() as srv:
        r, retried = chat([srv.url])
    reasoning, answer = reply_for(BODY)
    assert r.message == {"role": "assistant", "content": answer, "reasoning_content": reasoning + "\n"}
    assert r.finish_reason == "stop" and retried == 0
    assert r.usage["completion_tokens"] == len(answer.split()) + len(reasoning.split()) + 1


@pytest.mark.parametrize("fault", ["429", "500", "503", "drop", "cut", "notjson", "nochoices"])
def test_transient_faults_are_retried_until_success(fault):
    with FakeSGLang(faults={"p1": [fault, fault, "ok"]}) as srv:
        r, retried = chat([srv.url], retries=3)
        assert [q["action"] for q in srv.requests] == [fault, fault, "ok"]
    assert retried == 2 and r.message["content"] == reply_for(BODY)[1]


def test_out_of_retries_fails_with_the_reason():
    with FakeSGLang(faults={"p1": ["503"] * 5}) as srv:
        with pytest.raises(RequestFailed) as e:
            chat([srv.url], retries=2)
        assert len(srv.requests) == 3
    assert e.value.reason == "http_503" and "overloaded" in e.value.detail


def test_400_fails_at_once():
    with FakeSGLang(faults={"p1": ["400", "ok"]}) as srv:
        with pytest.raises(RequestFailed) as e:
            chat([srv.url], retries=5)
        assert len(srv.requests) == 1
    assert e.value.reason == "http_400" and not e.value.retryable
    assert "context length" in e.value.detail


def test_timeout_is_retried():
    with FakeSGLang(delay_s=0.5) as srv:
        with pytest.raises(RequestFailed) as e:
            chat([srv.url], retries=1, timeout_s=0.1)
        assert len(srv.requests) == 2
    assert e.value.reason == "timeout"


def test_several_endpoints_share_the_load_and_a_dead_one_is_routed_around():
    async def many(urls, n):
        async with ChatClient(urls, transport(concurrency=4, backoff_max_s=0.02)) as c:
            bodies = [{**BODY, "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(n)]
            return await asyncio.gather(*(c.chat(b, f"p{i}.0") for i, b in enumerate(bodies)))

    with FakeSGLang(delay_s=0.02) as a, FakeSGLang(delay_s=0.02) as b:
        results = asyncio.run(many([a.url, b.url], 40))
        assert len(results) == 40
        # Least-busy dispatch, 4 slots each: both carry a real share (the faster one a larger one).
        assert min(len(a.requests), len(b.requests)) >= 8, (len(a.requests), len(b.requests))
        assert len(a.requests) + len(b.requests) == 40
        dead = "http://127.0.0.1:9"  # nothing listens there: connection refused
        n_before = len(a.requests)
        results = asyncio.run(many([dead, a.url], 20))
        assert len(results) == 20 and len(a.requests) - n_before == 20


def test_error_body_has_sglang_shape():
    from sglang_server import error_body

    assert json.loads(error_body(400, "bad")) == {"object": "error", "message": "bad", "type": "BadRequestError",
                                                  "param": None, "code": 400}
    # Field order as SGLang's ErrorResponse serialises it.
    assert list(json.loads(error_body(503, "x"))) == ["object", "message", "type", "param", "code"]


def test_vllm_reply_shape_reads_the_same():
    vllm = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "4", "reasoning": "2+2", "tool_calls": []},
                         "logprobs": None, "finish_reason": "stop", "stop_reason": None}],
            "usage": {"prompt_tokens": 9, "total_tokens": 12, "completion_tokens": 3, "prompt_tokens_details": None}}
    r = parse_reply(vllm)
    assert r.message == {"role": "assistant", "content": "4", "reasoning_content": "2+2"}
    assert r.usage == {"prompt_tokens": 9, "completion_tokens": 3} and r.finish_reason == "stop"


def test_a_reply_from_another_model_stops_everything():
    with FakeSGLang(faults={"p1": ["othermodel"]}) as srv:
        with pytest.raises(WrongModel, match="another-model"):
            chat([srv.url], retries=3)
        assert len(srv.requests) == 1


def test_servers_that_stay_down_stop_the_stage_naming_the_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(ServersDown, match=rf"{dead}.*no server answered any of 3 tries"):
        chat([dead], retries=2)


def test_the_api_key_is_never_shown():
    t = Transport(4, 1.0, 0, 0.01, 0.05, 0, "s3cret-token")
    assert "s3cret-token" not in repr(t) and "s3cret-token" not in str(t)


@pytest.mark.parametrize("engine,version", [("sglang", "0.5.4.post1"), ("vllm", "0.11.0"),
                                            ("llama.cpp", "b7123-5c0bf8a")])
def test_each_reply_names_the_engine_and_version_its_server_reports(engine, version):
    with FakeSGLang(engine=engine, version=version) as srv:
        r, _ = chat([srv.url])
    assert r.engine == {"name": engine, "version": version}


def test_a_server_that_does_not_report_its_version_or_engine_is_recorded_as_null():
    with FakeSGLang(version=None) as srv:  # no /server_info nor /get_server_info: the engine alone
        r, _ = chat([srv.url])
    assert r.engine == {"name": "sglang", "version": None}

    async def probe(url):
        async with aiohttp.ClientSession() as session:
            return await server_engine(session, url, {})

    with socket.socket() as s:  # nothing listens there: no /v1/models to name an engine
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert asyncio.run(probe(closed)) == {"name": None, "version": None}


def test_an_engine_the_caller_knows_is_recorded_without_asking():
    async def go(url):
        async with ChatClient([url], transport(), {"name": "llama.cpp", "version": "11434.0.0"}) as c:
            return await c.chat(BODY, "p1.0")

    with FakeSGLang() as srv:  # which would say sglang 0.5.4 if asked
        r = asyncio.run(go(srv.url))
    assert r.engine == {"name": "llama.cpp", "version": "11434.0.0"}
