"""draftline's drafter module: the target it borrows, decoding one block at a time, and its checkpoint methods.

What makes it DFlash (z-lab, "Block Diffusion for Flash Speculative Decoding") and DFlash 2 is written once, in
:mod:`draftline.drafter.modeling_dflash`, the self-contained file every checkpoint carries (with ``auto_map``); the
:class:`DFlashDrafter` here *is* those modules (the same forward), built from a config of
:mod:`draftline.drafter.config`, and adds what training and decoding here need:

* the embedding and the lm_head are the target's own, frozen: they are borrowed (:class:`SharedTarget`), never
  saved, so a checkpoint (:mod:`draftline.drafter.checkpoint`) holds only the drafter's weights;
* :meth:`DFlashDrafter.draft` drafts one block after the accepted prefix with a :class:`DraftCache` of the context's
  keys and values, and :meth:`DFlashDrafter.select` walks a DFlash 2 drafter's candidate selector.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache, Qwen3Config

from draftline.drafter.checkpoint import read_config, read_weights, write_checkpoint
from draftline.drafter.config import DrafterMismatch
from draftline.drafter.modeling_dflash import DFlashModules, is_dflash2


@dataclass
class SharedTarget:
    """The target's frozen embedding and lm_head, borrowed by the drafter.

    A plain dataclass, not a Module: the drafter's ``state_dict``, ``parameters()`` and DDP never see them,
    so they are neither trained nor saved.
    """

    embed: nn.Module
    lm_head: nn.Module

    @classmethod
    def of(cls, target: nn.Module) -> "SharedTarget":
        return cls(target.get_input_embeddings(), target.get_output_embeddings())


def target_features(hidden_states: tuple[torch.Tensor, ...], layer_ids: list[int]) -> torch.Tensor:
    """Concatenate the outputs of the chosen target layers: ``[b, n, len(layer_ids) * hidden]``.

    ``hidden_states`` is what ``output_hidden_states=True`` returns: index 0 is the embedding output, so
    layer ``i``'s output is at ``i + 1``, for every layer but the last (its entry is after the final norm,
    which is why :func:`draftline.drafter.config.make_config` refuses it).
    """
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


class DraftCache:
    """The context keys and values of every drafter layer, for one sequence being decoded.

    A transformers ``DynamicCache`` used as z-lab's loop uses it: a drafter call appends its context and block keys,
    and :meth:`DFlashDrafter.draft` crops the block's back off, so between calls it holds the context alone and
    nothing has to be cropped after a rejection.
    """

    def __init__(self):
        self.kv = DynamicCache()

    @property
    def length(self) -> int:
        return self.kv.get_seq_length()

    def crop_to(self, length: int) -> None:
        remove = self.length - length
        if remove > 0:
            self.kv.crop(-remove)  # a negative argument removes positions under transformers 4.x and 5.x alike


@dataclass
class DraftBlock:
    """One drafted block: the drafter's final hidden states and logits of its ``block_size - 1`` mask positions."""

    hidden: torch.Tensor  # [b, block_size - 1, hidden]
    logits: torch.Tensor  # [b, block_size - 1, vocab]


