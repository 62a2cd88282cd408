"""The one chat render: every stage that renders calls the same function, with the same arguments."""

from __future__ import annotations

import draftline.evaluate.stage as evaluate_stage
import draftline.generate.local as generate_local
import draftline.prompts.costs as prompt_costs
import draftline.target.embedded.build as embedded_build
import draftline.target.embedded.tokenizer as embedded_tokenizer
import draftline.tokenize.loss_mask as loss_mask
from draftline.core import chat


def test_generation_tokenize_and_every_other_stage_render_with_the_same_function():
    assert generate_local.render is loss_mask.render is chat.render
    for module in (prompt_costs, embedded_build, embedded_tokenizer, evaluate_stage):
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
