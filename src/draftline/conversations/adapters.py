"""Source rows -> normalised conversations: three generic adapters and the presets built on them.

Every adapter returns OpenAI-style messages whose ``content`` is always a string, plus OpenAI tool specs.
A row that cannot be read raises :class:`RowError` with a reason that the caller counts as a skip;
one bad row never stops a source (see ``iter_conversations``).

- ``sharegpt``: a list of turns ``{from, value}`` or ``{role, content}``; roles mapped (human -> user,
  function_call -> an assistant tool call, observation -> a tool result, ...); typed content parts
  (``text`` / ``reasoning`` / ``tool_call``) as agent datasets write them; optional Hermes markup.
- ``fields``: one prompt column, optional system and answer columns.
- ``openai``: a chat-completions request body found at a dotted path (``body.messages``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from draftline.conversations.tools import (
    ToolError,
    extract_system_tools,
    parse_tools,
    split_tool_calls,
    to_tool_call,
    unwrap_tool_responses,
)
from draftline.core.params import ParamsError
from draftline.core.raw import read_raw
from draftline.core.records import Conversation, Message, Tool
from draftline.core.skips import RowError, Skips

TEXT_PARTS = ("text", "input_text", "output_text")
MEDIA_PARTS = ("image_url", "image", "input_image", "audio", "input_audio", "video", "video_url", "file", "input_file")

# sharegpt speaker names seen in the wild -> OpenAI roles; "call" is an assistant turn that only calls a tool.
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "function_call": "call",
    "tool_call": "call",
    "observation": "tool",
    "function_response": "tool",
    "function": "tool",
    "tool": "tool",
    "developer": "system",
}


class Parts:
    """Typed content parts of one message, split by what they become."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.media = 0


def read_content(content: Any, multimodal: str) -> Parts:
    """A message's content (a string, None, or a list of typed parts) split into text, reasoning, calls, media.

    Media parts are counted and dropped, or the row is skipped (``multimodal: skip``): the target here reads text.
    """
    parts = Parts()
    if content is None:
        return parts
    if isinstance(content, str):
        parts.text.append(content)
        return parts
    if not isinstance(content, list):
        raise RowError("malformed", f"content is a {type(content).__name__}")
    for p in content:
        if isinstance(p, str):
            parts.text.append(p)
            continue
        if not isinstance(p, Mapping):
            raise RowError("malformed", f"content part is a {type(p).__name__}")
        kind = p.get("type")
        # Agent datasets put the payload under "value"; OpenAI under "text".
        value = p.get("text") if p.get("text") is not None else p.get("value")
        if kind in TEXT_PARTS:
            parts.text.append(_string(value, kind))
        elif kind in ("reasoning", "thinking"):
            parts.reasoning.append(_string(value, kind))
        elif kind in ("tool_call", "function_call"):
            parts.calls.append(_call(value))
        elif kind in MEDIA_PARTS:
            if multimodal == "skip":
                raise RowError("multimodal", f"{kind} part")
            parts.media += 1
        else:
            raise RowError("malformed", f"unknown content part type {kind!r}")
    return parts


def _string(value: Any, kind: Any) -> str:
    if not isinstance(value, str):
        raise RowError("malformed", f"{kind} part holds a {type(value).__name__}")
    return value


def _call(value: Any) -> dict[str, Any]:
    try:
        return to_tool_call(value)
    except ToolError as e:
        raise RowError("bad_tools", str(e)) from None


def _tool_results(text: str, hermes: bool) -> list[Message]:
    """One tool turn -> one or more ``role: tool`` messages (agent data packs parallel results in a JSON list)."""
    if hermes:
        return [{"role": "tool", "content": body} for body in unwrap_tool_responses(text)]
    if text.lstrip().startswith("[{"):
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            items = None
        if isinstance(items, list) and items and all(isinstance(i, dict) and "content" in i for i in items):
            out = []
            for i in items:
                c = i["content"]
                msg: Message = {"role": "tool", "content": c if isinstance(c, str) else json.dumps(c, ensure_ascii=False)}
                if isinstance(i.get("tool_call_id"), str):
                    msg["tool_call_id"] = i["tool_call_id"]
                if isinstance(i.get("name"), str):
                    msg["name"] = i["name"]
                out.append(msg)
            return out
    return [{"role": "tool", "content": text}]


