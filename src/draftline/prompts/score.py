"""A prompt's difficulty for a drafter: its acceptance teacher-forced along the prompt's dataset answer.

For one candidate, the prompt (rendered as generation will send it) and its dataset answer (``reference``) are
encoded; one target forward over both gives the drafter's features and the target's own choice (argmax) at every
position. At ``anchors`` positions spread evenly over the answer, the drafter drafts a block from the answer's prefix
exactly as it does in decoding (the context's features, the anchor's token opening the block, the block's mask
positions drafted), and the block's accepted length is how many of its leading drafts equal the target's choices
there. The score is the mean over anchors of accepted + 1: tokens per verification step, the unit of z-lab's
acceptance, had the target written that answer. Low is hard: the drafter fails there.

Why a proxy: the evaluate stage's acceptance needs the target to generate (one forward per step); this needs one
forward per candidate, batched, so many more candidates can be scored than are generated. Where a draft departs
from the answer, the target's later choices are still those along the answer (teacher forcing), so the score is an
estimate; ``docs/prompts.md`` reports how well it ranks prompts by the acceptance the evaluate stage measures.

Invariants: nothing is random (anchors are evenly spaced, batches formed in a fixed order), so the same drafter,
target and candidates give the same scores on one machine. A candidate without a usable answer (none, or under two
tokens) gets no score and is counted, never guessed here. Scores are cached (:class:`ScoreCache`) under a key of
everything that decides them; each cache file carries the checksum of its own content, and one that does not match
is counted and rescored, never read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xxhash
from tqdm import tqdm

from draftline.core.chat import render
from draftline.core.files import atomic_path
from draftline.core.jsonl import dumps
from draftline.core.records import PromptRecord
from draftline.drafter.decoding import Draft, DraftContext, Proposer
from draftline.drafter.model import target_features


@dataclass(frozen=True)
class Window:
    """What one candidate scores on: prompt + answer ids (at most ``max_tokens``) and where the answer starts."""

    key: str  # the cache key: the prompt's id and its answer's digest
    ids: list[int]
    start: int


def candidate_key(record: PromptRecord) -> str:
    """A prompt's id (a digest of its messages and tools) with its answer's: what one score is for."""
    return f"{record.id}:{xxhash.xxh3_64_hexdigest((record.reference or '').encode('utf-8'))}"


def window(record: PromptRecord, tokenizer: Any, enable_thinking: bool | None, max_tokens: int) -> Window | None:
    """The ids a candidate is scored on, or None when its answer is missing or under two tokens. The answer keeps
    its first ``max_tokens // 2`` tokens, the prompt its last tokens in what is left (a long system prompt costs a
    forward without changing where the drafter fails much)."""
    if not record.reference:
        return None
    answer = tokenizer(record.reference, add_special_tokens=False)["input_ids"][: max_tokens // 2]
    if len(answer) < 2:
        return None
    text = render(tokenizer, record.messages, record.tools, enable_thinking=enable_thinking, generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"][-(max_tokens - len(answer)):]
    return Window(candidate_key(record), prompt + answer, len(prompt))


def anchor_positions(start: int, length: int, count: int) -> list[int]:
    """Up to ``count`` distinct anchors spread evenly over the answer: a block opened by the token at ``a`` drafts
    ``a + 1`` on, so ``a`` runs from the answer's first token to its second-to-last."""
    span = length - 1 - start
    k = min(count, span)
    return [start + (i * span) // k for i in range(k)] if k > 0 else []


def leading_matches(drafts: torch.Tensor, choices: torch.Tensor) -> int:
    """How many of ``drafts`` equal ``choices`` before the first that does not (greedy verification's rule)."""
    n = min(len(drafts), len(choices))
    miss = (drafts[:n] != choices[:n]).nonzero()
    return int(miss[0, 0]) if len(miss) else n


def score_window(proposer: Proposer, ids: torch.Tensor, features: torch.Tensor | None, choices: torch.Tensor,
                 anchors: Sequence[int]) -> float:
    """The mean over ``anchors`` of (accepted + 1): ``choices[p]`` is the target's choice for position ``p + 1``,
    ``features`` the drafter's features of every position (None for a proposer that reads none)."""
    proposer.reset()
    total, fed = 0, 0
    for a in anchors:
        ctx = DraftContext(tokens=ids[: a + 1], hidden=None if features is None else features[:a], new=a - fed)
        draft = proposer.propose(ctx)
        tokens = draft.tokens if isinstance(draft, Draft) else draft
        total += leading_matches(tokens, choices[a : len(ids) - 1]) + 1
        fed = a
    return total / len(anchors)


def batches(windows: Sequence[Window], batch_tokens: int) -> Iterator[list[Window]]:
    """Windows longest first, in batches whose padded size (rows x longest) stays within ``batch_tokens``."""
    todo = sorted(windows, key=lambda w: (-len(w.ids), w.key))
    batch: list[Window] = []
    for w in todo:
        if batch and (len(batch) + 1) * len(batch[0].ids) > batch_tokens:
            yield batch
            batch = []
        batch.append(w)
    if batch:
        yield batch


@torch.no_grad()
def target_pass(target: Any, batch: Sequence[Window], layer_ids: Sequence[int],
                chunk: int = 256) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
    """One target forward over a right-padded batch: per window its ids, the drafter's features and the target's
    choices. The lm_head runs on ``chunk`` positions at a time, so a 150K vocabulary never makes a
    [batch, length, vocab] tensor."""
    device = target.get_input_embeddings().weight.device
    longest = len(batch[0].ids)
    ids = torch.zeros(len(batch), longest, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for i, w in enumerate(batch):
        ids[i, : len(w.ids)] = torch.tensor(w.ids)
        mask[i, : len(w.ids)] = 1
    decoder = target.get_decoder() if hasattr(target, "get_decoder") else target
    out = decoder(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    features = target_features(out.hidden_states, list(layer_ids)) if layer_ids else None
    head = target.get_output_embeddings()
    rows = []
    for i, w in enumerate(batch):
        n = len(w.ids)
        final = out.hidden_states[-1][i, :n]
        choices = torch.cat([head(final[s : s + chunk]).argmax(dim=-1) for s in range(0, n, chunk)])
        rows.append((ids[i, :n], None if features is None else features[i, :n], choices))
    return rows


class ScoreCache:
    """Scores already computed, in ``folder`` (one folder per key of everything that decides a score): files of
    ``{"scores": {candidate key: score}, "xxh3": <digest of the scores' encoding>}``, each written whole (atomic)
    after its batch, so a killed run keeps every finished batch. A file that does not parse or whose digest does not
    match is counted in ``damaged`` and its candidates scored again."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.damaged = 0  # files not read (bad JSON or checksum): their candidates are scored again
        self.computed = 0  # scores saved by this process

    def load(self) -> dict[str, float]:
        scores: dict[str, float] = {}
        for path in sorted(self.folder.glob("scores-*.json")):
            try:
                entry = json.loads(path.read_text(encoding="utf-8"))
                ok = entry["xxh3"] == xxhash.xxh3_64_hexdigest(dumps(entry["scores"]).encode("utf-8"))
            except (ValueError, KeyError, TypeError):
                ok = False
            if ok:
                scores.update(entry["scores"])
            else:
                self.damaged += 1
        return scores

    def save(self, scores: dict[str, float]) -> None:
        body = dumps(scores)
        digest = xxhash.xxh3_64_hexdigest(body.encode("utf-8"))
        self.folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.folder / f"scores-{digest}.json", "the score cache") as tmp:
            tmp.write_text(dumps({"scores": scores, "xxh3": digest}), encoding="utf-8")
        self.computed += len(scores)


def score_windows(target: Any, proposer: Proposer, windows: Sequence[Window], anchors: int, batch_tokens: int,
                  cache: ScoreCache) -> dict[str, float]:
    """Every window's score (:func:`score_window`), reading ``cache`` first and saving each new batch to it."""
    scores = cache.load()
    todo = [w for w in windows if w.key not in scores]
    with tqdm(total=len(todo), desc="scoring candidates", unit=" prompts", mininterval=2.0) as bar:
        for batch in batches(todo, batch_tokens):
            new = {}
            for w, (ids, features, choices) in zip(batch, target_pass(target, batch, proposer.target_layer_ids)):
                new[w.key] = round(score_window(proposer, ids, features, choices,
                                                anchor_positions(w.start, len(w.ids), anchors)), 6)
            cache.save(new)
            scores.update(new)
            bar.update(len(batch))
    return {w.key: scores[w.key] for w in windows}
