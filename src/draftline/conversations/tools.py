"""Tool specs and tool calls in the shapes datasets really use, turned into OpenAI function specs.

Why this matters: the target's chat template renders ``tools`` natively in the system turn. If a dataset's
tools stay as text in its own system prompt (Hermes keeps a Python-repr list inside ``<tools>``), the target
sees them twice, in two formats, and learns to answer in the dataset's call format instead of its own.
So every spec leaves here as a structured entry with JSON-Schema parameters, and system text that only
restated the tools is cut out.
"""

from __future__ import annotations

import ast
import json
import re
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from draftline.core.jsonl import dumps
from draftline.core.records import Tool


class ToolError(ValueError):
    """A tool spec or tool call that cannot be read; the row is skipped with reason ``bad_tools``."""


def parse_literal(text: str) -> Any:
    """Read JSON, or a Python literal (Hermes writes ``{'a': True}``); never ``eval``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
        raise ToolError(f"neither JSON nor a Python literal: {type(e).__name__}: {str(e)[:80]}") from None


def _jsonable(value: Any, where: str) -> Any:
    """A Python literal may hold tuples, sets, bytes or complex numbers; only JSON values may leave."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ToolError(f"{where}: non-finite number")
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, where) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ToolError(f"{where}: non-string key")
        return {k: _jsonable(v, where) for k, v in value.items()}
    raise ToolError(f"{where}: {type(value).__name__} is not a JSON value")


# Agent datasets (xLAM style) write Python type names: "dict", "str", "List[int]", "str, optional".
_PY_TYPES = {
    "dict": "object", "str": "string", "int": "integer", "float": "number", "bool": "boolean",
    "list": "array", "tuple": "array", "set": "array", "none": "null", "nonetype": "null",
}
_JSON_TYPES = {"object", "string", "integer", "number", "boolean", "array", "null"}
_GENERIC = re.compile(r"^(?:typing\.)?(list|tuple|set|sequence|dict|mapping)\[", re.I)


def _json_type(name: str) -> str:
    t = re.sub(r",?\s*optional$", "", name.strip(), flags=re.I).strip()
    if t.lower() in _JSON_TYPES:
        return t.lower()
    if t.lower() in _PY_TYPES:
        return _PY_TYPES[t.lower()]
    m = _GENERIC.match(t)
    if m:
        return "object" if m.group(1).lower() in ("dict", "mapping") else "array"
    return name  # left for the meta-schema check to reject


