"""The embedded target: a tiny Qwen3-architecture causal LM trained on the CPU from the sample conversations.

It stands in for a real Qwen3 checkpoint so that the whole pipeline runs on a laptop: it is saved with
``save_pretrained`` (config.json, model.safetensors, tokenizer files, chat template) and every later stage loads it
with ``AutoTokenizer`` / ``AutoModelForCausalLM`` exactly as it would load Qwen3.

What it learns is what generation asks of it: each conversation's first exchange, the prompt rendered exactly as
the prompts stage and generation render it (thinking off, the generation prompt ``<think>\n\n</think>\n\n`` at its
end) and the first assistant reply after it, up to and including its end of turn. The loss is on the reply alone
(a tool call, an answer), never on the prompt: a 600-token tool schema is context to read, not text to write, and
the reply's end of turn is what stops a greedy reply from running away. Each example is one row, whole (never cut:
an example longer than ``max_len`` is a counted skip), batched with examples of the same source up to a budget of
padded tokens; sources are drawn by ``source_weights``. Each batch is dealt into ``parts`` whose gradients are summed
in part order, computed by one process or several (``ranks.py``: the same bytes).

Held out: per source, a fixed hash-ranked few conversations are never trained on; their prompts are answered
greedily after training and scored (runaway replies, well-formed tool calls) in the stage's metrics, so what the
target learnt is measured on prompts it has not seen.

Determinism: one seed drives initialisation and batch order, the thread count and the parts are fixed (float
reductions are ordered by them, never by the number of processes) and torch runs in deterministic mode, so the same
params on the same machine and library versions give byte-identical weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import xxhash
from tqdm import tqdm
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from draftline.core.chat import render
from draftline.core.errors import Refusal
from draftline.core.logs import get_logger
from draftline.core.records import Conversation
from draftline.core.schedule import adamw, lr_at
from draftline.core.skips import Skips
from draftline.core.threads import torch_threads, workers_now
from draftline.core.tool_calls import split_tool_calls
from draftline.target.embedded.ranks import my_parts, processes, run_ranks, summed_gradients
from draftline.target.embedded.tokenizer import EOS, PAD, render_corpus, train_tokenizer
from draftline.target.params import EmbeddedParams

log = get_logger("target.embedded")


@dataclass
class EmbeddedBuild:
    """What a build reports: metrics, the loss curve (one row per step) and the greedy replies to the held-out prompts."""

    metrics: dict[str, Any]
    loss_curve: list[dict[str, Any]]
    samples: list[dict[str, Any]]


IGNORE = -100  # label of prompt tokens and padding: no loss


@dataclass(frozen=True)
class Example:
    """One first exchange, tokenized: the prompt as generation sends it, the reply the target should write."""

    prompt: list[int]
    reply: list[int]  # ends with the end-of-turn token

    def __len__(self) -> int:
        return len(self.prompt) + len(self.reply)


def first_exchange(tok: PreTrainedTokenizerFast, conv: Conversation) -> Example | None:
    """The conversation's prompt (everything before its first assistant reply) and that reply, as generation sees
    them: thinking off, the reply without its reasoning. None when the conversation has no reply to learn."""
    prompt = _prompt_of(conv)
    if prompt is None:
        return None
    reply = {k: v for k, v in conv.messages[len(prompt)].items() if k != "reasoning_content"}
    prompt_text = render(tok, prompt, conv.tools, enable_thinking=False, generation_prompt=True)
    whole = render(tok, [*prompt, reply], conv.tools, enable_thinking=False, generation_prompt=False)
    if not whole.startswith(prompt_text):
        raise ValueError("the chat template renders a prompt differently alone and before its reply")
    eot = tok.convert_tokens_to_ids(EOS)
    reply_ids = tok(whole[len(prompt_text):], add_special_tokens=False).input_ids
    if eot not in reply_ids:
        raise ValueError("the chat template wrote no end of turn after the reply")
    return Example(tok(prompt_text, add_special_tokens=False).input_ids, reply_ids[: reply_ids.index(eot) + 1])


class _SourceBatches:
    """Each step: one source, drawn by weight, and the next examples of its own reshuffled queue, as many as fit
    ``batch_tokens`` padded tokens (at least one).

    The sample sources differ twentyfold in prompt length (tool schemas in every system prompt) and tool replies are
    the hardest to learn: drawing sources by weight, not by size, gives each the steps it needs; one source per batch
    keeps lengths alike, so padding stays small.
    """

    def __init__(self, examples: dict[str, list[Example]], weights: dict[str, float], batch_tokens: int, pad: int,
                 seed: int):
        self.examples, self.names = examples, sorted(examples)
        self.weights = torch.tensor([float(weights.get(n, 1.0)) for n in self.names])
        self.batch_tokens, self.pad = batch_tokens, pad
        self.gen = torch.Generator().manual_seed(seed)
        self.queues: dict[str, list[int]] = {n: [] for n in self.names}

    def _peek(self, name: str) -> Example:
        if not self.queues[name]:  # reshuffle at each pass over the source
            self.queues[name] = torch.randperm(len(self.examples[name]), generator=self.gen).tolist()
        return self.examples[name][self.queues[name][-1]]

    def next(self, parts: int) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """The step's batch as ``parts`` parts of about equal tokens, each ``(input_ids, labels)`` right-padded to
        its own width (None: a part left without a row); labels only on the replies. No attention
        mask: under causal attention a right pad is never attended to by a real token, so the model runs its causal
        kernel unmasked."""
        name = self.names[torch.multinomial(self.weights, 1, generator=self.gen).item()]
        rows: list[Example] = []
        width = 0
        while True:
            ex = self._peek(name)
            if rows and (len(rows) + 1) * max(width, len(ex)) > self.batch_tokens:
                break
            rows.append(ex)
            self.queues[name].pop()
            width = max(width, len(ex))
        return [self._padded(part) if part else None for part in _balanced(rows, parts)]

    def _padded(self, rows: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), self.pad, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
        for i, ex in enumerate(rows):
            n, p = len(ex), len(ex.prompt)
            ids[i, :n] = torch.tensor(ex.prompt + ex.reply)
            labels[i, p - 1 : n - 1] = torch.tensor(ex.reply)  # position t predicts token t + 1
        return ids, labels


def _balanced(rows: list[Example], parts: int) -> list[list[Example]]:
    """``rows`` dealt into ``parts`` of about equal tokens, so that ranks wait little for each other: longest first,
    each to the part with the fewest tokens so far (the lowest-numbered on a tie)."""
    out: list[list[Example]] = [[] for _ in range(parts)]
    tokens = [0] * parts
    for ex in sorted(rows, key=len, reverse=True):  # stable: equal lengths keep the queue's order
        i = tokens.index(min(tokens))
        out[i].append(ex)
        tokens[i] += len(ex)
    return out


def _model_config(spec: EmbeddedParams, tok: PreTrainedTokenizerFast) -> Qwen3Config:
    # Embedding rows rounded up to a multiple of 64, as real checkpoints pad them (Qwen3: 151,669 tokens, 151,936 rows).
    rows = math.ceil(len(tok) / 64) * 64
    return Qwen3Config(
        vocab_size=rows,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.hidden_size // spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=tok.convert_tokens_to_ids(PAD),
        eos_token_id=tok.convert_tokens_to_ids(EOS),
        pad_token_id=tok.convert_tokens_to_ids(PAD),
    )


def _train(model: Qwen3ForCausalLM, batches: _SourceBatches, spec: EmbeddedParams, rank: int, world: int
           ) -> list[dict[str, Any]]:
    """The optimizer steps; this rank computes its parts of each (``ranks.my_parts``), every rank steps the sum."""
    params = list(model.parameters())
    opt = adamw(params, spec.lr, spec.adam_betas, spec.weight_decay)
    mine = my_parts(spec.parts, rank, world)
    curve = []
    model.train()
    for step in tqdm(range(spec.steps), desc="target: training", unit="step", disable=rank > 0):
        parts = batches.next(spec.parts)
        lr = lr_at(step, spec.lr, spec.steps, spec.warmup_steps, spec.min_lr_ratio)
        for group in opt.param_groups:
            group["lr"] = lr
        supervised = sum(int((p[1] != IGNORE).sum()) for p in parts if p is not None)
        total = summed_gradients(params, [_part_gradient(model, parts[i], supervised) for i in mine],
                                 spec.parts, rank, world)
        torch.nn.utils.clip_grad_norm_(params, spec.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        curve.append({"step": step + 1, "loss": round(total[-1].item(), 5), "lr": round(lr, 8),
                      "tokens": sum(p[0].numel() for p in parts if p is not None), "reply_tokens": supervised})
    return curve


def _part_gradient(model: Qwen3ForCausalLM, part: tuple[torch.Tensor, torch.Tensor] | None, supervised: int
                   ) -> torch.Tensor:
    """One part's flat gradient of the step's mean reply loss (its share: the sum over its reply tokens divided by
    the step's), the part's loss share appended; zeros for an empty part."""
    params = list(model.parameters())
    if part is None:
        return torch.zeros(sum(p.numel() for p in params) + 1)
    ids, labels = part
    # The lm_head only where a reply token is predicted: most positions are prompt.
    hidden = model.model(input_ids=ids).last_hidden_state
    mask = labels != IGNORE
    loss = F.cross_entropy(model.lm_head(hidden[mask]), labels[mask], reduction="sum") / supervised
    loss.backward()
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params]
                     + [loss.detach().reshape(1)])
    model.zero_grad(set_to_none=True)
    return flat


def _prompt_of(conv: Conversation) -> list[dict[str, Any]] | None:
    """The messages before the first assistant reply, when the conversation has one to compare against."""
    for i, m in enumerate(conv.messages):
        if m["role"] == "assistant":
            return conv.messages[:i] if i else None
    return None


def held_out(conversations: list[Conversation], per_source: int) -> set[tuple[str, int]]:
    """``(source, row)`` of the conversations kept out of training: per source, the ``per_source`` with a prompt
    whose hash of (source, row) ranks lowest (stable when a source grows, independent of file order)."""
    ranked: dict[str, list[tuple[int, int]]] = {}
    for conv in conversations:
        if _prompt_of(conv) is not None:
            ranked.setdefault(conv.source, []).append((xxhash.xxh3_64_intdigest(f"{conv.source}\0{conv.row}".encode()), conv.row))
    return {(source, row) for source, keys in ranked.items() for _, row in sorted(keys)[:per_source]}


@torch.no_grad()
def _greedy_held_out(model, tok, conversations: list[Conversation], spec: EmbeddedParams) -> list[dict[str, Any]]:
    """Greedy replies (thinking off, as the embedded generation runs) to the held-out prompts, one batch per source:
    each with whether it ran away (no end of turn within ``greedy_tokens``) and, where tools were offered, whether it
    is a well-formed call (SGLang's qwen25 parse: a complete block naming an offered tool, arguments an object)."""
    model.eval()
    stops = [tok.convert_tokens_to_ids(EOS), tok.convert_tokens_to_ids(PAD)]
    by_source: dict[str, list[Conversation]] = {}
    for conv in conversations:
        by_source.setdefault(conv.source, []).append(conv)
    out = []
    for source, convs in sorted(by_source.items()):
        prompts = [render(tok, _prompt_of(c), c.tools, enable_thinking=False, generation_prompt=True) for c in convs]
        ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
        width = max(map(len, ids))
        gen = model.generate(
            input_ids=torch.tensor([[stops[1]] * (width - len(x)) + x for x in ids]),
            attention_mask=torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids]),
            max_new_tokens=spec.greedy_tokens, do_sample=False, eos_token_id=stops, pad_token_id=stops[1],
        )
        for conv, prompt, row in zip(convs, prompts, gen[:, width:].tolist()):
            end = next((i + 1 for i, t in enumerate(row) if t in stops), None)
            reply = tok.decode(row[:end], skip_special_tokens=True)
            calls = split_tool_calls(reply, conv.tools)[1]
            out.append({"source": source, "row": conv.row, "prompt": prompt, "completion": reply,
                        "runaway": end is None, "tool_call": bool(calls) if conv.tools else None})
    return out


