"""Rows per hour: the generate stage through llama-server against the target in-process, side by side.

The stage itself (``run_generate``, its journal, client and guards) generates the same first ``--n`` prompts of a
prompts file for the target of ``--target-json``, once per setting, each into a journal of its own: the ``local``
backend with params.yaml's settings (``workers: auto``, batch 32), and ``generate.launch`` with engine ``llama.cpp``
at each ``servers x threads x slots`` of ``--grid`` (concurrency = slots per server; a GGUF target is served from
its own file). Every
setting runs quiet, then beside one busy process (a spinning Python loop), and the table gives rows per hour,
output tokens per second and the wall time of each, server start and model load included.

    python bench/engines.py --target-json data/target/target.json --prompts data/prompts/train.jsonl --n 48
    python bench/engines.py ... --grid 1x1x1 2x1x1 autox1x1 --load quiet
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from draftline.core.files import write_jsonl
from draftline.core.logs import get_logger
from draftline.core.params import load_section
from draftline.core.records import read_prompts
from draftline.core.runner import execute
from draftline.core.skips import Skips
from draftline.generate.params import GenerateParams
from draftline.generate.stage import GenerateArgs, run_generate

REPO = Path(__file__).resolve().parents[1]
log = get_logger("bench.engines")


def setting(name: str, max_tokens: int) -> GenerateParams:
    """params.yaml's generate section, for ``local`` or ``llama.cpp:<servers>x<threads>x<slots>``."""
    values = {**load_section("generate", REPO / "params.yaml"), "max_tokens": max_tokens, "max_truncated_share": 1.0}
    if name != "local":
        servers, threads, slots = name.split(":")[1].split("x")
        values.update(backend="sglang", concurrency=int(slots), launch={
            "engine": "llama.cpp", "gpus": None, "dp_size": 1, "tp_size": 1, "host": "127.0.0.1", "port": 30991,
            "extra_args": [], "health_timeout_s": 600,
            "llama_cpp": {"servers": servers if servers == "auto" else int(servers), "threads": int(threads),
                          "slots": int(slots), "context": 4096, "gguf_type": "f32"}})
    return GenerateParams.parse(values, "generate")


@contextmanager
def busy(on: bool):
    """One spinning process beside the run (another user's job on a shared machine), or nothing."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if on else None
    try:
        yield
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def measure(name: str, load: bool, prompts_file: Path, target_json: Path, max_tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["DRAFTLINE_CACHE"] = str(tmp / "cache")  # a journal of its own: every prompt is generated
        args = GenerateArgs(prompts=prompts_file, target=target_json, out=tmp / "out", metrics=tmp / "m.json",
                            report=tmp / "r.json", drafters=tmp / "drafters")
        with busy(load):
            started = time.perf_counter()
            stage = execute("generate", run_generate, setting(name, max_tokens), args)
            wall = time.perf_counter() - started
    rows, tokens = stage.headline["rows"] + stage.headline["truncated"], stage.headline["tokens"]
    return {"setting": name, "busy": load, "rows": rows, "tokens": tokens, "wall_s": round(wall, 1),
            "rows_per_hour": round(rows / wall * 3600), "tokens_per_s": round(tokens / wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target-json", type=Path, default=Path("data/target/target.json"))
    ap.add_argument("--prompts", type=Path, default=Path("data/prompts/train.jsonl"))
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--grid", nargs="+", default=["1x1x1", "1x1x4", "1x2x2", "2x1x1", "autox1x1"],
                    help="servers x threads x slots (servers: a count or auto)")
    ap.add_argument("--no-local", action="store_true")
    ap.add_argument("--load", choices=["quiet", "busy", "both"], default="both",
                    help="quiet, beside one busy process, or both")
    ap.add_argument("--out", type=Path, default=Path("engines.json"))
    args = ap.parse_args()
    prompts = read_prompts(args.prompts, Skips(log))[: args.n]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        first = Path(tmp) / "prompts.jsonl"
        write_jsonl(first, prompts)
        names = ([] if args.no_local else ["local"]) + [f"llama.cpp:{g}" for g in args.grid]
        for load in {"quiet": [False], "busy": [True], "both": [False, True]}[args.load]:
            for name in names:
                results.append(measure(name, load, first, args.target_json, args.max_tokens))
                print(json.dumps(results[-1]), flush=True)
    args.out.write_text(json.dumps({"n": len(prompts), "max_tokens": args.max_tokens, "results": results}, indent=1))
    print("| setting | beside a busy process | rows | output tokens | wall s | rows/hour | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['setting']} | {'yes' if r['busy'] else 'no'} | {r['rows']} | {r['tokens']} | {r['wall_s']} | "
              f"{r['rows_per_hour']} | {r['tokens_per_s']} |")


if __name__ == "__main__":
    main()
