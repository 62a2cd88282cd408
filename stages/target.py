"""DVC stage `target`: python stages/target.py (reads params.yaml: target)."""

from draftline.target.stage import TargetParams, run_target

if __name__ == "__main__":
    run_target(TargetParams.load("target"))
