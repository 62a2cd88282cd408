"""DVC stage `prompts`: conversations -> train and eval prompts (reads params.yaml: the names of sources, prompts,
dedup, blend, generate.enable_thinking, decontaminate, the names of evaluate.sets). Its paths come from dvc.yaml."""

from draftline.core.runner import main
from draftline.prompts.params import load
from draftline.prompts.stage import PromptsArgs, run_prompts

if __name__ == "__main__":
    main("prompts", PromptsArgs, load, run_prompts)
