"""Adapters on every real-row file in ../shared/fixtures/datasets, read back through the sources stage's Parquet."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from draftline.conversations.adapters import adapt_rows, iter_conversations, make_adapter
from draftline.core.logs import get_logger
from draftline.core.raw import rows_to_table, write_raw
from draftline.core.records import ROLES
from draftline.core.skips import RowError, SkipError, Skips
from draftline.prompts.canonical import cut_prompt

# fixture file -> (adapter, rows expected to come through with multimodal: drop)
FIXTURES = {
    "agent_glaive_toolcall_sharegpt": ("agent", 15),
    "agent_reason_tool_use_llamafactory_v1": ("agent", 15),
    "codefeedback_filtered_instruction": ("codefeedback", 1),
    "hermes_function_calling_v1": ("hermes_fc", 3),  # row 1's tool call nests "name" in "arguments": bad_tools
    "infinity_instruct_7M": ("infinity_instruct", 11),
    "infinity_instruct_gen": ("infinity_instruct", 15),
    "metamathqa": ("metamathqa", 2),
    "openai_multimodal_request_bodies": ("http_traces", 9),
}


def _rows(datasets_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (datasets_dir / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def raw_root(datasets_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("raw")
    for name in FIXTURES:
        write_raw(rows_to_table(_rows(datasets_dir, name)), root / name)
    return root


def _convs(raw_root: Path, name: str, multimodal: str = "drop", strict: bool = False):
    skips = Skips(get_logger("test"), strict=strict)
    stats: Counter[str] = Counter()
    adapter = FIXTURES[name][0]
    convs = list(iter_conversations(name, adapter, raw_root / name, skips, options=None, multimodal=multimodal, stats=stats))
    return convs, skips, stats


def test_fixture_list_is_complete(datasets_dir: Path) -> None:
    assert {p.stem for p in datasets_dir.glob("*.jsonl")} == set(FIXTURES)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_fixture_adapts_to_valid_conversations(raw_root: Path, datasets_dir: Path, name: str) -> None:
    convs, skips, stats = _convs(raw_root, name)
    assert stats["rows"] == len(_rows(datasets_dir, name))
    assert len(convs) == FIXTURES[name][1], skips.as_dict()
    for c in convs:
        assert c.source == name
        assert any(m["role"] == "user" and m["content"].strip() for m in c.messages)
        for m in c.messages:
            assert m["role"] in ROLES
            assert isinstance(m["content"], str)
            for call in m.get("tool_calls", []):
                assert call["type"] == "function"
                assert isinstance(json.loads(call["function"]["arguments"]), dict)
        for tool in c.tools or []:
            assert tool["type"] == "function" and tool["function"]["parameters"]["type"] == "object"
        prompt = cut_prompt(c, "first")
        assert prompt.messages[-1]["role"] == "user"
        json.dumps(prompt.to_dict())


def test_malformed_body_is_a_counted_skip_not_a_crash(raw_root: Path) -> None:
    convs, skips, stats = _convs(raw_root, "openai_multimodal_request_bodies")
    assert skips.as_dict() == {"malformed": 1}
    assert 9 not in {c.row for c in convs}
    # Eight image parts across the readable bodies were dropped, the text kept.
    assert stats["media_parts_dropped"] == 8
    assert convs[0].messages == [{"role": "user", "content": "What’s in this image?"}]
    with pytest.raises(SkipError, match="row 9: malformed"):
        _convs(raw_root, "openai_multimodal_request_bodies", strict=True)


def test_multimodal_skip_drops_rows_with_media(raw_root: Path) -> None:
    convs, skips, _ = _convs(raw_root, "openai_multimodal_request_bodies", multimodal="skip")
    assert skips.as_dict() == {"malformed": 1, "multimodal": 8}
    assert [c.row for c in convs] == [7]


def test_responses_api_input_is_read(raw_root: Path) -> None:
    convs, _, _ = _convs(raw_root, "openai_multimodal_request_bodies")
    by_row = {c.row: c for c in convs}
    assert by_row[8].messages == [{"role": "user", "content": "what is in this image?"}]
    assert by_row[7].messages[0]["role"] == "system"


def test_glaive_function_call_and_observation(raw_root: Path) -> None:
    convs, _, _ = _convs(raw_root, "agent_glaive_toolcall_sharegpt")
    c = convs[3]
    assert [m["role"] for m in c.messages[:4]] == ["user", "assistant", "tool", "assistant"]
    call = c.messages[1]["tool_calls"][0]["function"]
    assert call["name"] == "calculate_area"
    assert json.loads(call["arguments"]) == {"shape": "rectangle", "dimensions": [5, 3]}
    assert c.messages[2]["content"] == '{"area": 15}'
    assert [t["function"]["name"] for t in c.tools] == ["calculate_area", "calculate_discount"]
    # "tools": "[]" means no tools, not an empty list the template would render.
    assert convs[1].tools is None


def test_agent_typed_parts_reasoning_calls_and_parallel_results(raw_root: Path) -> None:
    convs, _, _ = _convs(raw_root, "agent_reason_tool_use_llamafactory_v1")
    c = next(c for c in convs if c.row == 2)
    first_reply = c.messages[2]
    assert first_reply["role"] == "assistant" and first_reply["reasoning_content"].startswith("Okay, the user wants")
    assert [json.loads(t["function"]["arguments"]) for t in first_reply["tool_calls"]] == [{"radius": 1.5}, {"radius": 3}]
    results = c.messages[3:5]
    assert [m["role"] for m in results] == ["tool", "tool"]
    assert results[0]["tool_call_id"] == "call_7aEpYivNq3WjuZ3DXJlNZXiZ" and results[0]["name"] == "circle_area"
    # xLAM-style Python type names become JSON-Schema types instead of costing the row.
    row0 = next(c for c in convs if c.row == 0)
    assert row0.tools[0]["function"]["parameters"]["properties"]["identifier"]["type"] == "string"
    assert row0.tools[0]["function"]["parameters"]["type"] == "object"


def test_fields_adapters_keep_answer_as_reference(raw_root: Path) -> None:
    c = _convs(raw_root, "metamathqa")[0][0]
    p = cut_prompt(c, "first")
    assert p.messages == [{"role": "user", "content": c.messages[0]["content"]}]
    assert p.reference.endswith("The answer is: \\sqrt{5}")


def test_generic_adapters_with_options() -> None:
    skips = Skips(get_logger("test"))
    rows = [
        (0, {"q": "What is 2+2?", "sys": "Be brief.", "a": "4"}),
        (1, {"q": {"not": "a string"}}),
        (2, {"q": "  "}),
    ]
    convs = list(adapt_rows("x", iter(rows), make_adapter("fields", {"prompt_field": "q", "system_field": "sys", "answer_field": "a"}, "drop"), skips))
    assert [m["role"] for m in convs[0].messages] == ["system", "user", "assistant"]
    assert skips.as_dict() == {"malformed": 1}
    with pytest.raises(RowError, match="empty"):
        cut_prompt(convs[1], "first")
    # A list of strings is a multi-turn prompt (mt-bench): one user message per turn, each wrapped in the template.
    turns = make_adapter("fields", {"prompt_field": "q", "prompt_template": "Q: {prompt}"}, "drop")({"q": ["a", "b"]})
    assert turns.messages == [{"role": "user", "content": "Q: a"}, {"role": "user", "content": "Q: b"}]
    with pytest.raises(RowError, match="int"):
        make_adapter("fields", {"prompt_field": "q"}, "drop")({"q": ["a", 3]})
    with pytest.raises(ValueError, match="no option"):
        make_adapter("codefeedback", {"prompt_feild": "q"}, "drop")
    with pytest.raises(ValueError, match="unknown adapter"):
        make_adapter("nope", None, "drop")


def test_turns_all_keeps_every_user_turn(raw_root: Path) -> None:
    convs, _, _ = _convs(raw_root, "infinity_instruct_7M")
    c = max(convs, key=lambda c: sum(m["role"] == "user" for m in c.messages))
    users = [m["content"] for m in c.messages if m["role"] == "user"]
    first, every = cut_prompt(c, "first"), cut_prompt(c, "all")
    assert len(users) > 1
    assert [m["content"] for m in every.messages if m["role"] == "user"] == users
    assert all(m["role"] != "assistant" for m in every.messages)
    assert first.id != every.id and len(every.reference) > len(first.reference)