class DFlashDrafter(DFlashModules):
    """The drafter (DFlash 1 or 2, as its config's ``architectures`` says). Trainable parameters only; the target's
    embedding and lm_head are bound with :meth:`bind`.

    * :meth:`forward` (training and decoding alike): :meth:`DFlashModules.forward`, z-lab's signature;
    * :meth:`draft` / :meth:`draft_logits` (decoding): one block after the accepted prefix, with a :class:`DraftCache`
      of the context keys and values, so each step only projects the features of the newly accepted tokens;
    * :meth:`select` (DFlash 2): the candidate selector's walk through a drafted block.
    """

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        self.build(config)
        self.shared: SharedTarget | None = None
        std = config.initializer_range
        self.apply(lambda module: self.init_module(module, std))

    @property
    def architecture(self) -> str:
        """``dflash`` or ``dflash2`` (``train.architecture``'s words)."""
        return "dflash2" if is_dflash2(self.config) else "dflash"

    def bind(self, target: nn.Module) -> "DFlashDrafter":
        """Borrow the target's frozen embedding and lm_head (required before :meth:`embed` / :meth:`logits`)."""
        shared = SharedTarget.of(target)
        if shared.embed.weight.shape[-1] != self.config.hidden_size:
            raise DrafterMismatch(
                f"the target's hidden size {shared.embed.weight.shape[-1]} is not the drafter's "
                f"{self.config.hidden_size}: this drafter was trained for another target"
            )
        self.shared = shared
        return self

    def _require_shared(self) -> SharedTarget:
        if self.shared is None:
            raise RuntimeError("call drafter.bind(target) first: the drafter uses the target's embedding and lm_head")
        return self.shared

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self._require_shared().embed(ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.compute_logits(hidden, self._require_shared().lm_head)

    def new_cache(self) -> DraftCache:
        return DraftCache()

    @torch.no_grad()
    def draft(self, new_features: torch.Tensor, last_token: torch.Tensor, cache: DraftCache) -> DraftBlock:
        """The next block's mask positions: hidden states and logits ``[b, block_size - 1, ...]``.

        ``new_features`` [b, n, n_layers*hidden]: target features (:func:`target_features`) of the tokens
        accepted since the last call (the whole prompt on the first call), which are appended to ``cache``;
        ``last_token`` [b]: the last accepted token (the target's bonus token), which opens the block and
        whose own features the target has not computed yet. Its position is ``cache.length`` after the append.
        """
        b, n = new_features.shape[:2]
        start = cache.length + n
        device = new_features.device
        positions = torch.arange(start - n, start + self.block_size, device=device).expand(b, n + self.block_size)
        ids = torch.full((b, self.block_size), self.mask_token_id, dtype=torch.long, device=device)
        ids[:, 0] = last_token
        hidden = self(position_ids=positions, noise_embedding=self.embed(ids), target_hidden=new_features,
                      past_key_values=cache.kv, use_cache=True)[:, 1:]
        cache.crop_to(start)
        return DraftBlock(hidden, self.logits(hidden))

    def draft_logits(self, new_features: torch.Tensor, last_token: torch.Tensor, cache: DraftCache) -> torch.Tensor:
        """Logits ``[b, block_size - 1, vocab]`` for the mask positions of the next block (see :meth:`draft`)."""
        return self.draft(new_features, last_token, cache).logits

    @torch.no_grad()
    def select(self, block: DraftBlock, verified_token: torch.Tensor, temperature: float = 0.0,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """DFlash 2's drafts of ``block`` (:meth:`draft`), walked by the candidate selector from ``verified_token`` [b]
        (the block's first token, the one ``draft`` was given).

        Returns ``(path [b, B-1], candidates [b, B-1, K], probs [b, B-1, K])``: ``candidates`` are each position's
        top-K token ids by the drafter's logits (best first); ``path`` the tokens to verify. Greedy (``temperature``
        0): each position's best selector score, and ``probs`` the softmax of the scores (diagnostics). Sampled:
        each position is drawn from ``probs`` = softmax(scores / temperature), given the token drawn before it, so
        ``probs[:, k]`` is the proposal q of position k in the rejection step (zero outside ``candidates``).
        A DFlash 1 drafter has no selector: refused. The one way into the selector's walk (training scores its
        candidates teacher-forced, :func:`draftline.train.objective.selector_loss`)."""
        if self.candidate_selector is None:
            raise DrafterMismatch("select() needs a DFlash 2 drafter (a candidate selector); this one is DFlash 1")
        return self.candidate_selector.select(block.hidden, block.logits, verified_token, temperature, generator)

    # -- the z-lab checkpoint layout ------------------------------------------------------------------

    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        """Write the checkpoint folder (:func:`draftline.drafter.checkpoint.write_checkpoint`), weights in ``dtype``
        (the target's; by default the drafter's own)."""
        write_checkpoint(path, self.config, self.state_dict(), dtype or self.fc.weight.dtype)

    @classmethod
    def from_pretrained(cls, path: str | Path, target: nn.Module | None = None) -> "DFlashDrafter":
        """Load a drafter saved in z-lab's layout (DFlash 1 or 2); bind it to ``target`` when given."""
        model = cls(read_config(path))
        model.load_state_dict(
            {k: v.to(model.fc.weight.dtype) for k, v in read_weights(path).items()}, strict=True)
        if target is not None:
            model.bind(target)
            model.to(target.get_input_embeddings().weight.device)
        return model.eval()
