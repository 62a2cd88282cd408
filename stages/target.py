"""DVC stage `target`: python stages/target.py (reads params.yaml: target, and sources for the embedded corpus)."""

from draftline.params import load_params
from draftline.target import run_target

if __name__ == "__main__":
    params = load_params("target", "sources")
    run_target(params["target"], params["sources"])
