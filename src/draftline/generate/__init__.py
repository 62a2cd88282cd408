"""The generate stage: the target's own completions for every prompt, resumable to the row."""

from draftline.generate.stage import run_generate

__all__ = ["run_generate"]
