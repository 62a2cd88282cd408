"""Run a trainer with one torch thread and record when each of its optimizer steps ends (bench/peers.py).

    python bench/step_timer.py TIMES.json -m package.module [args...]   # as python -m package.module args
    python bench/step_timer.py TIMES.json path/to/script.py [args...]   # as python path/to/script.py args

Standalone (torch only), so any trainer's own environment runs it: the peers' venvs as well as draftline's. It sets
``torch.set_num_threads(1)`` before the trainer is imported and registers a global optimizer step post-hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``: every ``torch.optim`` optimizer, whoever builds it), so
the trainer's code and arithmetic are untouched. On exit (also on an error) it writes ``{"steps": n, "first": t0,
"last": t1, "deltas_median": s}``, times in ``time.perf_counter`` seconds: ``(last - first) / (steps - 1)`` is the
time per step of the training loop, its set-up and saving after the last step left out.
"""

from __future__ import annotations

import json
import os
import runpy
import statistics
import sys
import time


def main() -> None:
    out, target, *rest = sys.argv[1:]
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    torch.set_num_threads(1)
    times: list[float] = []
    register_optimizer_step_post_hook(lambda *_: times.append(time.perf_counter()))
    try:
        # sys.path[0] as `python -m` / `python script.py` set it (the current folder / the script's), not bench/
        if target == "-m":
            module, *args = rest
            sys.argv, sys.path[0] = [module, *args], os.getcwd()
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv, sys.path[0] = [target, *rest], os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
    finally:
        deltas = [b - a for a, b in zip(times, times[1:])]
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"steps": len(times), "first": times[0] if times else None, "last": times[-1] if times else None,
                       "deltas_median": statistics.median(deltas) if deltas else None}, f)


if __name__ == "__main__":
    main()