def _read_tools(value: Any) -> list[Tool] | None:
    try:
        return parse_tools(value)
    except ToolError as e:
        raise RowError("bad_tools", str(e)) from None


def _merge_tools(a: list[Tool] | None, b: list[Tool] | None) -> list[Tool] | None:
    return _read_tools(a + b) if a and b else a or b


def _first(row: Mapping[str, Any], names: str | list[str]) -> Any:
    for name in [names] if isinstance(names, str) else names:
        if row.get(name) is not None:
            return row[name]
    return None


class Adapted:
    """What an adapter gives back: the messages, the tools, and how many media parts it dropped."""

    __slots__ = ("messages", "tools", "media")

    def __init__(self, messages: list[Message], tools: list[Tool] | None, media: int = 0):
        self.messages = messages
        self.tools = tools
        self.media = media


def sharegpt(
    row: Mapping[str, Any],
    *,
    multimodal: str,
    messages_field: str | list[str] = ("conversations", "messages"),
    tools_field: str | None = None,
    tool_markup: str | None = None,
    roles: Mapping[str, str] | None = None,
) -> Adapted:
    """Turns ``[{from, value}]`` or ``[{role, content}]``; ``tool_markup: hermes`` reads Hermes' in-text tools and calls."""
    turns = _first(row, list(messages_field) if not isinstance(messages_field, str) else messages_field)
    if not isinstance(turns, list):
        raise RowError("malformed", f"no list of turns in {messages_field}")
    role_map = {**SHAREGPT_ROLES, **(roles or {})}
    hermes = tool_markup == "hermes"
    tools = _read_tools(row.get(tools_field)) if tools_field else None
    messages: list[Message] = []
    media = 0
    for turn in turns:
        if not isinstance(turn, Mapping):
            raise RowError("malformed", f"turn is a {type(turn).__name__}")
        speaker = turn.get("from") if turn.get("from") is not None else turn.get("role")
        role = role_map.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            raise RowError("malformed", f"unknown role {speaker!r}")
        parts = read_content(turn.get("value") if turn.get("value") is not None else turn.get("content"), multimodal)
        media += parts.media
        text = "".join(parts.text)
        if role == "system" and hermes:
            try:
                found, text = extract_system_tools(text)
            except ToolError as e:
                raise RowError("bad_tools", str(e)) from None
            tools = _merge_tools(tools, found)
            if not text:
                continue
        if role == "tool":
            messages.extend(_tool_results(text, hermes))
            continue
        if role == "call":
            role, text = "assistant", ""
            parts.calls.append(_call("".join(parts.text)))
            # "gpt: I'll look that up" then "function_call: {...}" (or two calls in a row) is one assistant turn.
            if messages and messages[-1]["role"] == "assistant":
                prev = messages.pop()
                text = prev["content"]
                parts.reasoning[:0] = [prev["reasoning_content"]] if "reasoning_content" in prev else []
                parts.calls[:0] = prev.get("tool_calls", [])
        msg: Message = {"role": role, "content": text}
        if role == "assistant":
            if hermes:
                try:
                    text, calls = split_tool_calls(text)
                except ToolError as e:
                    raise RowError("bad_tools", f"unreadable <tool_call>: {e}") from None
                msg["content"] = text
                parts.calls.extend(calls)
            if parts.reasoning:
                msg["reasoning_content"] = "\n".join(parts.reasoning)
            if parts.calls:
                msg["tool_calls"] = parts.calls
        elif parts.reasoning or parts.calls:
            raise RowError("malformed", f"reasoning or tool calls in a {role} turn")
        messages.append(msg)
    if hermes and not tools and any(m.get("tool_calls") for m in messages):
        raise RowError("bad_tools", "tool calls but no readable <tools> block in the system prompt")
    return Adapted(messages, tools, media)


