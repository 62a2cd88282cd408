"""DFlash drafter layers, and ``DFlashDraftModel``: the drafter as a transformers model loadable without draftline.

This file imports torch and transformers only. The train stage copies it into every checkpoint folder and names it in
``config.json``'s ``auto_map``, so ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` builds the drafter
anywhere. draftline's own drafter (:mod:`draftline.drafter.model`) is made of the same layers, so the two compute
the same thing. Written for draftline from the DFlash paper's description and z-lab's public interface (class name,
call signature, weight names), not copied.

Invariants of the arithmetic (z-lab's, which SGLang and vLLM serve):
- the context is the target's hidden states of a few layers, concatenated, projected by ``fc`` and normalised by
  ``hidden_norm``; it gives every drafter layer extra keys and values in front of the block ("KV injection"),
  with ``k_norm`` and RoPE at the context tokens' absolute positions and no input norm;
- the block (the last accepted token, then ``block_size - 1`` mask tokens) attends to the context and to itself
  without a causal mask;
- the embedding and the lm_head are the target's: ``noise_embedding`` comes in embedded, ``compute_logits`` takes
  the target's output head.

``DFlashDraftModel.forward(position_ids, attention_mask=None, noise_embedding=None, target_hidden=None,
past_key_values=None, use_cache=False)`` returns the block's final hidden states; ``position_ids`` covers the context
then the block. With a ``DynamicCache`` the context and block keys of each call are appended to it, and the caller
crops it back to the accepted length, as z-lab's decoding loop does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel, Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    apply_rotary_pos_emb,
    repeat_kv,
)


class DFlashAttention(nn.Module):
    """Block queries attend to [context keys | block keys], without a causal mask inside the block."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.head_dim = config.head_dim
        self.n_rep = config.num_attention_heads // config.num_key_value_heads
        bias = getattr(config, "attention_bias", False)
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:2], -1, self.head_dim)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated, normalised keys and values ``[b, kv_heads, n, head_dim]`` of ``x`` at the given positions."""
        k = self.k_norm(self._heads(self.k_proj(x))).transpose(1, 2)
        v = self._heads(self.v_proj(x)).transpose(1, 2)
        k, _ = apply_rotary_pos_emb(k, k, cos, sin)
        return k, v

    def forward(self, x, ctx_k, ctx_v, cos, sin, mask) -> torch.Tensor:
        """``x`` [b, q, hidden] (normed block states); ``ctx_k``/``ctx_v``: every key and value before the block's."""
        q = self.q_norm(self._heads(self.q_proj(x))).transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, cos, sin)
        k, v = self.keys_values(x, cos, sin)
        k = repeat_kv(torch.cat([ctx_k, k], dim=2), self.n_rep)
        v = repeat_kv(torch.cat([ctx_v, v], dim=2), self.n_rep)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class DFlashLayer(nn.Module):
    """A Qwen3 decoder layer whose attention also reads the injected context keys and values."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, h, ctx_k, ctx_v, cos, sin, mask) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), ctx_k, ctx_v, cos, sin, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashModules(nn.Module):
    """What a DFlash checkpoint holds, under z-lab's names: ``layers.*``, ``fc``, ``hidden_norm``, ``norm``."""

    def build(self, config: Qwen3Config) -> None:
        dflash = config.dflash_config
        self.block_size = int(getattr(config, "block_size", None) or dflash.get("block_size", 16))
        self.mask_token_id = int(dflash["mask_token_id"])
        self.target_layer_ids = [int(i) for i in dflash["target_layer_ids"]]
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.fc = nn.Linear(len(self.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Target features ``[b, n, len(layer_ids) * hidden]`` -> context ``[b, n, hidden]`` (fc + RMSNorm)."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))


class DFlashDraftModel(DFlashModules, PreTrainedModel):
    """The drafter for transformers users: z-lab's class name and call signature (see the module docstring)."""

    config_class = Qwen3Config
    base_model_prefix = "dflash"
    _no_split_modules = ["DFlashLayer"]

    def __init__(self, config: Qwen3Config):
        PreTrainedModel.__init__(self, config)
        self.build(config)
        # transformers' own initialisation: normal Linear weights, RMSNorm at one, and the RoPE buffers, which a
        # checkpoint does not hold (non-persistent) and from_pretrained builds on the meta device first.
        self.post_init()

    def forward(
        self,
        position_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        noise_embedding: torch.Tensor | None = None,
        target_hidden: torch.Tensor | None = None,
        past_key_values=None,
        use_cache: bool = False,
        **kwargs,
    ) -> torch.Tensor:
        ctx = self.project(target_hidden)
        h = noise_embedding.to(ctx.dtype)
        n_ctx, q = ctx.shape[1], h.shape[1]
        cos, sin = self.rotary_emb(h, position_ids)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.keys_values(ctx, cos[:, :n_ctx], sin[:, :n_ctx])
            if past_key_values is not None:
                # The cache holds context and block keys, as z-lab's does; this layer reads all but the block's own.
                block_k, block_v = layer.self_attn.keys_values(layer.input_layernorm(h), cos[:, n_ctx:], sin[:, n_ctx:])
                k, v = past_key_values.update(torch.cat([k, block_k], 2), torch.cat([v, block_v], 2), i)
                k, v = k[:, :, :-q], v[:, :, :-q]
            h = layer(h, k, v, cos[:, n_ctx:], sin[:, n_ctx:], attention_mask)
        return self.norm(h)

    def compute_logits(self, hidden: torch.Tensor, output_head: nn.Module) -> torch.Tensor:
        """Logits of the block positions through the target's own output head (the drafter has none)."""
        return output_head(hidden)
