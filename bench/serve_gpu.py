"""The prepared GPU check: draftline's drafter served by SGLang and by vLLM, their acceptance beside draftline's own.

Run on a CUDA machine where ``sglang`` and/or ``vllm`` are installed (they are not draftline requirements) after a
``dvc repro`` (or with ``--target`` / ``--drafter`` / ``--prompts`` pointing at a real target, its drafter and a
prompts file). For each engine it starts the server twice with ``generate.launch``'s own command lines
(:func:`draftline.generate.launcher.server_command`: the same DFLASH flags and block-size convention the generate
stage uses), first without the drafter, then with it, and sends the same prompts, greedy, at ``--concurrency``:

- tokens/s (completion tokens over the wall clock of the batch) without and with the drafter;
- the server's own acceptance length, tokens per verification step as z-lab's figure counts them: SGLang's
  per-request ``meta_info`` (``completion_tokens / spec_verify_ct``, asked with ``return_meta_info``), vLLM's
  Prometheus counters (``1 + spec_decode_num_accepted_tokens / spec_decode_num_drafts`` over the batch);
- draftline's acceptance on the same prompts: the evaluate stage's loop (:func:`speculative_generate`, greedy)
  in-process on the GPU, and whether its greedy output equals the target's alone.

Pooled tokens per step are compared (every engine reports only those), so the three figures mean the same thing. It
prints one table and writes it as JSON beside (``--out``). Nothing here runs in CI: CI has no GPU; the command lines
themselves are tested in tests/generate/test_launcher.py.

    python bench/serve_gpu.py                                  # the embedded target and drafter of a dvc repro
    python bench/serve_gpu.py --engines sglang --target /models/Qwen3-8B --drafter data/bases/qwen3-8b-dflash \\
        --prompts data/prompts/eval.jsonl --n 128 --max-tokens 512
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch

from draftline.core.chat import template_kwargs
from draftline.core.logs import get_logger
from draftline.core.records import read_prompts
from draftline.core.skips import Skips
from draftline.core.target import load_model, load_target, load_tokenizer
from draftline.drafter.decoding import DFlashProposer, speculative_generate, target_generate
from draftline.drafter.model import DFlashDrafter
from draftline.evaluate.decoder import render_prompt, stop_token_ids
from draftline.generate.launcher import Server, server_command
from draftline.generate.openai_client import ChatClient, Transport
from draftline.generate.params import LaunchParams


def vllm_counters(base_url: str) -> dict[str, float]:
    """vLLM's speculative counters from ``/metrics`` (summed over its label sets)."""
    text = urllib.request.urlopen(base_url + "/metrics", timeout=10).read().decode()
    out = {"accepted": 0.0, "drafts": 0.0}
    for line in text.splitlines():
        m = re.match(r"vllm:spec_decode_num_(accepted_tokens|drafts)_total(?:\{[^}]*\})? ([0-9.e+]+)$", line)
        if m:
            out["accepted" if m.group(1) == "accepted_tokens" else "drafts"] += float(m.group(2))
    return out


async def send(base_url: str, model: str, prompts: list, args: argparse.Namespace, thinking: bool | None) -> tuple:
    """Every prompt greedy at ``args.concurrency``: the results and the wall seconds."""
    transport = Transport(args.concurrency, 1800.0, 2, 1.0, 30.0, 0, None)
    body = {"model": model, "max_tokens": args.max_tokens, "temperature": 0.0,
            "chat_template_kwargs": template_kwargs(thinking), "return_meta_info": True}
    async with ChatClient([base_url], transport) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*[
            client.chat({**body, "messages": p.messages, **({"tools": p.tools} if p.tools else {})}, p.id)
            for p in prompts])
        return results, time.perf_counter() - t0


