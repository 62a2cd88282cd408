"""What a block costs the target in llama.cpp, and so the most any drafter can speed a target up there.

A speculative step has the target verify a block of B tokens in one batch; a drafter that is always right and free
yields B tokens a step, so B x (the cost of one decoded token) / (the cost of verifying B tokens) is the ceiling of
the speed-up at block B, and (the cost of B) / (the cost of one) is the acceptance (tokens per step) a free drafter
needs merely to break even. For each GGUF file, one pinned llama-server (``--threads``, one slot) processes, after
a cached context of ``--context`` tokens, batches of B new tokens (its ``prompt_ms`` for them), and decodes 64
tokens one at a time (its ``predicted_per_token_ms``); each figure is the median of ``--repeats``.

    python bench/verify_cost.py models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smol-q8_0.gguf --out verify.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import urllib.request
from pathlib import Path

from draftline.core.launch import Server
from draftline.core.llama_cpp import server
from draftline.core.threads import own_pool_environment

BLOCKS = (1, 2, 4, 8, 16)


def post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def costs(gguf: Path, threads: int, context: int, repeats: int, port: int) -> dict:
    argv = [str(server()), "--model", str(gguf), "--port", str(port), "--threads", str(threads), "--parallel", "1",
            "--ctx-size", "4096", "--no-webui"]
    base = [100 + (i * 37) % 5000 for i in range(context)]
    with Server(argv, f"http://127.0.0.1:{port}", gguf.with_suffix(".verify.log"), health_timeout_s=120,
                env=own_pool_environment()):
        post(port, {"prompt": base, "n_predict": 1, "cache_prompt": True})  # the context, cached
        block_ms = {}
        for b in BLOCKS:
            runs = []
            for r in range(repeats):
                new = [200 + (r * 13 + i * 7) % 4000 for i in range(b)]
                t = post(port, {"prompt": base + new, "n_predict": 1, "cache_prompt": True, "temperature": 0})
                assert t["timings"]["prompt_n"] == b, t["timings"]  # only the new tokens were processed
                runs.append(t["timings"]["prompt_ms"])
            block_ms[b] = statistics.median(runs)
        decode = statistics.median(
            post(port, {"prompt": base, "n_predict": 64, "cache_prompt": True, "temperature": 0, "ignore_eos": True})
            ["timings"]["predicted_per_token_ms"] for _ in range(repeats))
    return {"file": gguf.name, "bytes": gguf.stat().st_size, "decode_ms": round(decode, 2),
            "block_ms": {b: round(ms, 2) for b, ms in block_ms.items()},
            "ceiling": {b: round(b * decode / ms, 2) for b, ms in block_ms.items()},
            "break_even_acceptance": {b: round(ms / decode, 2) for b, ms in block_ms.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ggufs", nargs="+", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--port", type=int, default=30777)
    ap.add_argument("--out", type=Path, default=Path("verify.json"))
    args = ap.parse_args()
    rows = [costs(g, args.threads, args.context, args.repeats, args.port) for g in args.ggufs]
    args.out.write_text(json.dumps({"threads": args.threads, "context": args.context, "repeats": args.repeats,
                                    "files": rows}, indent=1) + "\n")
    print("| file | decode ms/token | " + " | ".join(f"verify {b} ms (ceiling)" for b in BLOCKS[1:]) + " |")
    print("|---|---|" + "---|" * (len(BLOCKS) - 1))
    for r in rows:
        cells = [f"{r['block_ms'][b]} ({r['ceiling'][b]}x)" for b in BLOCKS[1:]]
        print(f"| {r['file']} | {r['decode_ms']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
