"""Shared test fixtures. Nothing here reaches a hub: tests use files they make, the embedded target or ../shared."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def default_params(section: str, **overrides: Any) -> Any:
    """A section of the repository's params.yaml (the only place defaults live), with top-level keys replaced and
    nested ones merged: ``default_params("generate", max_tokens=8, local={"batch_size": 2})``."""
    values = copy.deepcopy(yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))[section])
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    return values


def parsed(cls: Any, section: str, **overrides: Any) -> Any:
    """``cls.parse`` of :func:`default_params`: the params object a stage script would build."""
    return cls.parse(default_params(section, **overrides), section)


@pytest.fixture(scope="session", autouse=True)
def own_draftline_cache(tmp_path_factory: pytest.TempPathFactory):
    """What stages cache for later runs (a base's per-row mix labels, core/mix.py) goes to this session's own
    folder, never to the checkout's .draftline/cache; a test that needs its own sets $DRAFTLINE_CACHE itself."""
    before = os.environ.get("DRAFTLINE_CACHE")
    os.environ["DRAFTLINE_CACHE"] = str(tmp_path_factory.mktemp("draftline-cache"))
    yield
    if before is None:
        os.environ.pop("DRAFTLINE_CACHE", None)
    else:
        os.environ["DRAFTLINE_CACHE"] = before


@pytest.fixture(scope="session")
def llama_server() -> Path:
    """The real pinned llama-server: built once per version and CPU (minutes, the first time on a machine), then
    found in its cache outside the checkout (core/llama_cpp.py), so a second run or a second clone builds nothing."""
    from draftline.core.llama_cpp import server

    return server()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` beside the checkout; tests that need it skip cleanly where it is absent."""
    if not (SHARED / "fixtures").is_dir():
        pytest.skip("../shared/fixtures is not present beside this checkout")
    return SHARED


@pytest.fixture(scope="session")
def datasets_dir(shared_dir: Path) -> Path:
    return shared_dir / "fixtures" / "datasets"


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir(shared_dir: Path) -> Path:
    """The real Qwen3 tokenizer and hybrid-thinking chat template."""
    return shared_dir / "fixtures" / "qwen3-tokenizer"


@pytest.fixture(scope="session")
def qwen3_alt_tokenizer_dir(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Build a tokenizer folder for one of the alt/ templates: ``qwen3_alt_tokenizer_dir("qwen3_coder")``."""
    base = shared_dir / "fixtures" / "qwen3-tokenizer"

    def make(name: str) -> Path:
        d = tmp_path_factory.mktemp(name)
        for f in ("vocab.json", "merges.txt"):
            os.symlink(base / f, d / f)
        (d / "tokenizer_config.json").write_bytes((base / "alt" / f"{name}.tokenizer_config.json").read_bytes())
        return d

    return make


# A ChatML template without tools or thinking, as SmolLM2-135M-Instruct's (written here, not downloaded): it ignores
# `tools` and `enable_thinking` and writes only each message's role and content.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="session")
def chatml_tokenizer_dir(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Qwen3 tokenizer files with :data:`CHATML_TEMPLATE` as their chat template: a target template without
    tools or thinking (its end of turn is still ``<|im_end|>``)."""
    import json

    base = shared_dir / "fixtures" / "qwen3-tokenizer"
    d = tmp_path_factory.mktemp("chatml-tokenizer")
    for f in ("vocab.json", "merges.txt"):
        os.symlink(base / f, d / f)
    config = json.loads((base / "tokenizer_config.json").read_text(encoding="utf-8"))
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHATML_TEMPLATE}), encoding="utf-8")
    return d


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def tiny_conversations(n: int = 60) -> list:
    """Small patterned chats with every shape the chat template renders: system turns, multi-turn, reasoning,
    tools, tool calls and tool results, Chinese. Enough for the tiny embedded target of the tests."""
    from draftline.core.records import Conversation

    cities = ["Paris", "Oslo", "Lima", "Cairo", "Delhi"]
    out = []
    for i in range(n):
        a, b, city = i % 9 + 1, i % 7 + 2, cities[i % len(cities)]
        kind = i % 4
        if kind == 0:
            msgs = [{"role": "user", "content": f"What is {a} plus {b}?"},
                    {"role": "assistant", "content": f"{a} plus {b} is {a + b}.",
                     "reasoning_content": f"Add {a} and {b}: {a + b}."}]
        elif kind == 1:
            msgs = [{"role": "system", "content": "You are a concise assistant."},
                    {"role": "user", "content": f"Name a fact about {city}."},
                    {"role": "assistant", "content": f"{city} is a city with {a} museums."},
                    {"role": "user", "content": "用中文说一遍。"},
                    {"role": "assistant", "content": f"{city}有{a}座博物馆。"}]
        elif kind == 2:
            msgs = [{"role": "user", "content": f"Weather in {city}?"},
                    {"role": "assistant", "content": "",
                     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}]},
                    {"role": "tool", "content": f'{{"city": "{city}", "temp_c": {a + 10}}}'},
                    {"role": "assistant", "content": f"It is {a + 10} degrees in {city}."}]
        else:
            msgs = [{"role": "user", "content": f"Write a Python function that returns {a} times x."},
                    {"role": "assistant", "content": f"```python\ndef times_{a}(x):\n    return {a} * x\n```"}]
        out.append(Conversation(source=f"tiny{kind}", row=i, messages=msgs, tools=[WEATHER_TOOL] if kind == 2 else None))
    return out


# Tiny settings: the build takes seconds; 4 layers because the drafter taps several target layers.
TINY_TARGET_PARAMS = {
    "path": "embedded",
    "mask_token_id": None,
    "hash_weights": True,
    "seed": 0,
    "embedded": {
        "vocab_size": 600, "num_layers": 4, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4,
        "num_kv_heads": 2, "max_position_embeddings": 1024, "max_len": 256, "batch_tokens": 512, "parts": 2,
        "source_weights": {"tiny2": 2}, "steps": 100,
        "lr": 3e-3, "warmup_steps": 10, "min_lr_ratio": 0.1, "weight_decay": 0.1, "adam_betas": [0.9, 0.95],
        "grad_clip": 1.0, "threads": 1, "workers": 1, "held_out": 1, "greedy_tokens": 8,
    },
}


@pytest.fixture(scope="session")
def embedded_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny embedded target built once per session: the folder holding target.json
    (``load_target(it / "target.json")``)."""
    from draftline.target.params import TargetParams
    from draftline.target.stage import write_target

    folder = tmp_path_factory.mktemp("embedded") / "target"
    write_target(TargetParams.parse(TINY_TARGET_PARAMS, "target"), folder, tiny_conversations())
    return folder


class SmallDisk:
    """A tmpfs of a few pages mounted by the test: writes beyond ``size`` fail with ENOSPC, as on a full disk."""

    def __init__(self, path: Path, size: int):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        run = __import__("subprocess").run
        done = run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs to fill (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
        self._run = run

    def grow(self, size: int) -> None:
        """Free space: the same filesystem, with its files, now ``size`` bytes large."""
        self._run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)

    def leftovers(self) -> list[str]:
        """Temporary names that an interrupted write could leave: there must be none."""
        return [str(p) for p in self.path.rglob("*") if ".tmp-" in p.name or ".old-" in p.name or p.suffix == ".partial"]

    def unmount(self) -> None:
        self._run(["umount", "-l", str(self.path)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path):
    """``small_disk(size)`` mounts a ``size``-byte tmpfs under ``tmp_path``; skipped with the reason where mounting
    is not allowed. Unmounted at the end of the test."""
    disks: list[SmallDisk] = []

    def make(size: int) -> SmallDisk:
        disks.append(SmallDisk(tmp_path / f"small-{len(disks)}", size))
        return disks[-1]

    yield make
    for d in disks:
        d.unmount()