def serve(engine: str, drafter: Path | None, args: argparse.Namespace, prompts: list, thinking: bool | None) -> dict:
    """One server run: tokens/s and, with a drafter, the server's acceptance length."""
    launch = LaunchParams(engine, None, 1, 1, "127.0.0.1", args.port, [], args.health_timeout_s)
    url = f"http://127.0.0.1:{args.port}"
    argv = server_command(str(args.target), launch, bool(thinking), str(drafter) if drafter else None)
    log = args.out.with_name(f"{engine}{'-drafter' if drafter else ''}.log")
    with Server(argv, url, log, health_timeout_s=args.health_timeout_s):
        before = vllm_counters(url) if engine == "vllm" and drafter else None
        results, wall = asyncio.run(send(url, str(args.target), prompts, args, thinking))
        after = vllm_counters(url) if before is not None else None
    tokens = sum(int(r.usage.get("completion_tokens", 0)) for r in results)
    row: dict[str, Any] = {"tokens": tokens, "tokens_per_s": round(tokens / wall, 1), "acceptance": None}
    if engine == "sglang" and drafter:
        spec = [r.speculative for r in results if r.speculative]
        row["acceptance"] = round(sum(s["tokens"] + 1 for s in spec) / max(1, sum(s["steps"] for s in spec)), 3)
    elif after is not None and after["drafts"] > before["drafts"]:
        row["acceptance"] = round(1 + (after["accepted"] - before["accepted"]) / (after["drafts"] - before["drafts"]), 3)
    return row


def ours(args: argparse.Namespace, prompts: list, thinking: bool | None) -> dict:
    """draftline's own loop, greedy, in-process: pooled tokens per step and lossless share."""
    info = load_target(args.target_json)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    target = load_model(info, dtype=dtype, device=torch.device(args.device))
    tokenizer = load_tokenizer(info)
    drafter = DFlashDrafter.from_pretrained(args.drafter, target).to(target.dtype)
    proposer, stops = DFlashProposer(drafter), stop_token_ids(info)
    steps = tokens = same = 0
    for p in prompts:
        ids = render_prompt(tokenizer, p.messages, p.tools, thinking)
        spec = speculative_generate(target, proposer, ids, args.max_tokens, stops)
        steps, tokens = steps + spec.steps, tokens + sum(spec.produced)
        same += target_generate(target, ids, args.max_tokens, stops).tokens == spec.tokens
    return {"acceptance": round(tokens / max(1, steps), 3), "lossless": round(same / len(prompts), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target-json", type=Path, default=Path("data/target/target.json"))
    ap.add_argument("--target", type=Path, help="the served checkpoint folder (default: target.json's path)")
    ap.add_argument("--drafter", type=Path, default=Path("data/checkpoints"))
    ap.add_argument("--prompts", type=Path, default=Path("data/prompts/eval.jsonl"))
    ap.add_argument("--engines", nargs="*", default=["sglang", "vllm"], choices=["sglang", "vllm"])
    ap.add_argument("--device", default="cuda", help="draftline's own loop (cpu: with --engines and no engine, "
                    "a dry run of that part on a CPU box)")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--port", type=int, default=30123)
    ap.add_argument("--health-timeout-s", type=float, default=900.0)
    ap.add_argument("--out", type=Path, default=Path("serve_gpu.json"))
    args = ap.parse_args()
    if args.engines and not torch.cuda.is_available():
        sys.exit("bench/serve_gpu.py needs a CUDA machine (SGLang and vLLM serve on GPUs)")
    args.target = args.target or Path(load_target(args.target_json).path)
    prompts = read_prompts(args.prompts, Skips(get_logger("serve_gpu")))[: args.n]
    thinking = json.loads((args.drafter / "config.json").read_text()).get("draftline", {}).get("enable_thinking")
    table: dict[str, Any] = {"draftline": ours(args, prompts, thinking)}
    for engine in args.engines:
        try:
            table[engine] = {"plain": serve(engine, None, args, prompts, thinking),
                             "drafter": serve(engine, args.drafter, args, prompts, thinking)}
        except Exception as e:  # one engine missing or failing must not hide the other's figures
            table[engine] = {"error": f"{type(e).__name__}: {e}"}
    args.out.write_text(json.dumps(table, indent=2))
    print(f"{len(prompts)} prompts, greedy, max_tokens {args.max_tokens}; draftline's loop: acceptance "
          f"{table['draftline']['acceptance']} (lossless {table['draftline']['lossless']})")
    for engine in args.engines:
        t = table[engine]
        if "error" in t:
            print(f"{engine}: {t['error']}")
            continue
        print(f"{engine}: acceptance {t['drafter']['acceptance']}; tokens/s {t['plain']['tokens_per_s']} without, "
              f"{t['drafter']['tokens_per_s']} with the drafter ({t['drafter']['tokens_per_s'] / t['plain']['tokens_per_s']:.2f}x)")


if __name__ == "__main__":
    main()
