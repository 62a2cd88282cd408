"""DVC stage `generate`: data/prompts/train.jsonl + data/target -> data/completions, metrics/generate.json."""

from draftline.generate import run_generate
from draftline.params import load_params

if __name__ == "__main__":
    run_generate(load_params("generate")["generate"])
