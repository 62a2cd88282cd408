"""The embedded target: a tiny Qwen3-architecture causal LM trained on the CPU from the sample conversations.

It stands in for a real Qwen3 checkpoint so that the whole pipeline runs on a laptop: it is saved with
``save_pretrained`` (config.json, model.safetensors, tokenizer files, chat template) and every later stage loads it
with ``AutoTokenizer`` / ``AutoModelForCausalLM`` exactly as it would load Qwen3. Training is plain next-token
prediction over whole rendered conversations, packed into fixed-length rows, every source an equal share of rows.

Held out: per source, a fixed hash-ranked few conversations are never trained on; their prompts are answered
greedily after training and scored (runaway replies, well-formed tool calls) in the stage's metrics, so what the
target learnt is measured on prompts it has not seen.

Determinism: one seed drives initialisation and batch order, the thread count is fixed (float reductions
are ordered by it) and torch runs in deterministic mode, so the same params on the same machine and library
versions give byte-identical weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xxhash
from tqdm import tqdm
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from draftline.core.chat import render
from draftline.core.logs import get_logger
from draftline.core.records import Conversation
from draftline.core.skips import Skips
from draftline.core.threads import torch_threads
from draftline.core.tool_calls import split_tool_calls
from draftline.target.embedded.params import EmbeddedParams
from draftline.target.embedded.tokenizer import EOS, PAD, render_corpus, train_tokenizer

log = get_logger("target.embedded")


@dataclass
class EmbeddedBuild:
    """What a build reports: metrics, the loss curve (one row per step) and the greedy replies to the held-out prompts."""

    metrics: dict[str, Any]
    loss_curve: list[dict[str, Any]]
    samples: list[dict[str, Any]]


IGNORE = -100  # label of padding: no loss


def _pack(token_lists: list[list[int]], sep_id: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate documents, each followed by ``sep_id`` (Qwen's document separator), into rows of ``seq_len``.

    Returns ``(input_ids, labels)``; the last row is padded with ``sep_id`` and labelled ``IGNORE``, so no token
    is dropped and a source smaller than one row still trains.
    """
    flat = [t for ids in token_lists for t in (*ids, sep_id)]
    n_rows = -(-len(flat) // seq_len)
    ids = torch.full((n_rows * seq_len,), sep_id, dtype=torch.long)
    labels = torch.full((n_rows * seq_len,), IGNORE, dtype=torch.long)
    ids[: len(flat)] = labels[: len(flat)] = torch.tensor(flat, dtype=torch.long)
    return ids.view(n_rows, seq_len), labels.view(n_rows, seq_len)


class _BalancedBatches:
    """Batches in which every source is equally likely, whatever its size in tokens.

    The sample sources differ tenfold in tokens per conversation (tool schemas repeated in every system prompt),
    and a tiny model trained for well under an epoch would otherwise spend most steps on the few long ones.
    Each slot draws a source uniformly, then the next row of that source's own reshuffled queue.
    """

    def __init__(self, packed: dict[str, tuple[torch.Tensor, torch.Tensor]], batch_size: int, seed: int):
        self.packed, self.names, self.batch_size = packed, sorted(packed), batch_size
        self.gen = torch.Generator().manual_seed(seed)
        self.queues: dict[str, list[int]] = {n: [] for n in self.names}

    def _next_row(self, name: str) -> int:
        if not self.queues[name]:  # reshuffle at each pass over the source
            self.queues[name] = torch.randperm(len(self.packed[name][0]), generator=self.gen).tolist()
        return self.queues[name].pop()

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        picks = torch.randint(len(self.names), (self.batch_size,), generator=self.gen).tolist()
        rows = [(self.names[i], self._next_row(self.names[i])) for i in picks]
        ids = torch.stack([self.packed[n][0][r] for n, r in rows])
        labels = torch.stack([self.packed[n][1][r] for n, r in rows])
        return ids, labels


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


def _lr_at(step: int, spec: EmbeddedParams) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    progress = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    return spec.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def _train(model: Qwen3ForCausalLM, batches: _BalancedBatches, spec: EmbeddedParams) -> list[dict[str, Any]]:
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.1)
    curve = []
    model.train()
    for step in tqdm(range(spec.steps), desc="target: training", unit="step"):
        ids, labels = batches.next()
        lr = _lr_at(step, spec)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        curve.append({"step": step + 1, "loss": round(loss.item(), 5), "lr": round(lr, 8)})
    return curve


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


def build_embedded_target(
    conversations: Iterable[Conversation], out_dir: str | Path, spec: EmbeddedParams, seed: int, skips: Skips
) -> EmbeddedBuild:
    """Train the tokenizer and the model on ``conversations`` and save both, Hugging Face style, to ``out_dir``."""
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    pairs = list(render_corpus(conversations, skips))
    if not pairs:
        raise ValueError("the embedded target has no conversations to learn from; check the sources and their adapters")
    kept, texts = [c for c, _ in pairs], [t for _, t in pairs]
    # The vocabulary is learnt from every conversation (a real tokenizer has seen any text); the model is not.
    tok = train_tokenizer(texts, spec.vocab_size, spec.max_position_embeddings)
    sep = tok.convert_tokens_to_ids(PAD)
    held = held_out(kept, spec.held_out)
    by_source: dict[str, list[list[int]]] = {}
    for conv, ids in zip(kept, tok(texts, add_special_tokens=False).input_ids):
        if (conv.source, conv.row) not in held:
            by_source.setdefault(conv.source, []).append(ids)
    packed = {name: _pack(docs, sep, spec.seq_len) for name, docs in by_source.items()}
    corpus_tokens = sum(int((labels != IGNORE).sum()) for _, labels in packed.values())
    log.info("corpus: %d conversations, %d tokens, %d sources", len(texts), corpus_tokens, len(packed))

    with torch_threads(spec.threads, deterministic=True):
        torch.manual_seed(seed)
        config = _model_config(spec, tok)
        model = Qwen3ForCausalLM(config)
        model.generation_config = GenerationConfig(
            eos_token_id=[config.eos_token_id, config.pad_token_id], pad_token_id=config.pad_token_id,
            bos_token_id=config.bos_token_id,
        )
        t_train = time.perf_counter()
        curve = _train(model, _BalancedBatches(packed, spec.batch_size, seed), spec)
        train_s = time.perf_counter() - t_train
        samples = _greedy_held_out(model, tok, [c for c in kept if (c.source, c.row) in held], spec)

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    trained_tokens = spec.steps * spec.batch_size * spec.seq_len
    last = curve[-min(10, len(curve)):]
    metrics = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus_conversations": len(texts) - len(held),
        "held_out": held_out_rates(samples),
        "corpus_tokens": corpus_tokens,
        "epochs": round(trained_tokens / corpus_tokens, 3),
        "train_tokens": trained_tokens,
        "first_loss": curve[0]["loss"],
        "final_loss": round(sum(r["loss"] for r in last) / len(last), 4),
        "train_s": round(train_s, 1),
        "tokens_per_s": round(trained_tokens / train_s),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    return EmbeddedBuild(metrics=metrics, loss_curve=curve, samples=samples)
