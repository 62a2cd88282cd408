"""Tool specs: Hermes' Python-repr tools leave as JSON tools that the real Qwen3 template renders exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftline.conversations.adapters import adapt_rows, make_adapter
from draftline.conversations.tools import ToolError, extract_system_tools, parse_tools, split_tool_calls
from draftline.core.logs import get_logger
from draftline.core.skips import Skips
from draftline.prompts.canonical import cut_prompt


@pytest.fixture(scope="module")
def hermes(datasets_dir: Path):
    rows = [json.loads(line) for line in (datasets_dir / "hermes_function_calling_v1.jsonl").read_text().splitlines()]
    skips = Skips(get_logger("test"))
    convs = list(adapt_rows("hermes_fc", enumerate(rows), make_adapter("hermes_fc", None, "drop"), skips))
    # Row 1's call puts "name" inside "arguments": not a readable call, so the row is skipped, not guessed at.
    assert skips.as_dict() == {"bad_tools": 1} and [c.row for c in convs] == [0, 2, 3]
    return rows, convs


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen3_tokenizer_dir, local_files_only=True)


def test_hermes_python_repr_tools_become_json_tools(hermes) -> None:
    rows, convs = hermes
    tools = convs[0].tools
    assert [t["function"]["name"] for t in tools] == ["search_flights"]
    params = tools[0]["function"]["parameters"]
    assert params["properties"]["class"]["enum"] == ["economy", "business", "first"]
    assert params["required"][:2] == ["departure_city", "destination_city"]
    system = convs[0].messages[0]
    assert system["role"] == "system"
    assert "<tools>" not in system["content"] and "<tool_call>" not in system["content"]
    assert system["content"] == "You are a function calling AI model. Don't make assumptions about what values to plug into functions."
    # Row 1 writes its <tools> block as JSON: read the same way.
    tools1, system1 = extract_system_tools(rows[1]["conversations"][0]["value"])
    assert [t["function"]["name"] for t in tools1] == ["ExpertQAExtractor"]
    assert system1.startswith("You are an expert structured information extraction AI model.") and "<tool" not in system1
    # Rows 2-3 carry a <schema>, not tools: their system prompt stays whole.
    assert convs[1].tools is None and convs[1].messages[0]["content"] == rows[2]["conversations"][0]["value"]


def test_real_qwen3_template_renders_tools_exactly_once(hermes, qwen3) -> None:
    rows, convs = hermes
    tools1, system1 = extract_system_tools(rows[1]["conversations"][0]["value"])
    row1 = [{"role": "system", "content": system1}, {"role": "user", "content": rows[1]["conversations"][1]["value"]}]
    for messages, tools in ((cut_prompt(convs[0], "first").messages, convs[0].tools), (row1, tools1)):
        text = qwen3.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        name = tools[0]["function"]["name"]
        assert text.count(f'"name": "{name}"') == 1, text
        assert text.count("<tools>\n") == 1
        assert text.count("For each function call") == 1
        # The schema arrives as JSON (the template's tojson), never as the dataset's Python repr.
        assert "'type': 'function'" not in text and '"type": "function"' in text
    # Without extraction the same row would show the tools twice: the test can tell.
    raw_system = rows[0]["conversations"][0]["value"]
    naive = qwen3.apply_chat_template(
        [{"role": "system", "content": raw_system}, {"role": "user", "content": "hi"}],
        tools=convs[0].tools, tokenize=False, add_generation_prompt=True,
    )
    assert naive.count("search_flights") == 2


def test_hermes_tool_calls_become_openai_calls_and_render_natively(hermes, qwen3) -> None:
    _, convs = hermes
    conv = convs[0]
    call = conv.messages[2]["tool_calls"][0]["function"]
    assert call["name"] == "search_flights" and json.loads(call["arguments"])["flexible_cancellation"] is True
    assert conv.messages[3]["role"] == "tool" and conv.messages[3]["content"].startswith('{"name": "search_flights"')
    text = qwen3.apply_chat_template(conv.messages, tools=conv.tools, tokenize=False)
    assert text.count("<tool_call>\n{\"name\": \"search_flights\"") == 1
    assert text.count("<tool_response>") == 1


def test_python_repr_is_never_evaluated() -> None:
    with pytest.raises(ToolError):
        extract_system_tools("<tools>\n[__import__('os').system('echo pwned')]\n</tools>")
    with pytest.raises(ToolError):
        parse_tools("[{'name': 'f', 'parameters': {'type': 'object', 'properties': {'a': {'type': 'frobnicate'}}}}]")
    with pytest.raises(ToolError, match="duplicate"):
        parse_tools('[{"name": "f"}, {"name": "f"}]')
    with pytest.raises(ToolError, match="no name"):
        parse_tools('[{"description": "nameless"}]')


def test_bad_tools_row_is_skipped_with_reason() -> None:
    skips = Skips(get_logger("test"))
    no_tag = "You may call functions.\n[{'name': 'f'}]"
    hermes_rows = [
        (0, {"conversations": [{"from": "system", "value": no_tag}, {"from": "human", "value": "hi"}, {"from": "gpt", "value": "<tool_call>\n{'name': 'f', 'arguments': {}}\n</tool_call>"}]}),
        (1, {"conversations": [{"from": "system", "value": "<tools>\n[{'name': 'f'}]\n</tools>"}, {"from": "human", "value": "hi"}, {"from": "gpt", "value": "<tool_call>\n{'name': 'f', 'arguments': {'a': }}\n</tool_call>"}]}),
        (2, {"conversations": [{"from": "system", "value": "<tools>\n[{'name': 'f'}]\n</tools>"}, {"from": "human", "value": "hi"}, {"from": "gpt", "value": ""}]}),
    ]
    assert list(adapt_rows("hermes_fc", iter(hermes_rows), make_adapter("hermes_fc", None, "drop"), skips)) == []
    assert skips.as_dict() == {"bad_tools": 2, "empty": 1}
    skips = Skips(get_logger("test"))
    rows = [
        (0, {"conversations": [{"from": "human", "value": "hi"}], "tools": "[{'name': 'f',"}),
        (1, {"conversations": [{"from": "human", "value": "hi"}], "tools": '[{"name": "g", "parameters": {"type": "object", "properties": {"x": {"type": "str"}}}}]'}),
    ]
    convs = list(adapt_rows("agent", iter(rows), make_adapter("agent", None, "drop"), skips))
    assert skips.as_dict() == {"bad_tools": 1}
    assert convs[0].tools[0]["function"]["parameters"]["properties"]["x"]["type"] == "string"


def test_split_tool_calls_keeps_surrounding_text() -> None:
    text, calls = split_tool_calls("Let me check.\n<tool_call>\n{'name': 'f', 'arguments': {'a': 1}}\n</tool_call>")
    assert text == "Let me check." and calls[0]["function"] == {"name": "f", "arguments": '{"a":1}'}
    with pytest.raises(ToolError):
        split_tool_calls("<tool_call>\n{'arguments': {'a': 1, 'name': 'f'}}\n</tool_call>")
