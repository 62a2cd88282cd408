"""DVC stage `generate`: data/prompts/train.jsonl + data/target -> data/completions (reads params.yaml: generate)."""

from draftline.generate.params import GenerateParams
from draftline.generate.stage import run_generate

if __name__ == "__main__":
    run_generate(GenerateParams.load("generate"))
