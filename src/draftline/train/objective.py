"""One training forward: random blocks on the frozen target's features, and the decayed block cross-entropy."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from draftline.drafter.model import DFlashDrafter, target_features
from draftline.drafter.modeling_dflash import FULL
from draftline.train.anchors import sample_anchors
from draftline.train.data import Batch
from draftline.train.masks import block_gather, block_inputs, block_mask, block_positions, block_targets


@torch.no_grad()
def capture_features(target: nn.Module, batch: Batch, layer_ids: list[int],
                     next_ids: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target's hidden states of the chosen layers, computed online: ``[b, s, len(layer_ids) * hidden]``; with
    ``next_ids``, also the target's own greedy next token at every position ``[b, s]`` (int32; DFlash 2's selector
    labels under ``selector_labels: target``), else None.

    Runs the target's decoder only; the lm_head (whose logits would be the largest tensor of the pass) only for
    ``next_ids``, over ``HEAD_CHUNK`` positions at a time, keeping just their argmax.
    """
    decoder = target.get_decoder() if hasattr(target, "get_decoder") else target
    # No attention mask: the rows are right-padded and the target causal, so no real token attends to a pad and the
    # decoder runs its causal kernel unmasked (a padded row's real positions get what the row alone gets).
    out = decoder(input_ids=batch.input_ids, output_hidden_states=True, use_cache=False)
    features = target_features(out.hidden_states, layer_ids)
    if not next_ids:
        return features, None
    head = target.get_output_embeddings()
    final = out.hidden_states[-1]  # after the final norm: what the lm_head reads
    return features, torch.cat([head(c).argmax(-1).int() for c in final.split(HEAD_CHUNK, dim=1)], dim=1)


HEAD_CHUNK = 256  # positions per lm_head call: 256 x a 152K vocabulary x 4 bytes is 155 MB of logits per row


def block_masks(drafter: DFlashDrafter, anchors: torch.Tensor, keep: torch.Tensor, context_len: int):
    """The training block mask of each layer type the drafter has: one tensor when every layer is full attention,
    else ``{layer type: mask}`` (a sliding layer's is causal and windowed as its attention is)."""
    masks = {}
    for layer in drafter.layers:
        attn = layer.self_attn
        if attn.layer_type not in masks:
            masks[attn.layer_type] = block_mask(anchors, keep, context_len, drafter.block_size,
                                                causal=attn.is_causal, window=attn.sliding_window)
    return masks[FULL] if set(masks) == {FULL} else masks


@dataclass
class StepStats:
    loss: torch.Tensor  # weighted mean cross-entropy (has grad), plus the weighted selector loss (DFlash 2)
    correct: torch.Tensor  # [B] argmax hits per block position (position 0 unused)
    counted: torch.Tensor  # [B] supervised labels per block position
    # DFlash 2: [selector loss, gold in the top K, selector picks the gold, labels], zeros for DFlash 1
    selector: torch.Tensor | None = None


