"""The target's greedy path from every anchor: what a greedy walk from that anchor drafts against.

Block position k of anchor a is accepted by greedy verification when it is the k-th token of the target's greedy
continuation of the row up to a. The data's own tokens were sampled (generate's temperature), so past the first
block token they leave that path at some k (25-47% of the labels at k = 4 on the embedded rows:
``bench/greedy_path.py``), and the target's argmax given the data's prefix then answers a prefix no greedy walk
drafts from. Two ways to label greedy walks rightly:

* :func:`greedy_path`: which labels lie on the path (every block token before them is the target's own greedy
  choice), so the argmax label is kept there only;
* :func:`greedy_chains`: the continuation itself, ``depth`` tokens after every position, so every label is on it.

Invariants: a row is continued alone (the target never sees another row of a pack), in the dtype it runs in; a
continuation past a row's last token is never needed (a block's labels end with its row) and reads -1. The KV cache
is passed by the keyword the target's forward takes (:func:`draftline.drafter.speculative.cache_kwarg`), and a target
with sliding-window layers is refused (:func:`refuse_sliding_window`): its cache keeps only the window, which the
branches' keys over the whole row cannot be read from.
"""

from __future__ import annotations

import torch
from torch import nn

from draftline.core.params import ParamsError
from draftline.drafter.speculative import cache_kwarg


def greedy_path(shape: torch.Size, used: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
    """Whether each used block position (``used``: ``[b * n * B]``, of blocks ``shape`` ``[b, n, B]``) lies on the
    target's greedy path from its anchor: every block token before it is supervised and is the target's greedy
    choice (``greedy``, per used position: the data's token equals the target's argmax there)."""
    match = torch.zeros(shape, dtype=torch.bool, device=used.device)
    match.view(-1)[used] = greedy
    match[..., 0] = True  # the anchor is given, not drafted
    on = torch.ones_like(match)
    on[..., 1:] = torch.cumprod(match.int(), dim=-1)[..., :-1].bool()
    return on.flatten()[used]


@torch.no_grad()
def greedy_chains(target: nn.Module, input_ids: torch.Tensor, loss_mask: torch.Tensor, depth: int) -> torch.Tensor:
    """``[n, depth]``: after each position i of one row ``[1, n]`` whose next token is supervised (``loss_mask``
    ``[1, n]``), the first ``depth`` tokens the target picks greedily from the row up to i (column 0: its argmax at
    i, known everywhere); -1 where not computed.

    Where the data's token i + 1 is that argmax, the continuation after i is the argmax and then the one after
    i + 1, shifted: only the positions where the data left the greedy path (about one in eight here) are decoded
    further, all of them at once, one token a level, each seeing its row up to its position and its own branch (a
    4-D mask over the target's KV cache)."""
    refuse_sliding_window(target.config)
    n = input_ids.shape[1]
    cache = _cache(target)
    first = target(input_ids=input_ids, use_cache=True, **{cache_kwarg(target): cache}).logits[0].argmax(-1)
    chains = torch.full((n, depth), -1, dtype=torch.long, device=input_ids.device)
    chains[:, 0] = first
    follows = torch.zeros(n, dtype=torch.bool, device=input_ids.device)
    follows[:-1] = input_ids[0, 1:] == first[:-1]
    # Only where a supervised token follows (a label's anchor or a step of its path); the last position never.
    branch = (~follows[:-1] & loss_mask[0, 1:].bool()).nonzero()[:, 0]
    decoded = _branches(target, cache, n, branch, first[branch], depth)
    for m in range(1, depth):
        shifted = torch.full_like(first, -1)
        shifted[:-1] = chains[1:, m - 1]
        chains[:, m] = torch.where(follows, shifted, chains[:, m])
        chains[branch, m] = decoded[:, m]
    return chains


def _branches(target: nn.Module, cache, n: int, at: torch.Tensor, first: torch.Tensor, depth: int) -> torch.Tensor:
    """``[len(at), depth]``: the greedy continuation after each position in ``at`` (its first token given),
    decoded level by level over ``cache`` (the row's keys, to which each level's keys are added)."""
    out = torch.empty((len(at), depth), dtype=torch.long, device=first.device)
    out[:, 0] = first
    if len(at) == 0:
        return out
    context = torch.arange(n, device=at.device)[None, :] <= at[:, None]
    own = torch.eye(len(at), dtype=torch.bool, device=at.device)
    dtype = next(target.parameters()).dtype
    for m in range(1, depth):
        allowed = torch.cat([context] + [own] * m, dim=1)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=at.device).masked_fill(~allowed, torch.finfo(dtype).min)
        logits = target(input_ids=out[None, :, m - 1], position_ids=(at + m)[None], attention_mask=mask[None, None],
                        use_cache=True, **{cache_kwarg(target): cache}).logits[0]
        out[:, m] = logits.argmax(-1)
    return out


def refuse_sliding_window(config) -> None:
    """Refuse a target any of whose layers attend through a sliding window (Mistral-style, Gemma, gpt-oss): the
    cache keeps the last ``sliding_window`` keys of such a layer, the 4-D mask of :func:`_branches` spans the row."""
    text = config.get_text_config()
    window = getattr(text, "sliding_window", None)
    types = getattr(text, "layer_types", None)  # None: every layer as the config says (Mistral's has none)
    if window is not None and (types is None or any(t != "full_attention" for t in types)):
        raise ParamsError(f"params.yaml: train.argmax_path: greedy decodes the target's greedy continuations over "
                          f"its KV cache, which the target's sliding window ({window} tokens) crops: set "
                          "train.argmax_path to on_greedy_path or data")


def _cache(target: nn.Module):
    from transformers import DynamicCache

    return DynamicCache(config=target.config)


def pack_chains(target: nn.Module, input_ids: torch.Tensor, loss_mask: torch.Tensor, row_of: torch.Tensor,
                depth: int) -> torch.Tensor:
    """:func:`greedy_chains` of a pack ``[1, s]`` (rows told apart by ``row_of``), each row alone, laid end to end:
    ``[1, s, depth]``."""
    lengths = torch.bincount(row_of[0]).tolist()
    rows = zip(input_ids.split(lengths, dim=1), loss_mask.split(lengths, dim=1))
    return torch.cat([greedy_chains(target, ids, mask, depth) for ids, mask in rows])[None]


def block_chains(chains: torch.Tensor, input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[b, n, B]``: each block's anchor token, then the target's greedy continuation after the anchor
    (``chains`` ``[b, s, >= B - 1]``): block position k's label on the greedy path."""
    after = chains.gather(1, anchors[:, :, None].expand(-1, -1, chains.shape[-1]))[..., : block_size - 1]
    return torch.cat([input_ids.gather(1, anchors)[:, :, None], after], dim=-1)


def path_labels(path: torch.Tensor, used: torch.Tensor, fallback: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per used block position (``used``, of blocks ``path`` ``[b, n, B]`` from :func:`block_chains`): its label on
    the greedy path, or where the path was not computed (-1: no supervised token followed a step of it, a block
    across a turn's end) ``fallback``, the target's argmax after the data's tokens; and the path's token before it
    (the anchor at k = 1; -1 where not computed: the caller keeps the data's there)."""
    before = torch.cat([path[..., :1], path[..., :-1]], dim=-1).flatten()[used]
    path = path.flatten()[used]
    return torch.where(path >= 0, path, fallback), before
