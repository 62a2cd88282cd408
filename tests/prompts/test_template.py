"""What the target's chat template can render (prompts/template.py): thinking and tools, probed on real templates."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from draftline.core.chat import has_thinking
from draftline.core.errors import Refusal
from draftline.core.records import PromptRecord
from draftline.core.skips import Skips
from draftline.prompts.template import TOOLS_UNSUPPORTED, ToolPrompts, check_thinking


def _tok(folder):
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def test_has_thinking_for_hybrid_and_thinking_only_templates_not_for_chatml_or_coder(
        qwen3_tokenizer_dir, chatml_tokenizer_dir, qwen3_alt_tokenizer_dir):
    assert has_thinking(_tok(qwen3_tokenizer_dir))  # reacts to enable_thinking
    assert has_thinking(_tok(qwen3_alt_tokenizer_dir("qwen3_30b_thinking_0527")))  # always thinks: writes reasoning
    assert not has_thinking(_tok(qwen3_alt_tokenizer_dir("qwen3_coder")))
    assert not has_thinking(_tok(chatml_tokenizer_dir))


def test_enable_thinking_is_refused_in_one_line_under_a_template_without_thinking(qwen3_tokenizer_dir,
                                                                                  chatml_tokenizer_dir):
    chatml = _tok(chatml_tokenizer_dir)
    check_thinking(chatml, False)
    check_thinking(_tok(qwen3_tokenizer_dir), True)
    with pytest.raises(Refusal, match=r"^params.yaml: generate.enable_thinking is true, but the target's chat "
                                      r"template has no thinking mode .*set generate.enable_thinking: false$"):
        check_thinking(chatml, True)


def _record(source: str, row: int, tools: bool) -> PromptRecord:
    from conftest import WEATHER_TOOL

    return PromptRecord(id=f"{source}{row}", source=source, row=row, messages=[{"role": "user", "content": "Hi."}],
                        tools=[WEATHER_TOOL] if tools else None)


def test_tool_prompts_pass_where_tools_render_and_are_counted_or_refused_where_not(qwen3_tokenizer_dir,
                                                                                   chatml_tokenizer_dir):
    import logging

    skips = Skips(logging.getLogger("test"), strict=True)  # a chosen drop is not a bad row: strict does not stop it
    qwen3 = ToolPrompts(_tok(qwen3_tokenizer_dir), "refuse")
    assert qwen3.keep(_record("a", 0, True), skips) and not skips.counts
    qwen3.check()
    drop = ToolPrompts(_tok(chatml_tokenizer_dir), "drop")
    assert drop.keep(_record("a", 0, False), skips)
    assert not drop.keep(_record("a", 1, True), skips) and skips.counts == {TOOLS_UNSUPPORTED: 1}
    drop.check()
    refuse = ToolPrompts(_tok(chatml_tokenizer_dir), "refuse")
    for source, row in (("b", 0), ("a", 1), ("b", 2)):
        assert not refuse.keep(_record(source, row, True), skips)
    with pytest.raises(Refusal, match=r"does not render tools, and prompts offer them \(1 of a, 2 of b\): set "
                                      r"prompts.tools_unsupported: drop"):
        refuse.check()


def test_a_weight_0_source_offering_tools_is_dropped_from_not_refused(chatml_tokenizer_dir):
    """``weight: 0`` leaves a source out of the train blend: its tool prompts are dropped and counted under
    ``refuse`` too (its eval rows are still held out, so they are not kept), and only weighted sources are named."""
    import logging

    from draftline.prompts.blend import unweighted
    from draftline.prompts.params import BlendSource

    left_out = unweighted(["a", "b", "c"], {"b": BlendSource(weight=0.0), "c": BlendSource(whole=True)})
    assert left_out == ["b"]  # a whole source is taken in full, whatever its (absent) weight
    skips = Skips(logging.getLogger("test"), strict=True)
    refuse = ToolPrompts(_tok(chatml_tokenizer_dir), "refuse", left_out)
    assert not refuse.keep(_record("b", 0, True), skips) and skips.counts == {TOOLS_UNSUPPORTED: 1}
    assert refuse.keep(_record("b", 1, False), skips)
    refuse.check()
    assert not refuse.keep(_record("a", 2, True), skips) and skips.counts == {TOOLS_UNSUPPORTED: 1}
    with pytest.raises(Refusal, match=r"prompts offer them \(1 of a\): set"):
        refuse.check()
