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
from dataclasses import dataclass

import torch
import torch.nn.functional as F


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


@dataclass
class RowMasks:
    """The block attention of a pack ``[1, ...]``, row by row: row r's block queries see only the keys of its own
    context (its first token up to its last anchor) and of its own blocks, through its :func:`block_mask`. What a
    dense mask over the whole pack would give, without the work of every block against every other row's keys
    (quadratic in the rows a pack holds). The drafter's attention calls :meth:`attend`.

    The key axis ``[context | blocks]`` is cut once into consecutive pieces (``key_pieces``), row r's context and
    blocks each one piece: a split's backward is one concatenation, where slicing each row's keys out would
    allocate a full-size zero gradient per slice."""

    query_pieces: list[int]  # block queries of each row
    key_pieces: list[int]  # sizes of the consecutive pieces of the key axis
    rows: list[tuple[int, int]]  # (context piece, block piece) of each row, indices into key_pieces
    masks: list[torch.Tensor]  # [1, 1, its queries, its context + its queries] of each row

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention of ``q`` [1, heads, queries, d] over ``k`` / ``v`` [1, heads, context + queries, d]."""
        ks, vs = k.split(self.key_pieces, dim=2), v.split(self.key_pieces, dim=2)
        out = []
        for q_row, (c, b), mask in zip(q.split(self.query_pieces, dim=2), self.rows, self.masks):
            keys, values = torch.cat([ks[c], ks[b]], dim=2), torch.cat([vs[c], vs[b]], dim=2)
            out.append(F.scaled_dot_product_attention(q_row, keys, values, attn_mask=mask, scale=scale))
        return torch.cat(out, dim=2)


def row_masks(anchors: torch.Tensor, starts: torch.Tensor, context_len: int, block_size: int, *,
              causal: bool = False, window: int | None = None) -> RowMasks:
    """:class:`RowMasks` of a pack's sorted ``anchors`` ``[1, n]`` (every block kept) whose rows begin at ``starts``
    ``[1, n]``."""
    if anchors.shape[0] != 1:
        raise ValueError(f"row masks are for one pack (a batch of 1), got {anchors.shape[0]}")
    a, st = anchors[0], starts[0]
    bounds = [0, *((st[1:] != st[:-1]).nonzero().flatten() + 1).tolist(), len(a)]
    context_pieces, queries, masks, at = [], [], [], 0
    for i, j in zip(bounds, bounds[1:]):
        c0, c1 = int(st[i]), int(a[j - 1])
        own = (a[i:j] - c0)[None]
        masks.append(block_mask(own, torch.ones_like(own, dtype=torch.bool), c1 - c0, block_size, causal=causal,
                                window=window))
        context_pieces += [c0 - at, c1 - c0]  # the gap before the row's context, then its context
        queries.append((j - i) * block_size)
        at = c1
    key_pieces = [*context_pieces, context_len - at, *queries]
    rows = [(2 * r + 1, len(context_pieces) + 1 + r) for r in range(len(queries))]
    return RowMasks(queries, key_pieces, rows, masks)


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
