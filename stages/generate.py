"""DVC stage `generate`: prompts + the target -> the target's completions (reads params.yaml: generate). Its paths
come from dvc.yaml."""

from draftline.core.runner import main
from draftline.generate.params import load
from draftline.generate.stage import GenerateArgs, run_generate

if __name__ == "__main__":
    main("generate", GenerateArgs, load, run_generate)
