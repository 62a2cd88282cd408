"""DVC stage `target`: describe the target (or build the embedded one) for every later stage (reads params.yaml:
target). Its paths come from dvc.yaml."""

from draftline.core.runner import main
from draftline.target.params import load
from draftline.target.stage import TargetArgs, run_target

if __name__ == "__main__":
    main("target", TargetArgs, load, run_target)
