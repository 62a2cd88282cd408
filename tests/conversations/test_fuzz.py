"""Hostile rows, fuzzed (hypothesis): every adapter and the completion reader take any JSON-shaped value without
crashing. A bad row is a counted skip with a reason; a good row among bad ones always comes through."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftline.conversations.adapters import PRESETS, adapt_rows, make_adapter
from draftline.core.logs import get_logger
from draftline.core.records import parse_completion
from draftline.core.skips import Skips

FUZZ = settings(max_examples=int(__import__("os").environ.get("FUZZ_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.too_slow])

# JSON-shaped values with the hostile leaves real dumps hold: NUL bytes, lone surrogates, huge and deep values.
LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(), st.sampled_from(["\x00", "\ud800", "<tool_call>{bad</tool_call>", "<tools>[{'x':}]</tools>", "x" * 100_000]),
)
VALUE = st.recursive(LEAF, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=20)
ROLE = st.sampled_from(["user", "assistant", "system", "tool", "human", "gpt", "function_call", "observation", "x", None])
TURN = st.fixed_dictionaries({}, optional={"from": ROLE, "role": ROLE, "value": VALUE, "content": VALUE,
                                           "tool_calls": VALUE})
KEYS = ["conversations", "messages", "tools", "query", "question", "answer", "response", "body", "body_raw", "parse_error"]
ROW = st.dictionaries(st.sampled_from(KEYS), st.one_of(VALUE, st.lists(TURN, max_size=4),
                                                       st.fixed_dictionaries({"messages": st.lists(TURN, max_size=3)})),
                      max_size=5)
GOOD = {
    "infinity_instruct": {"conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]},
    "webinstructsub": {"question": "What is 2+2?", "answer": "4"},
    "codefeedback": {"query": "Write f.", "answer": "def f(): pass"},
    "metamathqa": {"query": "1+1?", "response": "2"},
    "hermes_fc": {"conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]},
    "agent": {"conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]},
    "http_traces": {"body": {"messages": [{"role": "user", "content": "Hi?"}]}},
    # The benchmark sets' presets (evaluate.sets), in their datasets' schemas.
    "gsm8k": {"question": "What is 2+2?", "answer": "4\n#### 4"},
    "math500": {"problem": "Solve $x + 1 = 2$.", "answer": "1"},
    "humaneval": {"prompt": "def f(x):\n    \"\"\"Return x.\"\"\"\n", "task_id": "HumanEval/0"},
    "mbpp": {"prompt": "Write a function that returns 1.", "task_id": 2},
    "mt_bench": {"prompt": ["Hi?", "And then?"], "category": "writing"},
}


@FUZZ
@given(rows=st.lists(ROW, min_size=1, max_size=6), at=st.integers(min_value=0, max_value=6))
def test_every_adapter_survives_hostile_rows_and_keeps_the_good_one(rows, at):
    for preset in sorted(PRESETS):
        batch = list(rows)
        batch.insert(min(at, len(batch)), GOOD[preset])
        skips = Skips(get_logger("fuzz"))
        convs = list(adapt_rows(preset, enumerate(batch), make_adapter(preset, None, "drop"), skips))
        good_row = min(at, len(rows))
        assert good_row in [c.row for c in convs], (preset, skips.as_dict())
        assert len(convs) + skips.total == len(batch)
        for c in convs:  # what comes through is a valid conversation, whatever came in
            assert all(isinstance(m["content"], str) for m in c.messages)
            json.dumps([c.messages, c.tools], allow_nan=False)


@FUZZ
@given(obj=VALUE)
def test_the_completion_reader_refuses_or_reads_but_never_crashes(obj):
    try:
        rec = parse_completion(obj)
    except ValueError:
        return
    assert isinstance(rec.messages, list) and rec.messages


def test_messages_as_a_plain_string_is_malformed_but_a_responses_input_string_is_a_user_turn():
    skips = Skips(get_logger("fuzz"))
    rows = [{"body": {"messages": "Hi?"}}, {"body": {"input": "Hi?"}}]
    convs = list(adapt_rows("http", enumerate(rows), make_adapter("http_traces", None, "drop"), skips))
    assert [c.row for c in convs] == [1] and convs[0].messages == [{"role": "user", "content": "Hi?"}]
    assert skips.as_dict() == {"malformed": 1}
