"""The one chat render: every stage that turns messages into the target's text calls :func:`render`.

Acceptance length depends on the drafter seeing at training time exactly the text the target is served, so the
prompt costs (prompts), local generation and the server requests (generate), the loss masks (tokenize), the
embedded target's corpus (target) and speculative decoding (evaluate) all render here, with the same tools and
thinking arguments. Invariants:

- messages are rendered as an OpenAI-compatible server hands them to the template (:func:`as_served`);
- ``enable_thinking`` is passed only when it is known (True/False): a template may treat a present-but-None flag
  differently from an absent one; :func:`template_kwargs` is also what a request sends as ``chat_template_kwargs``;
- the input messages are never modified;
- tools are never dropped silently: a template that cannot render them (:func:`renders_tools`, e.g. SmolLM2's
  ChatML) refuses a conversation that offers tools (:class:`ToolsNotRendered`) instead of rendering it without;
- whether a template has a thinking mode at all (:func:`has_thinking`) is probed on the template, never assumed.
"""

from __future__ import annotations

import json
from typing import Any

from draftline.core.errors import Refusal
from draftline.core.records import Message, Tool

# The probe's tool: a name and description no template writes by itself.
_PROBE_TOOL: Tool = {"type": "function", "function": {
    "name": "draftline_probe_tool", "description": "Draftline probe tool description",
    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}
_RENDERS_TOOLS: dict[str, bool] = {}  # per chat template text


_PROBE = [{"role": "user", "content": "Hi."}]
_REASONING = "draftline probe reasoning"


def has_thinking(tokenizer: Any) -> bool:
    """Whether the template has a thinking mode: its generation prompt reacts to ``enable_thinking`` (Qwen3's
    hybrid template), or it writes an assistant turn's ``reasoning_content`` (a thinking-only template, whose
    prompt opens ``<think>`` whatever the flag)."""

    def text(messages: list, generation_prompt: bool, thinking: bool | None) -> str:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False,
                                             **template_kwargs(thinking))

    if text(_PROBE, True, True) != text(_PROBE, True, False):
        return True
    reply = {"role": "assistant", "content": "Hello.", "reasoning_content": _REASONING}
    return _REASONING in text([*_PROBE, reply], False, None)


class ToolsNotRendered(Refusal):
    """A conversation with tools under a chat template that would render it without them."""


def renders_tools(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template writes the tools it is given into the text (Qwen3's does; SmolLM2's
    ChatML ignores them): a one-message conversation with a probe tool is rendered and the tool's name looked
    for. A template that raises on tools cannot render them either. Cached per template text."""
    key = str(tokenizer.chat_template)
    if key not in _RENDERS_TOOLS:
        name = _PROBE_TOOL["function"]["name"]
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi."}], tools=[_PROBE_TOOL],
                                                 add_generation_prompt=True, tokenize=False)
        except Exception:  # a template that raises on tools (raise_exception) cannot render them
            text = ""
        _RENDERS_TOOLS[key] = isinstance(text, str) and name in text
    return _RENDERS_TOOLS[key]


def template_kwargs(enable_thinking: bool | None) -> dict[str, Any]:
    """The template switches of a run: sent as ``chat_template_kwargs`` and passed to ``apply_chat_template``."""
    return {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}


def render(
    tokenizer: Any,
    messages: list[Message],
    tools: list[Tool] | None,
    *,
    enable_thinking: bool | None,
    generation_prompt: bool,
) -> str:
    """The text the target sees: its own chat template over ``messages`` and ``tools``.

    ``generation_prompt``: end with the assistant header (a prompt to continue), or not (a whole conversation).
    Raises :class:`ToolsNotRendered` when ``tools`` are given and the template cannot render them.
    """
    if tools and not renders_tools(tokenizer):
        names = [(t.get("function") or {}).get("name") for t in tools]
        raise ToolsNotRendered(
            f"the target's chat template does not render tools: a conversation offering {names} would be rendered "
            "without them; leave tool prompts out (the prompt stage refuses or drops them: prompts.tools_unsupported)")
    return tokenizer.apply_chat_template(
        as_served(messages), tools=tools or None, add_generation_prompt=generation_prompt, tokenize=False,
        **template_kwargs(enable_thinking),
    )


def as_served(messages: list[Message]) -> list[Message]:
    """The messages as SGLang hands them to the template: tool-call ``arguments`` sent as a JSON string are
    parsed into an object first (templates such as Qwen3-Coder's iterate over them; Qwen3's prints an object
    with ``tojson``). Arguments that are not a JSON object stay as they are."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls and any(isinstance((c.get("function") or {}).get("arguments"), str) for c in calls):
            m = {**m, "tool_calls": [_parsed_call(c) for c in calls]}
        out.append(m)
    return out


def _parsed_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function") or {}
    if not isinstance(fn.get("arguments"), str):
        return call
    try:
        args = json.loads(fn["arguments"])
    except json.JSONDecodeError:
        return call
    return {**call, "function": {**fn, "arguments": args}} if isinstance(args, dict) else call
