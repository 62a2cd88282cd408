"""Generation through the real llama-server (``generate.launch.engine: llama.cpp``) on the embedded target: the stage
converts the target with llama.cpp's own converter, starts the pinned server on it, sends every prompt through the
OpenAI client and the journal, and stops it; the replies are the target's greedy replies; with a drafter, the same
replies, and each request's verification steps journaled; a drafter of another target is refused before any
server starts."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import aiohttp
import pytest
from generate_helpers import gen_params, make_prompts

from draftline.core.chat import render
from draftline.core.files import write_jsonl
from draftline.core.gguf import served_target
from draftline.core.launch import Server, launch_env, launches, server_command
from draftline.core.runner import execute
from draftline.drafter.config import DrafterMismatch
from draftline.generate.journal import Journal
from draftline.generate.openai_client import server_engine
from draftline.generate.stage import GenerateArgs, run_generate

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def params(**kw) -> dict:
    launch = {"engine": "llama.cpp", "gpus": None, "dp_size": 1, "tp_size": 1, "host": "127.0.0.1",
              # float32 caches, no flash attention: llama.cpp computing as transformers does (its f16 caches can
              # flip a near-tie of the logits), since the replies are compared with transformers' own
              "port": free_port(), "extra_args": ["--flash-attn", "off", "-ctk", "f32", "-ctv", "f32", "-ctkd", "f32",
                                                  "-ctvd", "f32"], "health_timeout_s": 120,
              "llama_cpp": {"servers": 2, "threads": 1, "slots": 1, "context": 1024, "gguf_type": "f32"}}
    return {"backend": "sglang", "endpoints": [], "launch": launch, "concurrency": 2, "max_tokens": 12,
            "temperature": 0.0, "max_truncated_share": 1.0, "keep_truncated": True, "shard_size": 3, **kw}


def run(folder: Path, target: Path, p: dict):
    args = GenerateArgs(prompts=folder / "train.jsonl", target=target / "target.json", out=folder / "out",
                        metrics=folder / "metrics.json", report=folder / "report.json", drafters=folder / "drafters")
    return execute("generate", run_generate, gen_params(p), args)


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted((folder / "out").glob("part-*")) for line in open(f)]


def greedy_reply(target: Path, messages: list[dict], max_tokens: int) -> str:
    """The target's own greedy reply in transformers (float32, one prompt), decoded as the server decodes it."""
    from draftline.core.target_loader import load_model, load_target, load_tokenizer

    info = load_target(target / "target.json")
    tok, model = load_tokenizer(info), load_model(info, dtype="float32")
    ids = tok(render(tok, messages, None, enable_thinking=False, generation_prompt=True), add_special_tokens=False,
              return_tensors="pt")["input_ids"]
    stops = [info.end_of_turn_token_id, info.eos_token_id]
    out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, eos_token_id=stops)[0, ids.shape[1]:]
    return tok.decode([t for t in out.tolist() if t not in stops], skip_special_tokens=True)


@pytest.fixture
def project(tmp_path, embedded_target, monkeypatch, llama_server):
    monkeypatch.setenv("DRAFTLINE_CACHE", str(tmp_path / "cache"))
    prompts = make_prompts(6)
    write_jsonl(tmp_path / "train.jsonl", prompts)
    return tmp_path, prompts


def test_llama_server_generates_the_targets_greedy_replies_and_resumes(project, embedded_target):
    folder, prompts = project
    m = run(folder, embedded_target, params())
    got = rows(folder)
    assert [r["id"] for r in got] == [p.id for p in prompts] and m.headline["rows"] == 6
    for p, r in zip(prompts, got):
        assert r["messages"][-1]["content"] == greedy_reply(embedded_target, p.messages, 12), p.id
    key = json.loads(next((folder / "cache").glob("generate/*/key.json")).read_text())
    assert key["served"] == {"engine": "llama.cpp", "version": "11434.0.0", "gguf": "f32"}
    # The pinned build the stage started (its own /props says b0-unknown: an sdist has no git history).
    assert {r["generation"]["engine"]["version"] for r in got} == {"11434.0.0"}
    log = Path(m.run["server_log"])
    assert log.parent == folder and "llama" in log.read_text(errors="replace")
    again = run(folder, embedded_target, params())  # everything journaled: no server, no request
    assert again.run["resumed"] == 6 and again.run["requests"] == 0


def test_the_real_llama_server_says_what_it_is_as_the_client_reads_it(project, embedded_target):
    """``GET /v1/models`` (``owned_by: llamacpp``) and ``GET /props`` (``build_info``) of the pinned build, read by the
    probe every endpoint gets: its build_info is b0-unknown, which is why a launched one records the pinned release."""
    folder, _ = project
    launch = gen_params(params()).launch
    one = launches(launch)[0]
    url = f"http://{one.host}:{one.port}"
    gguf = str(served_target(embedded_target / "target.json", launch.llama_cpp.gguf_type))

    async def probe() -> dict:
        async with aiohttp.ClientSession() as session:
            return await server_engine(session, url, {})

    with Server(server_command(gguf, one, False, None, alias="target"), url, folder / "server.log",
                health_timeout_s=120, env=launch_env(launch)):
        assert asyncio.run(probe()) == {"name": "llama.cpp", "version": "b0-unknown"}


def test_a_drafter_changes_the_speed_not_the_replies(project, embedded_target, monkeypatch):
    from drafter_support import untrained_drafter

    folder, _ = project
    run(folder, embedded_target, params())
    plain = rows(folder)
    drafter = untrained_drafter(embedded_target / "target.json", folder / "drafters" / "round1", block_size=4, tapped=2)
    monkeypatch.setenv("DRAFTLINE_CACHE", str(folder / "cache-spec"))  # a fresh journal: every prompt sent again
    run(folder, embedded_target, params(draft_model=str(drafter)))
    assert [r["messages"] for r in rows(folder)] == [r["messages"] for r in plain]
    entries = Journal(next((folder / "cache-spec").glob("generate/*"))).load()
    counted = [e["speculative"] for e in entries.values() if e.get("speculative")]
    assert counted and all(1 <= c["steps"] <= c["tokens"] for c in counted)


def test_a_drafter_of_another_target_is_refused_before_the_server_starts(project, embedded_target):
    from drafter_support import untrained_drafter

    folder, _ = project
    drafter = untrained_drafter(embedded_target / "target.json", folder / "drafters" / "other", block_size=4, tapped=2)
    config = json.loads((drafter / "config.json").read_text())
    config["draftline"]["tokenizer_fingerprint"] = "another-tokenizer"
    (drafter / "config.json").write_text(json.dumps(config))
    with pytest.raises(DrafterMismatch, match="another tokenizer"):
        run(folder, embedded_target, params(draft_model=str(drafter)))
    assert not (folder / "generate.llama.cpp.log").exists()
