"""The ``local`` backend: the target loaded in-process with transformers, batched generation on CPU or GPU.

It renders every prompt with the one render (:func:`draftline.core.chat.render`), as SGLang renders a request
(the target's own template, the tools, the run's ``chat_template_kwargs``, the generation prompt), decodes
with special tokens skipped as SGLang does by default, and splits reasoning from the answer at ``</think>``
the way SGLang's ``qwen3`` reasoning parser does, and takes tool calls out of the answer as its ``qwen25`` tool-call
parser does (:mod:`draftline.generate.tool_calls`), so a record looks the same whichever backend made it.

With ``generate.draft_model`` each prompt is decoded alone (batch size 1) by the speculative loop of
:mod:`draftline.drafter.speculative`, the target verifying the drafter's blocks: greedy, the same tokens as the batched
decoding without it (tested); sampled, the same distribution but other draws. Either way it is not part of the
journal key: switching the drafter on or off never re-sends a finished prompt. The drafter loads as the evaluate
stage loads it (:func:`draftline.drafter.fit.load_fitting`): one of another target is refused before any prompt.
"""

from __future__ import annotations

import hashlib
from typing import Any

from draftline.core.chat import render
from draftline.core.records import Message, TargetInfo, Tool
from draftline.core.target_loader import load_model, load_tokenizer
from draftline.core.tool_calls import split_tool_calls
from draftline.generate.openai_client import ChatResult
from draftline.generate.params import LocalParams


def split_reasoning(text: str, think_start: str, think_end: str, in_reasoning: bool) -> tuple[str | None, str]:
    """``(reasoning, content)`` as SGLang's reasoning parser splits a whole reply.

    ``in_reasoning`` is true when the prompt already opened the think block (thinking-only templates).
    A reply cut before ``think_end`` is all reasoning, which is why truncated replies are kept out of the data.
    """
    if not (in_reasoning or think_start in text):
        return None, text
    text = text.replace(think_start, "").strip()
    if think_end not in text:
        return text, ""
    reasoning, content = text.split(think_end, 1)
    return reasoning, content.strip()


