"""The ``draftline`` command: what a user runs besides ``dvc repro`` (the stages run as ``python stages/...``).

``draftline compare A B``: two evaluations of the same prompts, request by request
(:mod:`draftline.evaluate.compare`). A refusal prints its one line and exits 2; anything else keeps its traceback.
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
    args = parser.parse_args(argv)

    from draftline.evaluate.compare import as_json, compare, load, table

    try:
        a, b = load(args.a, args.repo, args.split), load(args.b, args.repo, args.split)
        result = compare(a, b)
    except Refusal as e:
        print(f"draftline compare: {e}", file=sys.stderr)
        return 2
    print(json.dumps(as_json(result), indent=1) if args.json else table(a, b, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
