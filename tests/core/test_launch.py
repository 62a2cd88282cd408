"""The launch path: the SGLang, vLLM and llama.cpp command lines (with and without a drafter), and the start /
health wait / stop cycle on a real process."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from draftline.core.errors import Refusal
from draftline.core.launch import Draft, LaunchParams, Server, ServerFailed, launch_env, launches, server_command

# params.yaml's commented launch example: generate.launch takes every key once it is set.
LAUNCH = {"engine": "sglang", "gpus": None, "dp_size": 1, "tp_size": 1, "host": "127.0.0.1", "port": 30000, "extra_args": [],
          "health_timeout_s": 1800}


LLAMA_CPP = {"servers": 1, "threads": 1, "slots": 2, "context": 2048, "gguf_type": "f32"}


def launch(**kw) -> LaunchParams:
    return LaunchParams.parse({**LAUNCH, **kw}, "generate.launch")

REPO = Path(__file__).resolve().parents[2]


def test_sglang_command_line():
    cmd = server_command("/dev/shm/Qwen3-8B", launch(dp_size=8, port=31000, extra_args=["--mem-fraction-static", "0.85"]),
                         True, None, "python")
    assert cmd == ["python", "-m", "sglang.launch_server", "--model-path", "/dev/shm/Qwen3-8B", "--host", "127.0.0.1",
                   "--port", "31000", "--dp-size", "8", "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25",
                   "--mem-fraction-static", "0.85"]
    off = server_command("/m", launch(tp_size=2), False, None, "python")
    assert "--reasoning-parser" not in off and "--dp-size" not in off
    assert off[-4:] == ["--tp-size", "2", "--tool-call-parser", "qwen25"]
    assert launch_env(launch(gpus=[0, 3]))["CUDA_VISIBLE_DEVICES"] == "0,3"
    assert launch_env(launch(gpus="4,5"))["CUDA_VISIBLE_DEVICES"] == "4,5"


@pytest.fixture
def drafter_dir(tmp_path) -> Path:
    """A drafter folder as far as the servers read it before loading: its config.json with the block size."""
    (tmp_path / "drafter").mkdir()
    (tmp_path / "drafter" / "config.json").write_text('{"architectures": ["DFlashDraftModel"], "block_size": 16}')
    return tmp_path / "drafter"


def test_a_drafter_makes_each_engine_speculate_in_its_own_block_convention(drafter_dir, llama_server):
    draft = Draft.of(drafter_dir)
    sglang = server_command("/m", launch(), False, draft, "python")
    # SGLang's --speculative-num-draft-tokens is the whole block (the verified token + 15 drafts).
    assert sglang[-6:] == ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(drafter_dir),
                           "--speculative-num-draft-tokens", "16"]
    vllm = server_command("/m", launch(engine="vllm", tp_size=4, extra_args=["--max-model-len", "8192"]), True,
                          draft, "/venv/bin/python")
    assert vllm[:3] == ["/venv/bin/vllm", "serve", "/m"]
    assert vllm[vllm.index("--tensor-parallel-size") + 1] == "4" and "--reasoning-parser" in vllm
    spec = json.loads(vllm[vllm.index("--speculative-config") + 1])
    # vLLM's num_speculative_tokens counts the drafts alone: block size - 1.
    assert spec == {"method": "dflash", "model": str(drafter_dir), "num_speculative_tokens": 15}
    assert vllm[-2:] == ["--max-model-len", "8192"]
    # llama.cpp: the pinned server, the drafter's GGUF, --spec-draft-n-max the drafts alone (block size - 1).
    cpp = server_command("/t.gguf", launch(engine="llama.cpp", llama_cpp=LLAMA_CPP), False, Draft("/d.gguf", 16),
                         alias="/models/target")
    assert cpp[0] == str(llama_server)
    assert cpp[cpp.index("--model") + 1] == "/t.gguf" and cpp[cpp.index("--alias") + 1] == "/models/target"
    assert cpp[cpp.index("--parallel") + 1] == "2" and cpp[cpp.index("--ctx-size") + 1] == "4096"
    assert cpp[-6:] == ["--model-draft", "/d.gguf", "--spec-type", "draft-dflash", "--spec-draft-n-max", "15"]
    (drafter_dir / "config.json").write_text("{}")
    with pytest.raises(Refusal, match="block_size"):
        Draft.of(drafter_dir)
    with pytest.raises(Refusal, match="does not exist"):
        Draft.of(drafter_dir / "nowhere")


def test_llama_cpp_needs_its_section():
    with pytest.raises(Refusal, match="llama_cpp is missing"):
        launch(engine="llama.cpp")
    with pytest.raises(Refusal, match="threads and slots >= 1"):
        launch(engine="llama.cpp", llama_cpp={**LLAMA_CPP, "slots": 0})


def test_llama_cpp_runs_a_server_per_port_and_sglang_one():
    three = launches(launch(engine="llama.cpp", port=31000, llama_cpp={**LLAMA_CPP, "servers": 3}))
    assert [one.port for one in three] == [31000, 31001, 31002]
    auto = launches(launch(engine="llama.cpp", llama_cpp={**LLAMA_CPP, "servers": "auto"}))
    assert 1 <= len(auto) <= (os.cpu_count() or 1)
    assert [one.port for one in launches(launch(dp_size=8))] == [30000]  # SGLang's ranks share one port


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_started_waited_for_and_stopped(tmp_path):
    port = free_port()
    argv = [sys.executable, str(REPO / "tests/sglang_server.py"), "--port", str(port)]
    with Server(argv, f"http://127.0.0.1:{port}", tmp_path / "server.log", health_timeout_s=60) as srv:
        proc = srv.proc
        assert proc.poll() is None
    assert proc.poll() is not None  # stopped with its process group
    assert (tmp_path / "server.log").exists()


def test_server_that_dies_early_is_reported(tmp_path):
    argv = [sys.executable, "-c", "import sys; print('CUDA out of memory'); sys.exit(3)"]
    with pytest.raises(ServerFailed, match="exited with code 3") as e:
        with Server(argv, f"http://127.0.0.1:{free_port()}", tmp_path / "s.log", health_timeout_s=30):
            pass
    assert isinstance(e.value, Refusal) and isinstance(e.value, RuntimeError)  # printed alone by the stage runner
    assert "CUDA out of memory" in (tmp_path / "s.log").read_text()
