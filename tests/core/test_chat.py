"""The one chat render: every stage that renders calls the same function, with the same arguments."""

from __future__ import annotations

import pytest

import draftline.core.requests as core_requests
import draftline.generate.local as generate_local
import draftline.prompts.costs as prompt_costs
import draftline.target.embedded.build as embedded_build
import draftline.target.embedded.tokenizer as embedded_tokenizer
import draftline.tokenize.loss_mask as loss_mask
from draftline.core import chat


def test_generation_tokenize_and_every_other_stage_render_with_the_same_function():
    assert generate_local.render is loss_mask.render is chat.render
    for module in (prompt_costs, embedded_build, embedded_tokenizer, core_requests):
        assert module.render is chat.render, module.__name__


def test_thinking_is_passed_only_when_known_and_is_what_a_request_sends():
    assert chat.template_kwargs(None) == {}
    assert chat.template_kwargs(False) == {"enable_thinking": False}


def test_tool_call_arguments_are_rendered_as_served_without_touching_the_input():
    call = {"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    messages = [{"role": "assistant", "content": "", "tool_calls": [call]}]
    served = chat.as_served(messages)
    assert served[0]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'
    not_an_object = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]
    assert chat.as_served(not_an_object) == not_an_object


def _tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def test_renders_tools_is_true_for_qwen3_and_false_for_a_chatml_template_without_tools(qwen3_tokenizer_dir,
                                                                                       chatml_tokenizer_dir):
    assert chat.renders_tools(_tokenizer(qwen3_tokenizer_dir)) is True
    assert chat.renders_tools(_tokenizer(chatml_tokenizer_dir)) is False


def test_a_conversation_with_tools_is_refused_by_a_template_that_would_drop_them(qwen3_tokenizer_dir,
                                                                                chatml_tokenizer_dir):
    from conftest import WEATHER_TOOL

    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    qwen3, chatml = _tokenizer(qwen3_tokenizer_dir), _tokenizer(chatml_tokenizer_dir)
    assert "get_weather" in chat.render(qwen3, messages, [WEATHER_TOOL], enable_thinking=False, generation_prompt=True)
    with pytest.raises(chat.ToolsNotRendered, match=r"does not render tools: a conversation offering \['get_weather'\]"
                                                    r" would be rendered without them.*prompts.tools_unsupported"):
        chat.render(chatml, messages, [WEATHER_TOOL], enable_thinking=None, generation_prompt=True)
    # Without tools the same template renders as before.
    assert chat.render(chatml, messages, None, enable_thinking=None, generation_prompt=True).endswith(
        "<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n")
