"""The prompt stage: source rows -> normalised, deduplicated, blended prompts (see docs/prompts.md).

``iter_conversations`` is also how other stages (the embedded target's corpus) read the sources.
"""

from .adapters import RowError, iter_conversations, make_adapter
from .canonical import cut_prompt, prompt_id
from .stage import run_prompts

__all__ = ["RowError", "cut_prompt", "iter_conversations", "make_adapter", "prompt_id", "run_prompts"]