class LocalBackend:
    """Generates replies for batches of ``(messages, tools)`` with the sampling params of the run."""

    def __init__(self, info: TargetInfo, sampling: dict[str, Any], enable_thinking: bool, local: LocalParams,
                 draft_model: str | None):
        import torch

        self.torch = torch
        self.info = info
        self.sampling = sampling
        self.enable_thinking = enable_thinking
        self.batch_size = local.batch_size
        device = local.device
        self.device = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                                   "cpu" if device == "auto" else device)
        self.tokenizer = load_tokenizer(info)
        dtype = getattr(torch, local.dtype) if local.dtype != "auto" else "auto"
        self.model = load_model(info, dtype=dtype, device=self.device)
        self.proposer = None
        if draft_model is not None:
            from draftline.drafter.fit import load_fitting
            from draftline.drafter.speculative import DFlashProposer

            # Evaluate's load: a drafter of another target (tokenizer, layer count) is refused, not run.
            self.proposer = DFlashProposer(load_fitting(draft_model, info, self.model))
        self.stop_ids = sorted({info.end_of_turn_token_id, info.eos_token_id})
        pad = info.pad_token_id if info.pad_token_id is not None else info.eos_token_id
        self.pad_id = pad
        self.think_start = info.think_start_token or "<think>"
        self.think_end = info.think_end_token or "</think>"
        self.engine = local_engine()

    def generate(self, requests: list[tuple[list[Message], list[Tool] | None]]) -> list[ChatResult]:
        """One batched ``model.generate`` over the requests (left-padded), one :class:`ChatResult` each."""
        torch = self.torch
        from transformers import GenerationConfig

        texts = [render(self.tokenizer, m, t, enable_thinking=self.enable_thinking, generation_prompt=True)
                 for m, t in requests]
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        if self.proposer is not None:
            return [self._speculative(x, text, tools) for x, text, (_, tools) in zip(ids, texts, requests)]
        width = max(len(x) for x in ids)
        input_ids = torch.tensor([[self.pad_id] * (width - len(x)) + x for x in ids], device=self.device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=self.device)
        s = self.sampling
        greedy = float(s["temperature"]) <= 0.0
        gen = GenerationConfig(
            max_new_tokens=int(s["max_tokens"]), do_sample=not greedy,
            temperature=None if greedy else float(s["temperature"]),
            top_p=None if greedy else float(s["top_p"]),
            top_k=None if greedy or s.get("top_k") in (None, -1, 0) else int(s["top_k"]),
            eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
        )
        if not greedy:
            # Seeded by the batch's content, so a resumed run samples a batch exactly as an uninterrupted one.
            digest = hashlib.sha256(("\n".join(texts) + f"\n{s.get('seed', 0)}").encode()).digest()
            torch.manual_seed(int.from_bytes(digest[:8], "little"))
        with torch.no_grad():
            out = self.model.generate(input_ids=input_ids, attention_mask=mask, generation_config=gen)
        results = []
        for row, prompt_ids, text, (_, tools) in zip(out[:, width:].tolist(), ids, texts, requests):
            n, finish = len(row), "length"
            for i, tok in enumerate(row):
                if tok in self.stop_ids:
                    n, finish = i + 1, "stop"
                    break
            reply = self.tokenizer.decode(row[:n], skip_special_tokens=True)
            results.append(self._result(reply, text, tools, finish, len(prompt_ids), n))
        return results

    def _seed(self, text: str) -> int:
        """Seeded by the request's content, so a resumed run samples a request exactly as an uninterrupted one."""
        digest = hashlib.sha256((text + f"\n{self.sampling.get('seed', 0)}").encode()).digest()
        return int.from_bytes(digest[:8], "little") & (2**63 - 1)

    def _speculative(self, prompt_ids: list[int], text: str, tools: list[Tool] | None) -> ChatResult:
        """One request through the speculative loop (the target verifying the drafter's blocks)."""
        from draftline.drafter.speculative import Sampling, speculative_generate

        s = self.sampling
        top_k = 0 if s.get("top_k") in (None, -1) else int(s["top_k"])
        sampling = Sampling(float(s["temperature"]), float(s["top_p"]) if s["temperature"] > 0 else 1.0, top_k)
        gen = speculative_generate(self.model, self.proposer, prompt_ids, int(s["max_tokens"]), self.stop_ids,
                                   sampling, self._seed(text))
        finish = "stop" if gen.stop_reason == "stop" else "length"
        reply = self.tokenizer.decode(gen.tokens, skip_special_tokens=True)
        result = self._result(reply, text, tools, finish, len(prompt_ids), len(gen.tokens))
        result.speculative = {"steps": gen.steps, "tokens": sum(gen.produced)}
        return result

    def _result(self, reply: str, prompt_text: str, tools: list[Tool] | None, finish: str, n_prompt: int,
                n_out: int) -> ChatResult:
        message: dict[str, Any] = {"role": "assistant"}
        content, reasoning = reply, None
        if self.enable_thinking:
            opened = prompt_text.rstrip().endswith(self.think_start)
            reasoning, content = split_reasoning(reply, self.think_start, self.think_end, opened)
        content, calls = split_tool_calls(content, tools)
        message["content"] = content
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = calls
            finish = "tool_calls" if finish == "stop" else finish  # as the server reports a reply that calls tools
        return ChatResult(message=message, finish_reason=finish,
                          usage={"prompt_tokens": n_prompt, "completion_tokens": n_out}, engine=self.engine)


def local_engine() -> dict[str, str]:
    """What computes the replies in-process, recorded on every one: transformers and torch, by version."""
    import torch
    import transformers

    return {"name": "transformers", "version": transformers.__version__, "torch": torch.__version__}
