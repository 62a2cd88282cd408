"""The training block layout: attention mask, labels and loss weights for many blocks at once.

The drafter sees ``[context (s positions) | block 0 | block 1 | ...]`` as keys and values and the blocks as
queries. Block ``j`` (anchor ``a``) may see the context strictly before ``a`` (the target's features of
tokens already accepted when ``a`` is the last accepted token) and its own block, in both directions; never
another block. Block position ``k`` predicts token ``a + k``.

The context may be a pack of rows laid end to end (:mod:`draftline.train.data`): then a block sees only its own
row's context (from the row's first token, ``starts``), its positions are the anchor's position within its row
(``positions``), and a label past the row's end (``row_of`` changes) has no weight: each row trains exactly as
it would alone.
"""

from __future__ import annotations

import math

import torch


def block_mask(anchors: torch.Tensor, keep: torch.Tensor, context_len: int, block_size: int, *,
               starts: torch.Tensor | None = None, causal: bool = False, window: int | None = None) -> torch.Tensor:
    """Boolean ``[b, 1, n*B, s + n*B]``, True where a block query may attend.

    Blocks without an anchor (``keep=False``) see only themselves: a query row with nothing visible would make
    attention NaN, and their loss weight is zero anyway. A sliding-window layer (``causal``, ``window``) sees only
    earlier block positions and keys less than ``window`` positions back, at their absolute positions, as its
    decoding mask (:func:`draftline.drafter.modeling_dflash.visibility`) does; the anchor always sees itself.
    ``starts`` ``[b, n]``: where each anchor's row begins in a pack (None: at 0).
    """
    b, n = anchors.shape
    q = n * block_size
    device = anchors.device
    q_block = torch.arange(q, device=device) // block_size  # [q]
    q_within = torch.arange(q, device=device) % block_size  # [q]
    kv = torch.arange(context_len + q, device=device)  # [kv]
    anchor_of_q = anchors.repeat_interleave(block_size, dim=1)  # [b, q]
    keep_of_q = keep.repeat_interleave(block_size, dim=1)
    sees_context = (kv[None, None, :] < context_len) & (kv[None, None, :] < anchor_of_q[:, :, None]) & keep_of_q[:, :, None]
    if starts is not None:
        sees_context = sees_context & (kv[None, None, :] >= starts.repeat_interleave(block_size, dim=1)[:, :, None])
    kv_block = torch.where(kv >= context_len, (kv - context_len) // block_size, -1)
    kv_within = (kv - context_len) % block_size
    sees_block = kv_block[None, None, :] == q_block[None, :, None]
    if causal:
        sees_block = sees_block & (kv_within[None, None, :] <= q_within[None, :, None])
    if window is not None:
        query_pos = (anchor_of_q + q_within[None, :])[:, :, None]  # [b, q, 1]
        sees_context = sees_context & (query_pos - kv[None, None, :] < window)
        back = q_within[None, :, None] - kv_within[None, None, :]
        sees_block = sees_block & (back < window) & (causal | (-back < window))
    return (sees_context | sees_block)[:, None]


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """Loss weight of each block position: 0 for the anchor, ``exp(-(k-1)/gamma)`` for k = 1..B-1.

    Later positions are only accepted if every earlier one is, so an error early costs more; DFlash decays
    the weight with gamma 7 for B=16, 5 for 10, 4 for 8.
    """
    if gamma <= 0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    w = torch.tensor([math.exp(-(k - 1) / gamma) for k in range(block_size)], dtype=torch.float32)
    w[0] = 0.0
    return w


def block_gather(values: torch.Tensor, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """``values[b, a + k]`` for every block ``[b, n, B]`` of anchor ``a``, clamped at the row's last position."""
    s = values.shape[1]
    idx = (anchors[:, :, None] + torch.arange(block_size, device=anchors.device)[None, None, :]).clamp(max=s - 1)
    return values.gather(1, idx.flatten(1)).view_as(idx)


def block_targets(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: torch.Tensor,
    keep: torch.Tensor,
    block_size: int,
    gamma: float,
    row_of: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels ``[b, n, B]`` (token ``a + k``) and weights ``[b, n, B]``.

    A weight is the position weight where the label exists (inside the anchor's row: ``row_of`` in a pack), is
    supervised and the block is kept; else 0. Past the end of a line the label is clamped and weighted 0.
    """
    inside = anchors[:, :, None] + torch.arange(block_size, device=anchors.device)[None, None, :] < input_ids.shape[1]
    if row_of is not None:
        inside = inside & (block_gather(row_of, anchors, block_size) == row_of.gather(1, anchors)[:, :, None])
    labels = block_gather(input_ids, anchors, block_size)
    supervised = block_gather(loss_mask.bool(), anchors, block_size)
    w = position_weights(block_size, gamma).to(anchors.device)[None, None, :]
    weights = w * (inside & supervised & keep[:, :, None]).float()
    return labels, weights


def block_inputs(input_ids: torch.Tensor, anchors: torch.Tensor, mask_token_id: int, block_size: int) -> torch.Tensor:
    """Block token ids ``[b, n*B]``: each block is its anchor token followed by B-1 mask tokens."""
    b, n = anchors.shape
    ids = torch.full((b, n, block_size), mask_token_id, dtype=input_ids.dtype, device=input_ids.device)
    ids[:, :, 0] = input_ids.gather(1, anchors)
    return ids.view(b, n * block_size)


def block_positions(anchors: torch.Tensor, block_size: int, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Positions ``[b, n*B]`` of the block tokens: the anchor's position (in its row: ``positions``; else its index)
    + k."""
    b, n = anchors.shape
    base = anchors if positions is None else positions.gather(1, anchors)
    return (base[:, :, None] + torch.arange(block_size, device=anchors.device)).view(b, n * block_size)