def fields(
    row: Mapping[str, Any],
    *,
    multimodal: str,
    prompt_field: str,
    system_field: str | None = None,
    answer_field: str | None = None,
    prompt_template: str | None = None,
) -> Adapted:
    """Datasets with the prompt (and maybe a system prompt and an answer) in their own columns.

    A list of strings in the prompt column is a multi-turn prompt (mt-bench's ``prompt``): one user message per
    turn, which evaluate decodes one after another. ``prompt_template`` wraps each turn (``{prompt}`` marks it), as
    benchmark harnesses do (gsm8k's "Please reason step by step ...").
    """
    del multimodal  # plain text columns hold no media
    messages: list[Message] = []
    for role, name in (("system", system_field), ("user", prompt_field), ("assistant", answer_field)):
        if name is None:
            continue
        value = row.get(name)
        if value is None and role != "user":
            continue
        turns = value if role == "user" and isinstance(value, list) and value else [value]
        for turn in turns:
            if not isinstance(turn, str):
                raise RowError("malformed", f"{name} is a {type(turn).__name__}, not a string")
            if role == "system" and not turn.strip():
                continue
            if role == "user" and prompt_template:
                turn = prompt_template.replace("{prompt}", turn)
            messages.append({"role": role, "content": turn})
    return Adapted(messages, None)


def _at(row: Mapping[str, Any], path: str) -> Any:
    value: Any = row
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def openai(
    row: Mapping[str, Any],
    *,
    multimodal: str,
    messages_path: str | list[str] = "messages",
    tools_path: str | None = "tools",
    raw_field: str | None = None,
    error_field: str | None = None,
) -> Adapted:
    """A chat-completions (or Responses API ``input``) request body found at a dotted path in the row."""
    paths = [messages_path] if isinstance(messages_path, str) else list(messages_path)
    path, found = next(((p, v) for p, v in ((p, _at(row, p)) for p in paths) if v is not None), (None, None))
    if found is None:
        if raw_field and row.get(raw_field) is not None:
            # Kept as raw text because it never parsed: a server would have rejected it too.
            raise RowError("malformed", str(row.get(error_field) or "unparsed request body") if error_field else "")
        raise RowError("malformed", f"no messages at {' or '.join(paths)}")
    if isinstance(found, str):
        # A plain string is the Responses API's `input` (one user turn); as chat `messages` it is a malformed body.
        if not path.rsplit(".", 1)[-1] == "input":
            raise RowError("malformed", f"{path} is a string, not a list of messages")
        found = [{"role": "user", "content": found}]
    if not isinstance(found, list):
        raise RowError("malformed", f"messages are a {type(found).__name__}")
    tools = _read_tools(_at(row, tools_path)) if tools_path else None
    messages: list[Message] = []
    media = 0
    for m in found:
        if not isinstance(m, Mapping):
            raise RowError("malformed", f"message is a {type(m).__name__}")
        role = {"developer": "system", "function": "tool"}.get(m.get("role"), m.get("role"))
        if role not in ("system", "user", "assistant", "tool"):
            raise RowError("malformed", f"unknown role {m.get('role')!r}")
        parts = read_content(m.get("content"), multimodal)
        media += parts.media
        msg: Message = {"role": role, "content": "".join(parts.text)}
        reasoning = [m["reasoning_content"]] if isinstance(m.get("reasoning_content"), str) else []
        if reasoning or parts.reasoning:
            msg["reasoning_content"] = "\n".join(reasoning + parts.reasoning)
        calls = [_call(c.get("function") if isinstance(c, Mapping) else c) for c in m.get("tool_calls") or []]
        if calls or parts.calls:
            msg["tool_calls"] = calls + parts.calls
        for key in ("tool_call_id", "name"):
            if role == "tool" and isinstance(m.get(key), str):
                msg[key] = m[key]
        messages.append(msg)
    return Adapted(messages, tools, media)


GENERIC: dict[str, Callable[..., Adapted]] = {"sharegpt": sharegpt, "fields": fields, "openai": openai}

_REASON = "\nPlease reason step by step, and put your final answer within \\boxed{}."

