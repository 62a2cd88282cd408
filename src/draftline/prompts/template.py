"""What the target's chat template can render, checked by the prompt stage before it blends a row.

A target that is not Qwen3 may have a template without tools or without a thinking mode (SmolLM2's ChatML has
neither). Rendered anyway, a tool prompt would reach generation and training without its tools, and
``generate.enable_thinking: true`` would change nothing the target sees while the data records it as thinking. So:

- tools (:func:`draftline.core.chat.renders_tools`): with ``prompts.tools_unsupported: refuse`` the stage stops in
  one line naming the sources whose prompts offer tools and the param; with ``drop`` those prompts are left out,
  counted per source as the skip ``tools_unsupported`` (in the log, the metrics and the report); a ``weight: 0``
  source's are dropped either way, never refused (it gives no train rows, but its eval rows are still held out);
- thinking (:func:`draftline.core.chat.has_thinking`): ``generate.enable_thinking: true`` under a template without a thinking mode is
  refused in one line naming the param. Later stages read the thinking mode the data recorded, never the param.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any

from draftline.core.chat import has_thinking, renders_tools
from draftline.core.errors import Refusal
from draftline.core.records import PromptRecord
from draftline.core.skips import Skips

TOOLS_UNSUPPORTED = "tools_unsupported"  # the skip reason of a tool prompt dropped under such a template


def check_thinking(tokenizer: Any, enable_thinking: bool) -> None:
    """Refuse ``generate.enable_thinking: true`` under a template without a thinking mode."""
    if enable_thinking and not has_thinking(tokenizer):
        raise Refusal("params.yaml: generate.enable_thinking is true, but the target's chat template has no thinking "
                      "mode (it ignores enable_thinking and writes no reasoning): set generate.enable_thinking: false")


class ToolPrompts:
    """Prompts offering tools under a template that cannot render them: ``keep`` says whether a prompt goes on
    (counting the others), ``check`` refuses them once every source is read (``prompts.tools_unsupported``).
    The tool prompts of an ``unweighted`` source (``weight: 0``) are dropped whatever the mode, never refused."""

    def __init__(self, tokenizer: Any, mode: str, unweighted: Collection[str] = ()):
        self.unsupported = not renders_tools(tokenizer)
        self.mode = mode
        self.unweighted = frozenset(unweighted)
        self.found: Counter[str] = Counter()  # prompts offering tools, per source

    def keep(self, record: PromptRecord, skips: Skips) -> bool:
        if not record.tools or not self.unsupported:
            return True
        self.found[record.source] += 1
        if self.mode == "drop" or record.source in self.unweighted:
            # Chosen by the param, not a bad row: counted (and logged once per source) even under prompts.strict.
            skips.counts[TOOLS_UNSUPPORTED] += 1
            if self.found[record.source] == 1:
                why = "prompts.tools_unsupported: drop" if self.mode == "drop" else "blend weight 0"
                skips.logger.warning("source %s: prompts offering tools are dropped (the target's chat template "
                                     "does not render tools; %s)", record.source, why)
        return False

    def check(self) -> None:
        """With ``refuse``: stop, naming the sources whose prompts offer tools."""
        refused = {s: n for s, n in self.found.items() if s not in self.unweighted}
        if self.mode == "refuse" and refused:
            named = ", ".join(f"{n} of {s}" for s, n in sorted(refused.items()))
            raise Refusal(
                f"the target's chat template does not render tools, and prompts offer them ({named}): set "
                "prompts.tools_unsupported: drop to leave those prompts out (counted as skips tools_unsupported), "
                "or take those sources out of params.yaml: sources")