def _repair_types(schema: Any) -> Any:
    """Python type names -> JSON-Schema types, in every subschema; anything else the meta-schema judges."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(out.get("type"), str):
        out["type"] = _json_type(out["type"])
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _repair_types(v) for k, v in out["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = _repair_types(out[key])
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(out.get(key), list):
            out[key] = [_repair_types(v) for v in out[key]]
    return out


# One meta-schema validator, and one check per distinct schema: agent data repeats the same tool list
# on thousands of rows, and a fresh check costs milliseconds.
_META = Draft202012Validator(Draft202012Validator.META_SCHEMA)


@lru_cache(maxsize=16384)
def _schema_error(schema_json: str) -> str | None:
    error = best_match(_META.iter_errors(json.loads(schema_json)))
    return error.message[:120] if error is not None else None


def normalize_tool(spec: Any) -> Tool:
    """One spec (OpenAI ``{"type": "function", "function": {...}}`` or bare ``{"name", ...}``) as an OpenAI spec."""
    if not isinstance(spec, dict):
        raise ToolError(f"tool spec is a {type(spec).__name__}, not an object")
    fn = spec.get("function") if spec.get("type", "function") == "function" and "function" in spec else spec
    if not isinstance(fn, dict):
        raise ToolError("tool 'function' is not an object")
    name = fn.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolError("tool has no name")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    params = _repair_types(_jsonable(params, f"tool {name!r} parameters"))
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise ToolError(f"tool {name!r}: parameters must be a JSON-Schema object")
    if "type" not in params:
        params = {"type": "object", **params}  # OpenAI requires it; an untyped schema with properties means it
    error = _schema_error(json.dumps(params, sort_keys=True))
    if error:
        raise ToolError(f"tool {name!r}: invalid JSON-Schema: {error}")
    out: dict[str, Any] = {"name": name.strip()}
    if isinstance(fn.get("description"), str):
        out["description"] = fn["description"]
    out["parameters"] = params
    return {"type": "function", "function": out}


def parse_tools(value: Any) -> list[Tool] | None:
    """Tools from a row: a JSON string (agent data), a Python-repr string, a list or None. Empty -> None."""
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            return None
        value = parse_literal(value)
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ToolError(f"tools are a {type(value).__name__}, not a list")
    tools = [normalize_tool(spec) for spec in value if spec is not None]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise ToolError(f"duplicate tool names {sorted(n for n in set(names) if names.count(n) > 1)}")
    return tools or None


# A <tools> block whose body is a list (Hermes) or JSON objects one a line (Qwen); "within <tools> </tools> XML
# tags" in prose has no body and does not match.
_TOOLS_BLOCK = re.compile(r"<tools>\s*([\[{].*?)\s*</tools>", re.S)
# The call-format example Hermes appends: "<tool_call>\n{'arguments': <args-dict>, 'name': <function-name>}\n</tool_call>".
_FORMAT_EXAMPLE = re.compile(r"<tool_call>\s*\{[^{}]*<[a-z_-]+>[^{}]*\}\s*</tool_call>", re.S)
_SENTENCE = re.compile(r"(?<=[.!?:])\s+|\n+")
# Sentences that only describe the tool mechanism, which the target's template states in its own words.
_RESTATES_TOOLS = re.compile(
    r"</?tools>|</?tool_call>|function signatures?|you may call one or more functions"
    r"|json object with function name and arguments",
    re.I,
)


def _block_tools(body: str) -> list[Any]:
    try:
        value = parse_literal(body)
        return list(value) if isinstance(value, (list, tuple)) else [value]
    except ToolError:
        # Qwen style: one JSON object per line.
        return [parse_literal(line) for line in body.splitlines() if line.strip()]


def extract_system_tools(system: str) -> tuple[list[Tool] | None, str]:
    """Tools written into a system prompt (``<tools>...</tools>``), and the system text without what restated them.

    A system prompt with no tools block comes back unchanged. Sentences that speak only about tools or the
    call format go; anything else (persona, rules) stays, so the prompt keeps its meaning.
    """
    blocks = list(_TOOLS_BLOCK.finditer(system))
    if not blocks:
        return None, system
    specs: list[Any] = []
    for m in blocks:
        specs.extend(_block_tools(m.group(1)))
    tools = parse_tools(specs)
    text = _FORMAT_EXAMPLE.sub(" ", _TOOLS_BLOCK.sub(" ", system))
    kept = [s.strip() for s in _SENTENCE.split(text) if s.strip() and not _RESTATES_TOOLS.search(s)]
    return tools, " ".join(kept)


def to_tool_call(call: Any) -> dict[str, Any]:
    """``{"name", "arguments"}`` (a dict or a JSON string) as an OpenAI tool call; arguments as a JSON string."""
    if isinstance(call, str):
        call = parse_literal(call)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        raise ToolError("tool call has no name")
    args = call.get("arguments", call.get("parameters", {}))
    if isinstance(args, str):
        args = parse_literal(args) if args.strip() else {}
    if not isinstance(args, dict):
        raise ToolError(f"tool call {call['name']!r}: arguments are not an object")
    return {"type": "function", "function": {"name": call["name"], "arguments": dumps(_jsonable(args, call["name"]))}}


_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_TOOL_RESPONSE_BLOCK = re.compile(r"<tool_response>\s*(.*?)\s*</tool_response>", re.S)


def split_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """An assistant turn in Hermes style: the text outside ``<tool_call>`` blocks and the calls as OpenAI calls.

    A block that is not a readable call raises :class:`ToolError`: kept as text it would teach the dataset's
    broken call format, and guessing its meaning would invent data.
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for m in _TOOL_CALL_BLOCK.finditer(text):
        calls.append(to_tool_call(m.group(1)))
        kept.append(text[pos : m.start()])
        pos = m.end()
    kept.append(text[pos:])
    return ("".join(kept).strip() if calls else text), calls


def unwrap_tool_responses(text: str) -> list[str]:
    """A Hermes tool turn: the body of each ``<tool_response>`` block (the template adds its own tags back)."""
    bodies = _TOOL_RESPONSE_BLOCK.findall(text)
    return bodies or [text]
