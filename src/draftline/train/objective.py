"""One training forward: random blocks on the frozen target's features of a pack, and the decayed block loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from draftline.drafter.model import DFlashDrafter, target_features
from draftline.drafter.modeling_dflash import FULL
from draftline.train.anchors import sample_anchors
from draftline.train.data import Batch
from draftline.train.greedy import block_chains, greedy_path, path_labels
from draftline.train.masks import block_inputs, block_positions, block_targets, row_masks


@torch.no_grad()
def capture_features(target: nn.Module, input_ids: torch.Tensor, layer_ids: list[int],
                     final: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target's hidden states of the chosen layers over one row ``[1, n]``, computed online: ``[1, n,
    len(layer_ids) * hidden]``; with ``final``, also its last hidden state ``[1, n, hidden]`` (after the final norm:
    what its lm_head reads, so the target's own next-token distribution at every position), else None.

    Runs the target's decoder only: the target's logits are formed later, at the few positions a loss reads.
    """
    decoder = target.get_decoder() if hasattr(target, "get_decoder") else target
    out = decoder(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    return target_features(out.hidden_states, layer_ids), (out.hidden_states[-1] if final else None)


def pack_features(target: nn.Module, batch: Batch, layer_ids: list[int],
                  final: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`capture_features` of a pack: each row run alone (the target never sees another row, and a row's
    features do not depend on the rows it is packed with), laid end to end as the pack is."""
    lengths = torch.bincount(batch.row_of[0]).tolist()
    parts = [capture_features(target, ids, layer_ids, final) for ids in batch.input_ids.split(lengths, dim=1)]
    features = torch.cat([f for f, _ in parts], dim=1)
    return features, (torch.cat([h for _, h in parts], dim=1) if final else None)


def block_masks(drafter: DFlashDrafter, anchors: torch.Tensor, starts: torch.Tensor, context_len: int):
    """The training attention of each layer type the drafter has, row by row (:func:`row_masks`): one when every
    layer is full attention, else ``{layer type: masks}`` (a sliding layer's are causal and windowed as its attention
    is)."""
    masks = {}
    for layer in drafter.layers:
        attn = layer.self_attn
        if attn.layer_type not in masks:
            masks[attn.layer_type] = row_masks(anchors, starts, context_len, drafter.block_size,
                                               causal=attn.is_causal, window=attn.sliding_window)
    return masks[FULL] if set(masks) == {FULL} else masks


@dataclass
class StepStats:
    loss: torch.Tensor  # weighted mean cross-entropy (has grad), plus the weighted selector loss (DFlash 2)
    correct: torch.Tensor  # [B] argmax hits per block position (position 0 unused)
    counted: torch.Tensor  # [B] supervised labels per block position
    # DFlash 2: [selector loss, gold in the top K, selector picks the gold, labels], zeros for DFlash 1
    selector: torch.Tensor | None = None


@dataclass(frozen=True)
class SelectorObjective:
    """DFlash 2's selector loss as ``params.yaml: train.dflash2`` sets it (:func:`selector_loss`): its weight this
    step, its label (``data``, ``target`` or ``target_distribution``), with ``target_distribution`` the share of the
    target's argmax mixed into the soft label, what a hard gold token outside the top K does, and whether the loss
    also trains the drafter's layers."""

    weight: float = 0.0
    labels: str = "data"
    argmax_share: float = 0.0
    outside_top_k: str = "drop"
    trains_drafter: bool = False


def draft_blocks(drafter: nn.Module, features: torch.Tensor, batch: Batch, anchors: torch.Tensor) -> torch.Tensor:
    """The drafter's hidden states ``[1, n * B, hidden]`` of the blocks at a pack's sorted ``anchors`` ``[1, n]``:
    each block its anchor token and B - 1 mask tokens at the anchor's positions in its row, seeing its row's context
    before the anchor."""
    core: DFlashDrafter = getattr(drafter, "module", drafter)
    B = core.block_size
    ids = block_inputs(batch.input_ids, anchors, core.mask_token_id, B)
    starts = anchors - batch.positions.gather(1, anchors)
    positions = torch.cat([batch.positions, block_positions(anchors, B, batch.positions)], dim=1)
    return drafter(position_ids=positions, attention_mask=block_masks(core, anchors, starts, batch.input_ids.shape[1]),
                   noise_embedding=core.embed(ids), target_hidden=features)


def dflash_loss(
    drafter: nn.Module,
    features: torch.Tensor,
    batch: Batch,
    *,
    anchors_per_seq: int,
    gamma: float,
    generator: torch.Generator,
    anchors_per_token: bool = False,
    labels: dict[str, float] | None = None,
    target_final: torch.Tensor | None = None,
    selector: SelectorObjective = SelectorObjective(),
    argmax_path: str = "data",
    target_chains: torch.Tensor | None = None,
) -> StepStats:
    """The DFlash objective on one pack, given the target's ``features`` of it (:func:`pack_features`): up to
    ``anchors_per_seq`` blocks per row, or as many in all spread over the pack's candidates (``anchors_per_token``).

    Block position k of anchor a learns token a + k by the sum of three losses, each weighted as ``labels`` says
    (``{name: weight}``; default ``{"data": 1}``): ``data`` (cross-entropy on the data's token), ``target_argmax``
    (on the target's greedy choice there: what greedy verification accepts) and ``target_distribution`` (the KL
    divergence from the target's whole next-token distribution to the drafter's: what verification by rejection
    sampling accepts). The target's choices come from ``target_final``, its last hidden state ``[b, s, hidden]``,
    needed by any loss but ``data``; DFlash 2's selector learns the data's token, the target's greedy choice or the
    target's distribution over its candidates (``selector``). The target's greedy choice (``target_argmax``, a hard
    selector label from the target) follows ``argmax_path`` (:mod:`draftline.train.greedy`): ``data``, its argmax
    after the data's tokens; ``on_greedy_path``, the same only where the data is on its greedy path from the anchor;
    ``greedy``, that path itself (``target_chains`` ``[1, s, >= B - 1]``), the selector's predecessor on it too. A
    soft selector label (``target_distribution``), its argmax share and its counts stay the target's distribution
    after the data's tokens whatever ``argmax_path`` is.

    ``drafter`` may be DDP-wrapped; ``core`` below is the bare :class:`DFlashDrafter`. Logits are only computed
    where a label has weight, which keeps the vocabulary-sized tensors as small as they can be.
    """
    core: DFlashDrafter = getattr(drafter, "module", drafter)
    B = core.block_size
    anchors, keep = sample_anchors(batch.loss_mask, anchors_per_seq, generator, batch.row_of, anchors_per_token)
    s = batch.input_ids.shape[1]
    hidden = draft_blocks(drafter, features, batch, anchors)
    tokens, weights = block_targets(batch.input_ids, batch.loss_mask, anchors, keep, B, gamma, batch.row_of)
    used = weights.flatten() > 0
    h = hidden.reshape(-1, hidden.shape[-1])[used]
    logits = core.logits(h).float()
    w = weights.flatten()[used]
    data_ids = tokens.flatten()[used]
    target_logits = target_choice = None
    if target_final is not None:
        # The target's distribution of token a + k is its output at position a + k - 1.
        at = (anchors[:, :, None] + torch.arange(B, device=anchors.device) - 1).clamp(0, s - 1).flatten(1)
        final = target_final.gather(1, at[:, :, None].expand(-1, -1, target_final.shape[-1]))
        target_logits = core.logits(final.reshape(-1, final.shape[-1])[used]).float()
        target_choice = target_logits.argmax(-1)
    # The argmax of the target's distribution after the data's tokens: a soft label's own choice, whichever path the
    # hard labels follow (its one-hot share and its counts must be of the distribution it is mixed into).
    argmax = target_choice
    on_path = path_previous = None
    if argmax_path == "on_greedy_path" and target_choice is not None:
        on_path = greedy_path(tokens.shape, used, data_ids == target_choice).float()
    elif argmax_path == "greedy" and target_choice is not None:
        target_choice, path_previous = path_labels(block_chains(target_chains, batch.input_ids, anchors, B), used,
                                                   target_choice)
    per_label = block_losses(logits, data_ids, target_logits, target_choice, labels or {"data": 1.0}, on_path)
    loss = (per_label * w).sum() / w.sum()
    label_ids = data_ids if target_choice is None else target_choice
    with torch.no_grad():
        pos = torch.arange(B, device=w.device).repeat(tokens.numel() // B)[used]
        hit = (logits.argmax(-1) == label_ids).float()
        correct = torch.zeros(B, device=w.device).index_add_(0, pos, hit)
        counted = torch.zeros(B, device=w.device).index_add_(0, pos, torch.ones_like(hit))
    selector_stats = torch.zeros(4, device=w.device)
    if core.candidate_selector is not None:
        # The token before each label: the anchor at block position 1, the previous label after it (teacher forcing).
        previous = torch.cat([tokens[..., :1], tokens[..., :-1]], dim=-1).flatten()[used]
        gold = {"data": data_ids, "target": target_choice, "target_distribution": argmax}[selector.labels]
        if path_previous is not None and selector.labels == "target":
            previous = torch.where(path_previous >= 0, path_previous, previous)
        soft = target_logits if selector.labels == "target_distribution" else None
        sel_w = w if on_path is None or selector.labels != "target" else w * on_path
        sel_loss, selector_stats = selector_loss(core, h, logits, previous, gold, sel_w, selector, soft)
        loss = loss + selector.weight * sel_loss
    return StepStats(loss, correct, counted, selector_stats)


def block_losses(logits: torch.Tensor, data_ids: torch.Tensor, target_logits: torch.Tensor | None,
                 target_choice: torch.Tensor | None, weights: dict[str, float],
                 on_path: torch.Tensor | None = None) -> torch.Tensor:
    """Each label's loss ``[labels]``: the weighted sum of the cross-entropy on the data's token, on the target's
    choice (only where ``on_path`` is 1, when given: :func:`greedy_path`), and the KL divergence from the target's
    distribution (weights of 0 cost nothing)."""
    total = torch.zeros(len(data_ids), device=logits.device)
    if weights.get("data", 0.0):
        total = total + weights["data"] * F.cross_entropy(logits, data_ids, reduction="none")
    if weights.get("target_argmax", 0.0):
        argmax = F.cross_entropy(logits, target_choice, reduction="none")
        total = total + weights["target_argmax"] * (argmax if on_path is None else argmax * on_path)
    if weights.get("target_distribution", 0.0):
        kl = F.kl_div(F.log_softmax(logits, dim=-1), F.log_softmax(target_logits, dim=-1), log_target=True,
                      reduction="none").sum(-1)
        total = total + weights["target_distribution"] * kl
    return total


def selector_loss(core: DFlashDrafter, hidden: torch.Tensor, logits: torch.Tensor, previous: torch.Tensor,
                  gold: torch.Tensor, weights: torch.Tensor, objective: SelectorObjective,
                  target_logits: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """DFlash 2's selector objective: a K-way cross-entropy over each position's top-K candidates, weighted by the
    block position's weight. Its label is the gold token's index, or with ``target_logits`` the target's whole
    distribution over the candidates (renormalised to them): the selector then learns the target's own choice
    among them for greedy walks and its probabilities for sampled ones (q = softmax of the scores); with
    ``objective.argmax_share`` s that soft label is (1 - s) x the distribution + s x the one-hot of the target's argmax
    where the argmax is a candidate (a sharper pick for greedy walks).

    Unless ``objective.trains_drafter``, the drafter's hidden states and logits enter detached: the block loss alone
    trains the layers (and the convolutions), the selector loss trains the selector, so a warm-started DFlash 2
    drafter's layers learn what a DFlash 1 drafter's would. Else the selector's loss also trains the layers, through
    the candidates' logits and the hidden states it scores (speculators' way): the layers learn to rank the label
    first among the candidates, which is what a greedy walk needs. A hard gold token outside the top K is dropped
    (no selector loss there) or inserted in place of the K-th candidate (``objective.outside_top_k``). Returns the loss and ``[loss, gold in top K, selector picks
    gold, labels]`` (sums over the batch, for the loss curve)."""
    selector = core.candidate_selector
    if not objective.trains_drafter:
        hidden, logits = hidden.detach(), logits.detach()
    unary, candidates = selector.candidates(logits)
    is_gold = candidates == gold[:, None]
    in_top = is_gold.any(-1)
    label = is_gold.float().argmax(-1)
    keep = in_top
    if target_logits is not None:
        keep = torch.ones_like(in_top)
    elif objective.outside_top_k == "insert":
        last = selector.top_k - 1
        out = ~in_top
        # On copies: topk's backward reads its indices, and the logits may carry gradient (not detached).
        candidates, unary = candidates.clone(), unary.clone()
        candidates[out, last] = gold[out]
        unary[out, last] = logits[out].gather(-1, gold[out, None])[:, 0]
        label = torch.where(in_top, label, torch.full_like(label, last))
        keep = torch.ones_like(in_top)
    scores = selector.scores(selector.hidden_projection(hidden), previous, candidates, unary).float()
    w = weights * keep.float()
    if target_logits is None:
        ce = F.cross_entropy(scores, label, reduction="none")
    else:
        soft = F.softmax(target_logits.detach().gather(-1, candidates), dim=-1)
        share = objective.argmax_share * in_top.float()[:, None]
        soft = (1 - share) * soft + share * is_gold.float()
        ce = -(soft * F.log_softmax(scores, dim=-1)).sum(-1)
    loss = (ce * w).sum() / w.sum().clamp_min(1e-9)
    with torch.no_grad():
        picks = (scores.argmax(-1) == label) & in_top
        stats = torch.stack([loss.detach(), in_top.float().sum(), picks.float().sum(),
                             torch.tensor(float(len(gold)), device=gold.device)])
    return loss, stats
