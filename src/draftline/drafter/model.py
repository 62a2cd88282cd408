"""The DFlash drafter: a few Qwen3 decoder layers that denoise a block of mask tokens in one pass.

What makes it DFlash (z-lab, "Block Diffusion for Flash Speculative Decoding"):

* the hidden states of a few target layers (``target_layer_ids``, spread from layer 1 to L-3) are concatenated,
  projected to the hidden size by ``fc`` and normalised by ``hidden_norm``: the *context features*;
* every drafter layer uses them as extra keys and values in front of the block ("KV injection"); the block's own
  queries, keys and values come from the block, and attention inside the block is NOT causal;
* a block is the last accepted token followed by ``block_size - 1`` mask tokens; one pass proposes them all;
* the embedding and the lm_head are the target's own, frozen: they are borrowed (:class:`SharedTarget`), never
  saved, so a checkpoint holds only ``layers.*``, ``fc``, ``hidden_norm`` and ``norm``: z-lab's layout, which
  SGLang and vLLM load as ``DFlashDraftModel``.

The arithmetic follows z-lab's reference drafter exactly (k_norm on the context keys, no input norm on the
context, RoPE at absolute positions for context and block), so that weights trained here mean the same thing
in those servers. The layers live in :mod:`draftline.drafter.modeling_dflash`, a self-contained file that every
checkpoint carries (with ``auto_map``), so transformers users load the same drafter without draftline; this module
adds what training and decoding here need (the borrowed target head, the block-mask forward, the context cache).
A checkpoint's weights are in the target's dtype; its config.json has what transformers 4.5x and 5.x both read.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Qwen3Config

from draftline.core.errors import Refusal
from draftline.core.files import atomic_path
from draftline.drafter.modeling_dflash import DFlashModules

ARCHITECTURE = "DFlashDraftModel"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# The self-contained modeling file copied into every checkpoint, and how transformers finds its class there.
MODELING_FILE = "modeling_dflash.py"
AUTO_MAP = {"AutoModel": f"{MODELING_FILE.removesuffix('.py')}.{ARCHITECTURE}"}

# Fields of the target's (text) config the drafter must share: the embedding and lm_head are the target's,
# so the hidden size and vocabulary must match; the rest keeps the drafter a Qwen3 that servers can build.
_SHARED_FIELDS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rms_norm_eps",
    "vocab_size",
    "max_position_embeddings",
    "hidden_act",
    "rope_parameters",
)

# PretrainedConfig bookkeeping that means nothing for a drafter; left out of config.json to keep it readable.
_GENERIC_CONFIG_KEYS = {
    "_name_or_path", "id2label", "label2id", "chunk_size_feed_forward", "output_attentions",
    "output_hidden_states", "problem_type", "return_dict", "is_encoder_decoder",
}


class DrafterMismatch(Refusal, ValueError):
    """A drafter that does not fit its target (layers, hidden size) or was not made by the train stage (no lineage,
    another architecture): the message says what to retrain or change."""


def build_target_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """``count`` target layers spread evenly from layer 1 to layer L-3, as z-lab picks them.

    The last layers are left out because they are specialised to the target's own next token; the middle
    ones carry what the following tokens depend on. One layer: the middle one.
    """
    if count < 1:
        raise DrafterMismatch(f"need at least one target layer, got {count}")
    if count == 1:
        return [num_target_layers // 2]
    start, end = 1, max(1, num_target_layers - 3)
    ids = sorted({int(round(start + i * (end - start) / (count - 1))) for i in range(count)})
    return ids


def make_config(
    target_config: Any,
    *,
    num_layers: int,
    block_size: int,
    mask_token_id: int,
    target_layer_ids: list[int],
    lineage: dict[str, Any],
) -> Qwen3Config:
    """The drafter's config: the target's shapes, ``num_layers`` layers, the DFlash fields in z-lab's layout, and
    ``lineage`` (what its training data was made with, under ``draftline``: see :func:`lineage_of`)."""
    text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    n_target = int(text.num_hidden_layers)
    bad = [i for i in target_layer_ids if not 0 <= i < n_target]
    if bad:
        raise DrafterMismatch(f"target_layer_ids {bad} are outside the target's {n_target} layers")
    if n_target - 1 in target_layer_ids:
        # transformers reports the last layer's output after the final norm (hidden_states[L] is normed), and
        # servers capture raw layer outputs: the drafter would be served other features than it trained on.
        raise DrafterMismatch(
            f"target_layer_ids may not include the last layer ({n_target - 1}): use layers up to {n_target - 2}"
        )
    shared = {k: getattr(text, k) for k in _SHARED_FIELDS if getattr(text, k, None) is not None}
    shared.setdefault("head_dim", text.hidden_size // text.num_attention_heads)
    return Qwen3Config(
        **shared,
        num_hidden_layers=num_layers,
        architectures=[ARCHITECTURE],
        block_size=block_size,
        num_target_layers=n_target,
        dflash_config={"target_layer_ids": list(target_layer_ids), "mask_token_id": int(mask_token_id)},
        tie_word_embeddings=False,
        use_cache=False,
        draftline=dict(lineage),
    )


def lineage_of(config: Any) -> dict[str, Any]:
    """The training data's lineage a checkpoint records (tokenizer fingerprint, chat template, thinking mode,
    mask token); a checkpoint without one is refused, since nothing then says which target it fits."""
    lineage = getattr(config, "draftline", None)
    if not isinstance(lineage, dict) or "tokenizer_fingerprint" not in lineage:
        raise DrafterMismatch("the drafter's config.json has no `draftline` lineage (tokenizer fingerprint, thinking "
                         "mode): it was not trained by draftline's train stage; retrain it")
    return lineage


def checkpoint_config(config: Qwen3Config, dtype: torch.dtype) -> dict[str, Any]:
    """``config.json`` as every reader needs it: transformers 5 reads ``rope_parameters`` and ``dtype``; 4.5x
    (z-lab pins 4.57.1) reads top-level ``rope_theta`` / ``rope_scaling`` and ``torch_dtype``, and without them
    silently takes rope_theta 10000; ``auto_map`` points ``AutoModel`` (trust_remote_code) at the modeling file."""
    out = {k: v for k, v in config.to_dict().items() if k not in _GENERIC_CONFIG_KEYS}
    out["dtype"] = out["torch_dtype"] = str(dtype).removeprefix("torch.")
    rope = dict(out.get("rope_parameters") or {})
    out["rope_theta"] = rope.get("rope_theta", getattr(config, "rope_theta", None))
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    out["rope_scaling"] = scaling if scaling.get("rope_type", "default") != "default" else None
    out["auto_map"] = dict(AUTO_MAP)
    return out


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
    which is why :func:`make_config` refuses it).
    """
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


