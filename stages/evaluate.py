"""DVC stage `evaluate`: the drafter judged by speculative decoding of the eval prompts (reads params.yaml:
evaluate). Its paths come from dvc.yaml."""

from draftline.core.runner import main
from draftline.evaluate.params import load
from draftline.evaluate.stage import EvalArgs, run_evaluate

if __name__ == "__main__":
    main("evaluate", EvalArgs, load, run_evaluate)