def dflash_loss(
    drafter: nn.Module,
    features: torch.Tensor,
    batch: Batch,
    *,
    anchors_per_seq: int,
    gamma: float,
    generator: torch.Generator,
    selector_weight: float = 0.0,
    gold_outside_top_k: str = "drop",
    target_next: torch.Tensor | None = None,
) -> StepStats:
    """The DFlash objective on one batch, given the target's ``features`` of it (:func:`capture_features`).

    DFlash 2's selector learns to pick the data's token, or with ``target_next`` (the target's greedy next token at
    every position, ``[b, s]``) the target's own choice at that position.

    ``drafter`` may be DDP-wrapped; ``drafter_module`` below is the bare :class:`DFlashDrafter`. Logits are only
    computed where a label has weight, which keeps the vocabulary-sized tensor as small as it can be.
    """
    core: DFlashDrafter = getattr(drafter, "module", drafter)
    B = core.block_size
    anchors, keep = sample_anchors(batch.loss_mask, anchors_per_seq, generator)
    s = batch.input_ids.shape[1]
    ids = block_inputs(batch.input_ids, anchors, core.mask_token_id, B)
    ctx_positions = torch.arange(s, device=ids.device).expand(ids.shape[0], s)
    positions = torch.cat([ctx_positions, block_positions(anchors, B)], dim=1)
    hidden = drafter(position_ids=positions, attention_mask=block_masks(core, anchors, keep, s),
                     noise_embedding=core.embed(ids), target_hidden=features)
    labels, weights = block_targets(batch.input_ids, batch.loss_mask, anchors, keep, B, gamma)
    used = weights.flatten() > 0
    logits = core.logits(hidden.reshape(-1, hidden.shape[-1])[used]).float()
    target_ids = labels.flatten()[used]
    w = weights.flatten()[used]
    loss = (F.cross_entropy(logits, target_ids, reduction="none") * w).sum() / w.sum()
    with torch.no_grad():
        pos = torch.arange(B, device=ids.device).repeat(labels.numel() // B)[used]
        hit = (logits.argmax(-1) == target_ids).float()
        correct = torch.zeros(B, device=ids.device).index_add_(0, pos, hit)
        counted = torch.zeros(B, device=ids.device).index_add_(0, pos, torch.ones_like(hit))
    selector = torch.zeros(4, device=ids.device)
    if core.candidate_selector is not None:
        # The token before each label: the anchor at block position 1, the previous label after it (teacher forcing).
        previous = torch.cat([labels[..., :1], labels[..., :-1]], dim=-1).flatten()[used]
        h = hidden.reshape(-1, hidden.shape[-1])[used]
        gold = target_ids
        if target_next is not None:
            # The target's choice for token j is its greedy prediction from position j - 1.
            shifted = torch.cat([target_next[:, :1], target_next[:, :-1]], dim=1)
            gold = block_gather(shifted, anchors, B).flatten()[used].long()
        sel_loss, selector = selector_loss(core, h, logits, previous, gold, w, gold_outside_top_k)
        loss = loss + selector_weight * sel_loss
    return StepStats(loss, correct, counted, selector)


def selector_loss(core: DFlashDrafter, hidden: torch.Tensor, logits: torch.Tensor, previous: torch.Tensor,
                  gold: torch.Tensor, weights: torch.Tensor,
                  gold_outside_top_k: str) -> tuple[torch.Tensor, torch.Tensor]:
    """DFlash 2's selector objective: a K-way cross-entropy over each position's top-K candidates, the gold token's
    index the label, weighted by the block position's weight.

    The drafter's hidden states and logits enter detached: the block loss alone trains the layers (and the
    convolutions), the selector loss trains the selector, so a warm-started DFlash 2 drafter's layers learn what a
    DFlash 1 drafter's would. A gold token outside the top K is dropped (no selector loss there) or inserted in place
    of the K-th candidate (``gold_outside_top_k``). Returns the loss and ``[loss, gold in top K, selector picks gold,
    labels]`` (sums over the batch, for the loss curve)."""
    selector = core.candidate_selector
    hidden, logits = hidden.detach(), logits.detach()
    unary, candidates = selector.candidates(logits)
    is_gold = candidates == gold[:, None]
    in_top = is_gold.any(-1)
    label = is_gold.float().argmax(-1)
    keep = in_top
    if gold_outside_top_k == "insert":
        last = selector.top_k - 1
        out = ~in_top
        candidates[out, last] = gold[out]
        unary[out, last] = logits[out].gather(-1, gold[out, None])[:, 0]
        label = torch.where(in_top, label, torch.full_like(label, last))
        keep = torch.ones_like(in_top)
    scores = selector.scores(selector.hidden_projection(hidden), previous, candidates, unary).float()
    w = weights * keep.float()
    ce = F.cross_entropy(scores, label, reduction="none")
    loss = (ce * w).sum() / w.sum().clamp_min(1e-9)
    with torch.no_grad():
        picks = (scores.argmax(-1) == label) & in_top
        stats = torch.stack([loss.detach(), in_top.float().sum(), picks.float().sum(),
                             torch.tensor(float(len(gold)), device=gold.device)])
    return loss, stats
