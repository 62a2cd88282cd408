"""Starting and stopping an SGLang, vLLM or llama.cpp server: ``generate.launch`` (and the serve stage's servers).

The stage starts ``python -m sglang.launch_server``, ``vllm serve`` or the pinned ``llama-server``
(:mod:`draftline.core.llama_cpp`) itself when asked to, waits until ``/health`` answers, and stops the whole process
group at the end, so that no server process outlives the run. The server's output goes to a log file kept beside
the journal.

With ``generate.draft_model`` the server speculates with that DFlash drafter (:class:`Draft`). The block size is
read from the drafter's own ``config.json`` (``block_size``), never repeated as a param, and each engine is told it
in its own convention: SGLang's ``--speculative-num-draft-tokens`` is the whole block (the verified token + B-1
drafts), vLLM's ``num_speculative_tokens`` and llama.cpp's ``--spec-draft-n-max`` the drafts alone (B-1).
llama.cpp serves GGUF files: the target's own (a GGUF target) or its folder converted, and the drafter converted
(:mod:`draftline.core.gguf`); the stage passes their paths.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from draftline.core.errors import Refusal
from draftline.core.logs import get_logger
from draftline.core.params import Params, ParamsError, optional
from draftline.core.threads import idle_cores, own_pool_environment

log = get_logger(__name__)


@dataclass(frozen=True)
class LlamaCppParams(Params):
    """``generate.launch.llama_cpp``: how llama-server runs (engine ``llama.cpp``)."""

    # llama-server processes, each on its own port (port, port + 1, ...) with ``threads`` threads; auto: one per
    # core idle when the stage starts, as generate.local.workers (processes share no barrier, so a busy neighbour
    # slows one, where it stalls a pool of threads: core/threads.py)
    servers: int | Literal["auto"]
    threads: int  # --threads of each server
    slots: int  # --parallel: requests each server decodes together (set generate.concurrency to at least this)
    context: int  # tokens per slot (prompt + reply); --ctx-size is slots x context
    # The type a Hugging Face target is converted to for serving (a GGUF target is served from its own file).
    gguf_type: Literal["f32", "f16", "bf16", "q8_0"]

    def validate(self, where: str) -> None:
        if (self.servers != "auto" and self.servers < 1) or self.threads < 1 or self.slots < 1 or self.context < 16:
            raise ParamsError(f"params.yaml: {where}: servers must be >= 1 or auto, threads and slots >= 1, "
                              "context >= 16")

    def num_servers(self) -> int:
        return max(1, idle_cores() // self.threads) if self.servers == "auto" else self.servers


@dataclass(frozen=True)
class LaunchParams(Params):
    """``generate.launch``: the server (SGLang, vLLM or llama.cpp) the stage starts and stops itself."""

    engine: Literal["sglang", "vllm", "llama.cpp"]
    gpus: str | int | list[int] | None
    dp_size: int
    tp_size: int
    host: str
    port: int
    extra_args: list[str]
    health_timeout_s: float
    llama_cpp: LlamaCppParams | None = optional()

    def validate(self, where: str) -> None:
        if self.engine == "llama.cpp" and self.llama_cpp is None:
            raise ParamsError(f"params.yaml: {where}.engine is llama.cpp but {where}.llama_cpp is missing; add e.g. "
                              "llama_cpp: {servers: auto, threads: 1, slots: 1, context: 4096, gguf_type: f32}")


def draft_block_size(draft_model: str | os.PathLike) -> int:
    """The drafter's block size, from its ``config.json`` (draftline's and z-lab's layouts both keep it there)."""
    config = Path(draft_model) / "config.json"
    if not config.is_file():
        raise Refusal(f"generate.draft_model: {config} does not exist; point it at a drafter checkpoint folder")
    values = json.loads(config.read_text())
    block = values.get("block_size", values.get("dflash_config", {}).get("block_size"))
    if not isinstance(block, int) or block < 2:
        raise Refusal(f"generate.draft_model: {config} has no block_size >= 2; is it a DFlash drafter?")
    return block


@dataclass(frozen=True)
class Draft:
    """A drafter as an engine loads it: ``path`` (the checkpoint folder; for llama.cpp its GGUF) and its block."""

    path: str
    block_size: int

    @classmethod
    def of(cls, checkpoint: str | os.PathLike, path: str | os.PathLike | None = None) -> "Draft":
        """The drafter in ``checkpoint``, loaded from ``path`` (default: the folder itself)."""
        return cls(str(path or checkpoint), draft_block_size(checkpoint))


def server_command(model_path: str, launch: LaunchParams, enable_thinking: bool, draft: Draft | None,
                   python: str = sys.executable, alias: str | None = None) -> list[str]:
    """The command line that starts ``launch.engine`` serving ``model_path`` (speculating with ``draft``), answering
    as model ``alias`` (llama.cpp; SGLang and vLLM answer as the path)."""
    if launch.engine == "llama.cpp":
        cmd = llama_cpp_command(model_path, launch, draft, alias or model_path)
    else:
        make = sglang_command if launch.engine == "sglang" else vllm_command
        cmd = make(model_path, launch, enable_thinking, draft, python)
    return cmd + [str(a) for a in launch.extra_args]