class DraftCache:
    """The context keys and values of every drafter layer, for one sequence being decoded.

    Only the context (the target's features of accepted tokens) is cached; the block's own keys and values
    are recomputed each pass and never stored, so nothing has to be cropped after a rejection.
    """

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        k = self.keys[0]
        return 0 if k is None else k.shape[2]

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class DFlashDrafter(DFlashModules):
    """The drafter. Trainable parameters only; the target's embedding and lm_head are bound with :meth:`bind`.

    Two entry points:

    * :meth:`forward` (training): many blocks at once over a whole sequence's context, with a block mask;
    * :meth:`draft_logits` (decoding): one block after the accepted prefix, with a :class:`DraftCache` of the
      context keys and values, so each step only projects the features of the newly accepted tokens.
    """

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        self.build(config)
        self.shared: SharedTarget | None = None
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # Qwen3's initialisation: small normal weights; RMSNorm weights stay at one.
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

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
        return self._require_shared().lm_head(hidden)

    def forward(
        self,
        block_embeds: torch.Tensor,
        features: torch.Tensor,
        ctx_positions: torch.Tensor,
        block_positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: DraftCache | None = None,
    ) -> torch.Tensor:
        """Final hidden states ``[b, q, hidden]`` of the block tokens (apply :meth:`logits` for logits).

        ``block_embeds`` [b, q, hidden]: embeddings of the block tokens (anchor + masks), possibly many blocks;
        ``features`` [b, s, n*hidden]: target features of the context (with a cache: only the new tokens);
        ``ctx_positions`` [b, s] / ``block_positions`` [b, q]: absolute positions for RoPE;
        ``mask`` [b, 1, q, context + q] boolean, True = may attend; None = everything visible.
        """
        ctx = self.project(features)
        h = block_embeds.to(ctx.dtype)
        ctx_cos, ctx_sin = self.rotary_emb(ctx, ctx_positions)
        cos, sin = self.rotary_emb(h, block_positions)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.keys_values(ctx, ctx_cos, ctx_sin)
            if cache is not None:
                k, v = cache.extend(i, k, v)
            h = layer(h, k, v, cos, sin, mask)
        return self.norm(h)

    def new_cache(self) -> DraftCache:
        return DraftCache(len(self.layers))

    @torch.no_grad()
    def draft_logits(self, new_features: torch.Tensor, last_token: torch.Tensor, cache: DraftCache) -> torch.Tensor:
        """Logits ``[b, block_size - 1, vocab]`` for the mask positions of the next block.

        ``new_features`` [b, n, n_layers*hidden]: target features (:func:`target_features`) of the tokens
        accepted since the last call (the whole prompt on the first call), which are appended to ``cache``;
        ``last_token`` [b]: the last accepted token (the target's bonus token), which opens the block and
        whose own features the target has not computed yet. Its position is ``cache.length`` after the append.
        """
        b, n = new_features.shape[:2]
        start = cache.length + n
        device = new_features.device
        ctx_positions = torch.arange(start - n, start, device=device).expand(b, n)
        block_positions = torch.arange(start, start + self.block_size, device=device).expand(b, self.block_size)
        ids = torch.full((b, self.block_size), self.mask_token_id, dtype=torch.long, device=device)
        ids[:, 0] = last_token
        hidden = self(self.embed(ids), new_features, ctx_positions, block_positions, None, cache)
        return self.logits(hidden[:, 1:])

    # -- the z-lab checkpoint layout ------------------------------------------------------------------

    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        """Write ``config.json`` + ``model.safetensors`` (drafter weights only, in ``dtype``: the target's) and the
        modeling file, atomically as one folder."""
        dtype = dtype or self.fc.weight.dtype
        with atomic_path(path, "the drafter checkpoint") as tmp:
            tmp.mkdir(parents=True)
            config = checkpoint_config(self.config, dtype)
            (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            tensors = {k: v.detach().to(dtype).contiguous().cpu() for k, v in self.state_dict().items()}
            save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
            shutil.copyfile(Path(__file__).with_name(MODELING_FILE), tmp / MODELING_FILE)

    @classmethod
    def from_pretrained(cls, path: str | Path, target: nn.Module | None = None) -> "DFlashDrafter":
        """Load a drafter saved in z-lab's layout; bind it to ``target`` when given."""
        path = Path(path)
        raw = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
        if ARCHITECTURE not in raw.get("architectures", []):
            raise DrafterMismatch(f"{path / CONFIG_FILE} is not a {ARCHITECTURE} config: {raw.get('architectures')}")
        for key in ("dtype", "torch_dtype", "auto_map"):
            raw.pop(key, None)
        model = cls(Qwen3Config(**raw))
        state = load_file(str(path / WEIGHTS_FILE))
        model.load_state_dict({k: v.to(model.fc.weight.dtype) for k, v in state.items()}, strict=True)
        if target is not None:
            model.bind(target)
            model.to(target.get_input_embeddings().weight.device)
        return model.eval()
