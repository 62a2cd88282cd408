"""DVC stage `sources@<name>`: python stages/sources.py <name> (reads params.yaml: sources.<name>)."""

import sys

from draftline.core.source_spec import load_source
from draftline.sources.stage import run_source

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python stages/sources.py <source name from params.yaml: sources>")
    run_source(sys.argv[1], load_source(sys.argv[1]))