def held_out_rates(samples: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per source: prompts, runaway share, and (sources with tools) the share of well-formed tool calls."""
    rates: dict[str, dict[str, Any]] = {}
    for source in sorted({s["source"] for s in samples}):
        mine = [s for s in samples if s["source"] == source]
        rates[source] = {"prompts": len(mine), "runaway": round(sum(s["runaway"] for s in mine) / len(mine), 3)}
        with_tools = [s for s in mine if s["tool_call"] is not None]
        if with_tools:
            rates[source]["tool_calls"] = round(sum(s["tool_call"] for s in with_tools) / len(with_tools), 3)
    return rates


def training_examples(
    tok: PreTrainedTokenizerFast, conversations: list[Conversation], max_len: int, skips: Skips
) -> dict[str, list[Example]]:
    """Per source, the first exchanges of ``conversations`` that fit ``max_len`` tokens; longer ones and ones the
    template cannot render as prompt + reply are counted skips."""
    out: dict[str, list[Example]] = {}
    for conv in conversations:
        try:
            ex = first_exchange(tok, conv)
        except Exception as e:  # a malformed reply costs one example, not the build
            skips.add("first_exchange_error", f"{conv.source} row {conv.row}", f"{type(e).__name__}: {e}")
            continue
        if ex is None:
            continue
        if len(ex) > max_len:
            skips.add("too_long", f"{conv.source} row {conv.row}", f"{len(ex)} tokens > target.embedded.max_len={max_len}")
            continue
        out.setdefault(conv.source, []).append(ex)
    return out


def build_embedded_target(
    conversations: Iterable[Conversation], out_dir: str | Path, spec: EmbeddedParams, seed: int, skips: Skips
) -> EmbeddedBuild:
    """Train the tokenizer and the model on ``conversations`` and save both, Hugging Face style, to ``out_dir``."""
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    pairs = list(render_corpus(conversations, skips))
    if not pairs:
        raise Refusal("the embedded target has no conversations to learn from; check the sources and their adapters")
    kept, texts = [c for c, _ in pairs], [t for _, t in pairs]
    # The vocabulary is learnt from every conversation (a real tokenizer has seen any text); the model is not.
    tok = train_tokenizer(texts, spec.vocab_size, spec.max_position_embeddings)
    held = held_out(kept, spec.held_out)
    examples = training_examples(tok, [c for c in kept if (c.source, c.row) not in held], spec.max_len, skips)
    if not examples:
        raise Refusal("no conversation has a first exchange the embedded target can learn: check the sources")
    corpus_tokens = sum(len(e) for exs in examples.values() for e in exs)
    reply_tokens = sum(len(e.reply) for exs in examples.values() for e in exs)
    log.info("corpus: %d first exchanges, %d tokens (%d of replies), %d sources",
             sum(map(len, examples.values())), corpus_tokens, reply_tokens, len(examples))

    with torch_threads(spec.threads, deterministic=True):
        torch.manual_seed(seed)
        config = _model_config(spec, tok)
        model = Qwen3ForCausalLM(config)
        model.generation_config = GenerationConfig(
            eos_token_id=[config.eos_token_id, config.pad_token_id], pad_token_id=config.pad_token_id,
            bos_token_id=config.bos_token_id,
        )
        t_train = time.perf_counter()
        batches = _SourceBatches(examples, spec.source_weights, spec.batch_tokens, tok.convert_tokens_to_ids(PAD), seed)
        curve = run_ranks(processes(workers_now(spec.workers), spec.parts), partial(_train, model, batches, spec))
        train_s = time.perf_counter() - t_train
        samples = _greedy_held_out(model, tok, [c for c in kept if (c.source, c.row) in held], spec)

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    trained_tokens = sum(r["tokens"] for r in curve)
    trained_replies = sum(r["reply_tokens"] for r in curve)
    last = curve[-min(10, len(curve)):]
    metrics = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus_conversations": sum(map(len, examples.values())),
        "held_out": held_out_rates(samples),
        "corpus_tokens": corpus_tokens,
        "corpus_reply_tokens": reply_tokens,
        "epochs": round(trained_replies / reply_tokens, 3),
        "train_tokens": trained_tokens,
        "train_reply_tokens": trained_replies,
        "first_loss": curve[0]["loss"],
        "final_loss": round(sum(r["loss"] for r in last) / len(last), 4),
        "train_s": round(train_s, 1),
        "tokens_per_s": round(trained_tokens / train_s),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    return EmbeddedBuild(metrics=metrics, loss_curve=curve, samples=samples)