def sglang_command(model_path: str, launch: LaunchParams, enable_thinking: bool, draft: Draft | None,
                   python: str) -> list[str]:
    """``python -m sglang.launch_server`` for ``generate.launch`` (extra_args appended by the caller)."""
    cmd = [python, "-m", "sglang.launch_server", "--model-path", model_path,
           "--host", launch.host, "--port", str(launch.port)]
    if launch.tp_size > 1:
        cmd += ["--tp-size", str(launch.tp_size)]
    if launch.dp_size > 1:
        cmd += ["--dp-size", str(launch.dp_size)]
    if enable_thinking:
        # Without it SGLang returns the reasoning inside `content`; with it, apart as `reasoning_content`.
        cmd += ["--reasoning-parser", "qwen3"]
    # Without it SGLang leaves a Qwen3 tool call in `content` as text; with it the reply carries `tool_calls`,
    # which the tokenize stage renders back through the template (and the local backend parses the same way).
    cmd += ["--tool-call-parser", "qwen25"]
    if draft is not None:
        cmd += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", draft.path,
                "--speculative-num-draft-tokens", str(draft.block_size)]
    return cmd


def vllm_command(model_path: str, launch: LaunchParams, enable_thinking: bool, draft: Draft | None,
                 python: str) -> list[str]:
    """``vllm serve`` for ``generate.launch`` with the same parsers as SGLang's (Qwen3's tool calls are Hermes
    markup, which vLLM's ``hermes`` parser reads)."""
    cmd = [str(Path(python).with_name("vllm")), "serve", model_path, "--host", launch.host, "--port", str(launch.port)]
    if launch.tp_size > 1:
        cmd += ["--tensor-parallel-size", str(launch.tp_size)]
    if launch.dp_size > 1:
        cmd += ["--data-parallel-size", str(launch.dp_size)]
    if enable_thinking:
        cmd += ["--reasoning-parser", "qwen3"]
    cmd += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    if draft is not None:
        spec = {"method": "dflash", "model": draft.path, "num_speculative_tokens": draft.block_size - 1}
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd


def llama_cpp_command(gguf: str, launch: LaunchParams, draft: Draft | None, alias: str) -> list[str]:
    """The pinned ``llama-server`` (built on first use) serving the GGUF ``gguf`` with ``launch.llama_cpp``'s threads
    and slots, a context of ``context`` tokens per slot, its chat template (``--jinja``: tool calls and reasoning
    come back apart, as from SGLang's parsers) and its Prometheus counters (``/metrics``)."""
    from draftline.core.llama_cpp import server

    c = launch.llama_cpp
    cmd = [str(server()), "--model", gguf, "--alias", alias, "--host", launch.host, "--port", str(launch.port),
           "--threads", str(c.threads), "--parallel", str(c.slots), "--ctx-size", str(c.slots * c.context),
           "--jinja", "--metrics", "--no-webui"]
    if draft is not None:
        cmd += ["--model-draft", draft.path, "--spec-type", "draft-dflash", "--spec-draft-n-max", str(draft.block_size - 1)]
    return cmd


def launch_env(launch: LaunchParams) -> dict[str, str]:
    """The server's environment: ``gpus`` (e.g. ``"0,1"`` or ``[0, 3]``) as CUDA_VISIBLE_DEVICES, if set; for
    llama.cpp, which sizes its own thread pool, without draftline's one-core settings (core/threads.py)."""
    env = own_pool_environment() if launch.engine == "llama.cpp" else dict(os.environ)
    gpus = launch.gpus
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus) if isinstance(gpus, list) else str(gpus)
    return env


def launches(launch: LaunchParams) -> list[LaunchParams]:
    """The servers ``launch`` asks for, one per port: llama.cpp's ``servers`` (port, port + 1, ...); else one (SGLang
    and vLLM run their data-parallel ranks behind one port)."""
    n = launch.llama_cpp.num_servers() if launch.engine == "llama.cpp" else 1
    return [replace(launch, port=launch.port + i) for i in range(n)]


class ServerFailed(Refusal, RuntimeError):
    """The server exited before it was ready (a CUDA out-of-memory, a bad argument): its log says why."""


class ServerNotReady(Refusal, TimeoutError):
    """The server did not answer ``/health`` within ``generate.launch.health_timeout_s``."""


class Server:
    """A server process run for the duration of a ``with`` block; ready once ``base_url + /health`` says 200.

    ``health_timeout_s`` is ``generate.launch.health_timeout_s`` (params.yaml holds its value, not this class)."""

    def __init__(self, argv: list[str], base_url: str, log_path: str | os.PathLike, *, health_timeout_s: float,
                 env: dict[str, str] | None = None):
        self.argv = argv
        self.base_url = base_url.rstrip("/")
        self.log_path = Path(log_path)
        self.env = env
        self.health_timeout_s = health_timeout_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Server":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting %s (log: %s)", " ".join(self.argv), self.log_path)
        self._log = open(self.log_path, "ab")
        # A session of its own, so that stopping it stops every worker it forked (tp/dp ranks).
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.env, start_new_session=True)
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.health_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerFailed(f"the server exited with code {self.proc.returncode} before it was ready; "
                                   f"see its log {self.log_path}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                    if r.status == 200:
                        log.info("server ready at %s", self.base_url)
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.5)
        raise ServerNotReady(f"{self.base_url}/health did not answer 200 within {self.health_timeout_s}s; "
                           f"see {self.log_path} or raise generate.launch.health_timeout_s")

    def stop(self, grace_s: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            pgid = os.getpgid(self.proc.pid)
            os.killpg(pgid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(pgid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        self.proc = None
