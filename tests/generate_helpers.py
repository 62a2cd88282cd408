"""Shared set-up for the generate tests: a small project folder with prompts and a target description."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import yaml
from conftest import default_params

from draftline.core.files import write_json, write_jsonl
from draftline.core.records import PromptRecord, TargetInfo
from draftline.core.runner import StageRun, execute
from draftline.generate.params import GenerateParams
from draftline.generate.stage import GenerateArgs, run_generate

REPO = Path(__file__).resolve().parents[1]

SYSTEMS = ["You are a careful math tutor.", "You are a coding assistant.", None]


def make_prompts(n: int, multi_turn: int = 0) -> list[PromptRecord]:
    """``n`` prompts over three sources and three system prompts (interleaved, so dispatch order differs from
    prompt order); the first ``multi_turn`` of them have three user turns with the dataset's answers between."""
    out = []
    for i in range(n):
        msgs: list[dict[str, Any]] = []
        if SYSTEMS[i % 3]:
            msgs.append({"role": "system", "content": SYSTEMS[i % 3]})
        msgs.append({"role": "user", "content": f"Question number {i}: what is {i} + {i}?"})
        if i < multi_turn:
            msgs += [{"role": "assistant", "content": "dataset answer"}, {"role": "user", "content": f"And {i} * 2?"},
                     {"role": "assistant", "content": "dataset answer 2"}, {"role": "user", "content": "Thanks!"}]
        pid = hashlib.sha256(f"prompt-{i}".encode()).hexdigest()[:32]
        out.append(PromptRecord(id=pid, source=("alpha", "beta", "gamma")[i % 3], row=i, messages=msgs,
                                tools=None, reference=f"{2 * i}"))
    return out


def target_info(path: str = "/models/fake-qwen3") -> TargetInfo:
    return TargetInfo(path=path, tokenizer_fingerprint="tok-fp", chat_template_sha256="tpl", eos_token="<|im_end|>",
                      eos_token_id=151645, pad_token_id=151643, end_of_turn_token="<|im_end|>",
                      end_of_turn_token_id=151645, think_start_token="<think>", think_end_token="</think>",
                      mask_token_id=151660, vocab_size=151669, model_fingerprint="model-fp")


def sglang_params(url: str | list[str], **kw: Any) -> dict[str, Any]:
    """generate params for the sglang backend against ``url`` (or several), greedy, with quick retries."""
    return {"backend": "sglang", "endpoints": [url] if isinstance(url, str) else url, "concurrency": 4,
            "shard_size": 4, "max_tokens": 32, "retries": 3, "backoff_s": 0.01, "backoff_max_s": 0.05,
            "temperature": 0.0, "top_p": 1.0, "top_k": -1, **kw}


def full(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` over params.yaml's generate section (nested ``local`` merged): what a user's file would hold."""
    return default_params("generate", **params)


def gen_params(params: dict[str, Any]) -> GenerateParams:
    return GenerateParams.parse(full(params), "generate")


def make_project(root: Path, prompts: list[PromptRecord], params: dict[str, Any], info: TargetInfo | None = None) -> Path:
    """A folder laid out as the repository is (data/prompts, data/target, params.yaml)."""
    write_jsonl(root / "data/prompts/train.jsonl", prompts)
    write_json(root / "data/target/target.json", (info or target_info()).to_dict())
    (root / "params.yaml").write_text(yaml.safe_dump({"generate": full(params)}), encoding="utf-8")
    return root


def stage_args(root: Path, out: Path | None = None) -> GenerateArgs:
    """The paths dvc.yaml passes, under ``root`` laid out as :func:`make_project` makes it."""
    return GenerateArgs(prompts=root / "data/prompts/train.jsonl", target=root / "data/target/target.json",
                        out=out or root / "data/completions", metrics=root / "metrics/generate.json",
                        report=root / "reports/generate.json", drafters=root / "data/drafters")


def stage_argv(root: Path) -> list[str]:
    """``stages/generate.py``'s command line for :func:`stage_args` (as dvc.yaml runs it)."""
    args = stage_args(root)
    return [str(REPO / "stages/generate.py"),
            *(x for f in dataclasses.fields(args) for x in (f"--{f.name}", str(getattr(args, f.name))))]


def run_in(root: Path, params: dict[str, Any], out: Path | None = None) -> StageRun:
    """The stage in this process over ``root``'s files, as the stage runner runs it."""
    return execute("generate", run_generate, gen_params(params), stage_args(root, out))


def shard_bytes(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "data/completions").iterdir())}


def read_rows(root: Path) -> list[dict[str, Any]]:
    import json

    rows = []
    for p in sorted((root / "data/completions").glob("part-*.jsonl")):
        rows += [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines()]
    return rows
