"""Benchmark of the generate stage's client and of the local backend.

1. Client: the stage's own request path (dispatch, retries, journal with fsync, progress bar) against a simulated
   server with a fixed capacity: ``--slots`` concurrent slots, each answer taking ``--latency`` seconds. It prints
   the achieved rate over the capacity (target >= 0.95) and the client's CPU per request (target < 1 ms), with
   as many requests in flight as slots and with twice as many (the server queues the excess, as SGLang does).
2. Local backend: the stage on the embedded target (data/target, built by `dvc repro target`) prints completions/s.

    python bench/generate.py            # full
    python bench/generate.py --quick    # a minute or less
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def serve(port: int, slots: int, latency: float, stats_path: str, ready) -> None:
    """A server of fixed capacity: at most ``slots`` answers in progress, each taking ``latency`` seconds."""
    from aiohttp import web

    sem = asyncio.Semaphore(slots)
    busy = {"service_s": 0.0, "n": 0, "first": None, "last": 0.0}
    body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "An answer of a few words.", "reasoning_content": None,
                                 "tool_calls": None}, "logprobs": None, "finish_reason": "stop", "matched_stop": 151645}],
        "usage": {"prompt_tokens": 20, "total_tokens": 27, "completion_tokens": 7, "prompt_tokens_details": None,
                  "reasoning_tokens": 0}, "metadata": None}).encode()

    async def chat(request):
        await request.read()
        async with sem:
            t = time.monotonic()
            busy["first"] = busy["first"] or t
            await asyncio.sleep(latency)
            busy["service_s"] += time.monotonic() - t
            busy["n"] += 1
            busy["last"] = time.monotonic()
        return web.Response(body=body, content_type="application/json")

    async def stats(request):
        return web.json_response(busy)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/stats", stats)
    ready.set()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def bench_client(n: int, slots: int, latency: float, concurrency: int) -> None:
    import socket
    import urllib.request

    from draftline.core.params import load_section
    from draftline.core.records import PromptRecord
    from draftline.generate.journal import Journal
    from draftline.generate.params import GenerateParams
    from draftline.generate.progress import Progress
    from draftline.generate.remote import generate_remote
    from draftline.generate.work import Plan, Work

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = mp.Event()
    proc = mp.Process(target=serve, args=(port, slots, latency, "", ready), daemon=True)
    proc.start()
    ready.wait(10)
    time.sleep(0.5)
    url = f"http://127.0.0.1:{port}"
    prompts = [PromptRecord(id=f"{i:032x}", source="bench", row=i,
                            messages=[{"role": "system", "content": "You are helpful."},
                                      {"role": "user", "content": f"Question {i}: " + "word " * 200}])
               for i in range(n)]
    defaults = load_section("generate", REPO / "params.yaml")
    s = GenerateParams.parse({**defaults, "backend": "sglang", "endpoints": [url], "concurrency": concurrency,
                              "retries": 2}, "generate")
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal(tmp)
        progress = Progress(n)
        cpu0, t0 = time.process_time(), time.monotonic()
        asyncio.run(generate_remote(Work(Plan(prompts, prompts), journal, {}, progress), s, [url], "m"))
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
        progress.close()
        journal.close()
    st = json.loads(urllib.request.urlopen(url + "/stats").read())
    proc.terminate()
    capacity = slots / latency
    achieved = n / wall
    busy = st["service_s"] / (slots * (st["last"] - st["first"]))
    print(f"client: {n} requests, {concurrency} in flight; server {slots} slots x {latency * 1000:.0f} ms: "
          f"capacity {capacity:.0f} req/s, achieved {achieved:.0f} req/s")
    print(f"  achieved/capacity = {achieved / capacity:.3f} (target >= 0.95); slots busy {busy:.3f}")
    print(f"  client CPU per request = {cpu / n * 1000:.3f} ms (target < 1 ms)")


def bench_local(n: int, target_dir: Path, max_tokens: int = 64) -> None:
    from draftline.core.params import load_section
    from draftline.core.target_loader import load_target
    from draftline.generate.local import LocalBackend
    from draftline.generate.params import GenerateParams

    if not (target_dir / "target.json").exists():
        print(f"local: {target_dir}/target.json not found; build the embedded target first: dvc repro target")
        return
    defaults = load_section("generate", REPO / "params.yaml")  # params.yaml's local settings, device auto
    s = GenerateParams.parse({**defaults, "max_tokens": max_tokens, "temperature": 0.0,
                              "local": {**defaults["local"], "device": "auto"}}, "generate")
    t0 = time.monotonic()
    backend = LocalBackend(load_target(target_dir / "target.json"), s.sampling, False, s.local, None)
    load_s = time.monotonic() - t0
    reqs = [([{"role": "user", "content": f"What is {i % 9 + 1} plus {i % 7 + 2}?"}], None) for i in range(n)]
    t0 = time.monotonic()
    out_tokens = 0
    for i in range(0, n, backend.batch_size):
        out_tokens += sum(r.usage["completion_tokens"] for r in backend.generate(reqs[i : i + backend.batch_size]))
    wall = time.monotonic() - t0
    print(f"local: {n} prompts on {target_dir} ({backend.device}, batch {backend.batch_size}, max_tokens {max_tokens}): "
          f"{n / wall:.2f} completions/s, {out_tokens / wall:.0f} output tokens/s (model load {load_s:.1f} s apart)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests and prompts")
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--latency", type=float, default=0.25, help="seconds per answer in the simulated server")
    ap.add_argument("--target", type=Path, default=REPO / "data/target")
    args = ap.parse_args()
    # As many requests in flight as slots, then twice as many: a server keeps a queue to start the next request
    # the moment a slot frees (SGLang deployments keep 100-2000 queued), which hides each request's turnaround.
    for factor in (1, 2):
        bench_client(2000 if args.quick else 5000, args.slots, args.latency, factor * args.slots)
    bench_local(16 if args.quick else 64, args.target)
