"""DVC stage `prompts`: python stages/prompts.py (reads params.yaml: the names of sources, prompts, dedup, blend,
generate.enable_thinking)."""

from draftline.core.params import load_section, load_value
from draftline.prompts.blend import BlendParams
from draftline.prompts.dedup import DedupParams
from draftline.prompts.stage import PromptsParams, run_prompts

if __name__ == "__main__":
    run_prompts(
        list(load_section("sources")),
        PromptsParams.load("prompts"),
        DedupParams.load("dedup"),
        BlendParams.load("blend"),
        enable_thinking=load_value("generate.enable_thinking", bool),
    )
