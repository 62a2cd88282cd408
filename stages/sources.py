"""DVC stage `sources@<name>`: python stages/sources.py <name> (reads params.yaml: sources.<name>)."""

import sys

from draftline.params import load_params
from draftline.sources import run_source

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python stages/sources.py <source name from params.yaml: sources>")
    name = sys.argv[1]
    sources = load_params("sources")["sources"]
    if name not in sources:
        sys.exit(f"params.yaml: sources has no entry {name!r}; it has {sorted(sources)}")
    run_source(name, sources[name])