# The seven sources' schemas (../shared/fixtures/datasets/SOURCES.md), as generic adapters plus options.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "infinity_instruct": ("sharegpt", {"messages_field": "conversations"}),
    "webinstructsub": ("fields", {"prompt_field": "question", "answer_field": "answer"}),
    "codefeedback": ("fields", {"prompt_field": "query", "answer_field": "answer"}),
    "metamathqa": ("fields", {"prompt_field": "query", "answer_field": "response"}),
    "hermes_fc": ("sharegpt", {"messages_field": "conversations", "tool_markup": "hermes"}),
    "agent": ("sharegpt", {"messages_field": ["conversations", "messages"], "tools_field": "tools"}),
    "http_traces": (
        "openai",
        {
            "messages_path": ["body.messages", "body.input"],
            "tools_path": "body.tools",
            "raw_field": "body_raw",
            "error_field": "parse_error",
        },
    ),
    # The benchmark sets z-lab's `dflash benchmark` and the model cards report (evaluate.sets), with its prompts.
    "gsm8k": ("fields", {"prompt_field": "question", "prompt_template": "{prompt}" + _REASON}),
    "math500": ("fields", {"prompt_field": "problem", "prompt_template": "{prompt}" + _REASON}),
    "humaneval": ("fields", {"prompt_field": "prompt", "prompt_template": (
        "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```")}),
    "mbpp": ("fields", {"prompt_field": "prompt"}),
    "mt_bench": ("fields", {"prompt_field": "prompt"}),
}

ADAPTER_OPTIONS = {
    "sharegpt": {"messages_field", "tools_field", "tool_markup", "roles"},
    "fields": {"prompt_field", "system_field", "answer_field", "prompt_template"},
    "openai": {"messages_path", "tools_path", "raw_field", "error_field"},
}


def make_adapter(name: str, options: Mapping[str, Any] | None, multimodal: str) -> Callable[[Mapping[str, Any]], Adapted]:
    """The adapter ``name`` (a preset or a generic one) with ``options`` over its defaults; bad config fails here."""
    if multimodal not in ("drop", "skip"):
        raise ParamsError(f"conversations.multimodal must be 'drop' or 'skip', not {multimodal!r}")
    generic, defaults = PRESETS.get(name, (name, {}))
    if generic not in GENERIC:
        raise ParamsError(f"unknown adapter {name!r}; use one of {sorted(PRESETS) + sorted(GENERIC)}")
    opts = {**defaults, **(options or {})}
    unknown = set(opts) - ADAPTER_OPTIONS[generic]
    if unknown:
        raise ParamsError(f"adapter {name!r} ({generic}) has no option(s) {sorted(unknown)}; it takes {sorted(ADAPTER_OPTIONS[generic])}")
    if generic == "fields" and "prompt_field" not in opts:
        raise ParamsError(f"adapter {name!r} needs sources.<name>.options.prompt_field")
    fn = GENERIC[generic]
    return lambda row: fn(row, multimodal=multimodal, **opts)


def adapt_rows(
    name: str,
    rows: Iterator[tuple[int, Mapping[str, Any]]],
    adapter: Callable[[Mapping[str, Any]], Adapted],
    skips: Skips,
    stats: Counter[str] | None = None,
) -> Iterator[Conversation]:
    """Adapt ``(row_index, row)`` pairs; unreadable rows are counted in ``skips`` (or raise in strict mode)."""
    stats = stats if stats is not None else Counter()
    for index, row in rows:
        stats["rows"] += 1
        try:
            if not isinstance(row, Mapping):
                raise RowError("malformed", f"row is a {type(row).__name__}")
            got = adapter(row)
        except RowError as e:
            skips.add(e.reason, f"{name} row {index}", e.detail)
            continue
        if not got.messages:
            skips.add("empty", f"{name} row {index}", "no messages")
            continue
        # An empty reply is a broken row, not an answer: it would teach the target to stop at once.
        if any(m["role"] == "assistant" and not (m["content"].strip() or m.get("tool_calls") or m.get("reasoning_content")) for m in got.messages):
            skips.add("empty", f"{name} row {index}", "empty assistant turn")
            continue
        stats["media_parts_dropped"] += got.media
        yield Conversation(source=name, row=index, messages=got.messages, tools=got.tools)


def iter_conversations(
    name: str,
    adapter: str,
    raw_dir: str | Path,
    skips: Skips,
    *,
    options: Mapping[str, Any] | None,
    multimodal: str,
    stats: Counter[str] | None = None,
) -> Iterator[Conversation]:
    """Every readable row of source ``name`` (``data/raw/<name>``) as a whole conversation, answers included.

    ``adapter`` is a preset or generic adapter name and ``options`` override its defaults
    (``params.yaml: sources.<name>.adapter`` and ``.options``).
    """
    yield from adapt_rows(name, read_raw(raw_dir), make_adapter(adapter, options, multimodal), skips, stats)
