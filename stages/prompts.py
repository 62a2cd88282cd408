"""DVC stage `prompts`: data/raw/* -> data/prompts/{train,eval}.jsonl, metrics/prompts.json, plots/prompts_mix.csv."""

from draftline.params import load_params
from draftline.prompts import run_prompts

if __name__ == "__main__":
    p = load_params("sources", "prompts", "dedup", "blend")
    run_prompts(p["sources"], p["prompts"], p["dedup"], p["blend"])
