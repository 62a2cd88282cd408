"""DFlash and DFlash 2 drafters: the one modeling file that training, decoding and every saved checkpoint run.

This file imports torch and transformers only. The train stage copies it into every checkpoint folder and names it in
``config.json``'s ``auto_map``, so ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` builds the drafter
anywhere; draftline's own drafter (:mod:`draftline.drafter.model`) is :class:`DFlashModules` too, so training, the
evaluate stage and a checkpoint loaded without draftline run this forward and nothing else. Written for draftline from
the DFlash papers and z-lab's public interface (``dflash`` 0.1.0: class names, call signature, weight names), not
copied.

Read top to bottom:

1. the context: the target's hidden states of a few layers (``target_layer_ids``), concatenated, projected by ``fc``
   and normalised by ``hidden_norm``;
2. :class:`DFlashAttention`: the block (the last accepted token, then ``block_size - 1`` mask tokens) queries
   [cached keys | context keys | block keys]: the context enters every layer as extra keys and values ("KV
   injection", with ``k_norm`` and RoPE at the context tokens' absolute positions, no input norm); inside the block
   a full-attention layer is NOT causal; a sliding layer (``layer_types``) is causal and sees ``sliding_window``
   positions back, as z-lab's, vLLM's and SGLang's DFlash layers read those fields;
3. DFlash 2 only, :class:`GroupedDynamicCausalConv`: in every layer a causal convolution along the block, its kernel
   per channel group partly static (``base_kernel``) and partly predicted from the token (``kernel_projection``),
   ``prepare`` before attention / the MLP and ``finish`` after it; identity-initialised (so a DFlash 1 drafter
   warm-started into DFlash 2 computes what it did);
4. :class:`DFlashDecoderLayer`: a Qwen3 decoder layer around them;
5. :class:`DFlashModules`: the layers, ``fc``, ``hidden_norm``, ``norm``, and :meth:`DFlashModules.forward`, the one
   forward (z-lab's signature: ``position_ids`` covers the context then the block);
6. DFlash 2 only, :class:`CandidateSelector`: the top-K (``selector_top_k``) of each block position's logits
   rescored by a low-rank predecessor x successor term, walked left to right from the verified token; the
   successor codebook starts at zero, so a fresh selector picks the argmax: what the DFlash 1 drafter drafts;
7. :class:`DFlashDraftModel` / :class:`DFlash2DraftModel`: the transformers classes ``architectures`` names.

The embedding and the lm_head are the target's: ``noise_embedding`` comes in embedded and :meth:`compute_logits` takes
the target's output head. With a cache (a transformers ``DynamicCache``), each call appends its context and block keys
and the caller crops it back to the accepted length, as z-lab's ``dflash_generate`` does. Training passes many blocks
at once with an explicit attention mask (one per layer type); the convolution never crosses a block boundary
(``block_size`` positions), so a training block computes what a decoding block does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel, Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

try:  # transformers 5: initialisers that leave weights a checkpoint loaded alone
    from transformers import initialization as init
except ImportError:  # transformers 4.5x
    from torch.nn import init

DFLASH = "DFlashDraftModel"
DFLASH2 = "DFlash2DraftModel"
FULL, SLIDING = "full_attention", "sliding_attention"


def dflash_value(config, name: str, default=None):
    """A DFlash field: ``dflash_config[name]`` first (z-lab's layout), then the top-level attribute."""
    return (getattr(config, "dflash_config", None) or {}).get(name, getattr(config, name, default))


def is_dflash2(config) -> bool:
    return DFLASH2 in (getattr(config, "architectures", None) or [])


def layer_type(config, layer_idx: int) -> str:
    types = getattr(config, "layer_types", None)
    return types[layer_idx] if types else FULL


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE: ``x`` [b, heads, n, d] at the positions ``cos`` / ``sin`` [b, n, d] stand for."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def visibility(q_len: int, k_len: int, *, causal: bool, window: int | None, device) -> torch.Tensor:
    """Boolean ``[1, 1, q, k]`` mask (True: may attend) of a block of ``q_len`` queries that are the last ``q_len``
    of ``k_len`` consecutive positions (cached keys, context, block): causal and/or within ``window`` positions."""
    query = (k_len - q_len + torch.arange(q_len, device=device))[:, None]
    key = torch.arange(k_len, device=device)[None, :]
    visible = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if causal:
        visible &= key <= query
    if window is not None:
        visible &= query - key < window
        if not causal:
            visible &= key - query < window
    return visible[None, None]


# -- 2. attention --------------------------------------------------------------------------------------------------

class DFlashAttention(nn.Module):
    """Block queries attend to [cached keys | context keys | block keys]."""

    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.n_rep = config.num_attention_heads // config.num_key_value_heads
        bias = getattr(config, "attention_bias", False)
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        # A sliding layer is causal unless config.is_causal says otherwise (z-lab's and vLLM's reading).
        self.layer_type = layer_type(config, layer_idx)
        causal = getattr(config, "is_causal", None)
        self.is_causal = self.layer_type == SLIDING if causal is None else bool(causal)
        self.sliding_window = config.sliding_window if self.layer_type == SLIDING else None

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:2], -1, self.head_dim)

    def forward(self, h, ctx, cos, sin, mask=None, cache=None) -> torch.Tensor:
        """``h`` [b, q, hidden]: the normed block states; ``ctx`` [b, n, hidden]: the projected context;
        ``cos`` / ``sin`` [b, n + q, head_dim]: RoPE of the context then the block; ``mask`` [b, 1, q, keys], None,
        or an object whose ``attend(q, k, v, scale)`` computes the attention itself (training's packs of rows)."""
        b, q_len = h.shape[:2]
        q = rotate(self.q_norm(self._heads(self.q_proj(h))).transpose(1, 2), cos[:, -q_len:], sin[:, -q_len:])
        x = torch.cat([ctx, h], dim=1)
        k = rotate(self.k_norm(self._heads(self.k_proj(x))).transpose(1, 2), cos, sin)
        v = self._heads(self.v_proj(x)).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        if mask is None and (self.is_causal or self.sliding_window is not None):
            mask = visibility(q_len, k.shape[2], causal=self.is_causal, window=self.sliding_window, device=h.device)
        if self.n_rep > 1:
            k, v = k.repeat_interleave(self.n_rep, dim=1), v.repeat_interleave(self.n_rep, dim=1)
        if hasattr(mask, "attend"):  # training's packs: each row's blocks attend to that row's keys alone
            out = mask.attend(q, k, v, self.head_dim**-0.5)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


# -- 3. DFlash 2: the grouped dynamic causal convolution ---------------------------------------------------------

class GroupedDynamicCausalConv(nn.Module):
    """``y_t = sum_o (base[o] + dynamic_t[o]) * x_{t-o}`` over ``o < kernel_size`` positions back within the block,
    the kernel shared by each group of ``group_size`` channels in its dynamic part (predicted from ``x_t``).

    Two kernels: index 0 for :meth:`prepare` (before the sublayer), 1 for :meth:`finish` (after it, with the dynamic
    kernel :meth:`prepare` predicted from the sublayer's input). Identity at initialisation: ``base[:, 0] = 1``, the
    rest and ``kernel_projection`` zero."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int, block_size: int):
        super().__init__()
        if hidden_size % group_size:
            raise ValueError(f"conv_group_size {group_size} does not divide the hidden size {hidden_size}")
        self.kernel_size, self.group_size, self.block_size = kernel_size, group_size, block_size
        self.groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)
        self.kernel_projection.dflash_zero_init = True  # whatever order an initialisation pass visits modules in
        self.reset_parameters()

    def reset_parameters(self) -> None:
        identity = torch.zeros_like(self.base_kernel)
        identity[:, 0] = 1.0
        if hasattr(init, "copy_"):  # transformers 5's: leaves a kernel a checkpoint loaded alone
            init.copy_(self.base_kernel, identity)
        else:
            with torch.no_grad():
                self.base_kernel.copy_(identity)
        init.zeros_(self.kernel_projection.weight)

    def _convolve(self, x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        b, n, hidden = x.shape
        blocks = x.view(b, n, self.groups, self.group_size)
        # Position within its block: a value `offset` back exists only where this is >= offset (never the previous
        # block).
        within = torch.arange(n, device=x.device) % self.block_size
        out = torch.zeros_like(blocks)
        for offset in range(self.kernel_size):
            values = blocks if offset == 0 else F.pad(blocks[:, :-offset], (0, 0, 0, 0, offset, 0))
            if offset:
                values = values * (within >= offset).to(values.dtype)[None, :, None, None]
            out = out + base[offset].view(1, 1, self.groups, self.group_size).to(x.dtype) * values
            out = torch.addcmul(out, dynamic[:, :, offset, :, None], values)
        return out.view_as(x)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dynamic = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, self.groups)
        return self._convolve(x, dynamic[..., 0, :, :], self.base_kernel[0]), dynamic[..., 1, :, :]

    def finish(self, x: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        return self._convolve(x, dynamic, self.base_kernel[1])


# -- 4. the decoder layer ------------------------------------------------------------------------------------------

class DFlashDecoderLayer(nn.Module):
    """A Qwen3 decoder layer whose attention also reads the context; DFlash 2 wraps attention and MLP in
    convolutions."""

    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.attention_conv = self.mlp_conv = None
        if is_dflash2(config):
            kernel, group = int(dflash_value(config, "conv_kernel_size")), int(dflash_value(config, "conv_group_size"))
            block = int(dflash_value(config, "block_size", 16))
            self.attention_conv = GroupedDynamicCausalConv(config.hidden_size, kernel, group, block)
            self.mlp_conv = GroupedDynamicCausalConv(config.hidden_size, kernel, group, block)

    def forward(self, h, ctx, cos, sin, mask=None, cache=None) -> torch.Tensor:
        x = self.input_layernorm(h)
        if self.attention_conv is not None:
            x, kernel = self.attention_conv.prepare(x)
        x = self.self_attn(x, ctx, cos, sin, mask, cache)
        if self.attention_conv is not None:
            x = self.attention_conv.finish(x, kernel)
        h = h + x
        x = self.post_attention_layernorm(h)
        if self.mlp_conv is not None:
            x, kernel = self.mlp_conv.prepare(x)
        x = self.mlp(x)
        if self.mlp_conv is not None:
            x = self.mlp_conv.finish(x, kernel)
        return h + x


# -- 5. the drafter ------------------------------------------------------------------------------------------------

class DFlashModules(nn.Module):
    """What a checkpoint holds, under z-lab's names: ``layers.*``, ``fc``, ``hidden_norm``, ``norm`` (and DFlash 2's
    ``layers.*.{attention,mlp}_conv.*``, ``candidate_selector.*``), and the forward."""

    def build(self, config: Qwen3Config) -> None:
        self.block_size = int(dflash_value(config, "block_size", 16))
        self.mask_token_id = int(dflash_value(config, "mask_token_id"))
        self.target_layer_ids = [int(i) for i in dflash_value(config, "target_layer_ids")]
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.fc = nn.Linear(len(self.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.candidate_selector = CandidateSelector(config) if is_dflash2(config) else None
        # Logit scaling some released drafters carry (z-lab's and vLLM's readers honour them; the train stage writes
        # neither).
        self.output_multiplier = float(dflash_value(config, "output_multiplier", 1.0))
        self.softcap = float(dflash_value(config, "final_logit_softcapping", None) or 0.0)

    def init_module(self, module: nn.Module, std: float) -> None:
        """Qwen3's initialisation (normal Linear weights, RMSNorm at one) and DFlash 2's identity / zero starts."""
        if isinstance(module, (GroupedDynamicCausalConv, CandidateSelector)):
            module.reset_parameters()
        elif isinstance(module, nn.Linear):
            if getattr(module, "dflash_zero_init", False):
                init.zeros_(module.weight)
            else:
                init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, Qwen3RMSNorm):
            init.ones_(module.weight)

    def forward(self, position_ids, attention_mask=None, noise_embedding=None, target_hidden=None,
                past_key_values=None, use_cache: bool = False, **kwargs) -> torch.Tensor:
        """The block's final hidden states [b, q, hidden] (:meth:`compute_logits` for logits).

        ``noise_embedding`` [b, q, hidden]: the block tokens embedded by the target (one block, or training's many);
        ``target_hidden`` [b, n, len(target_layer_ids) * hidden]: the target's features of the n context tokens
        new to this call; ``position_ids`` [b, n + q]: absolute positions of the context then the block;
        ``attention_mask``: None (each layer builds its own, from the cache length), a boolean [b, 1, q, keys] (or
        an object with ``attend``: :meth:`DFlashAttention.forward`) for every layer, or ``{layer type: mask}``;
        ``past_key_values``: a transformers cache that takes this call's
        context and block keys (crop it back to the accepted length after)."""
        ctx = self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))
        h = noise_embedding.to(ctx.dtype)
        cos, sin = self.rotary_emb(h, position_ids)
        for layer in self.layers:
            mask = attention_mask
            if isinstance(mask, dict):
                mask = mask[layer.self_attn.layer_type]
            h = layer(h, ctx, cos, sin, mask, past_key_values)
        return self.norm(h)

    def compute_logits(self, hidden: torch.Tensor, output_head: nn.Module) -> torch.Tensor:
        """Logits of the block positions through the target's own output head (the drafter has none)."""
        logits = output_head(hidden)
        if self.output_multiplier != 1.0:
            logits = logits * self.output_multiplier
        if self.softcap > 0:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


# -- 6. DFlash 2: the candidate selector ------------------------------------------------------------------------

class CandidateSelector(nn.Module):
    """Rescores the top-K draft tokens of each block position with a low-rank pairwise term and walks the block.

    ``score(c | p, h_k) = unary_k[c] + <predecessor[p] * W h_k, successor[c]>``: ``p`` is the token chosen at the
    previous position (the verified token at the first), ``h_k`` the drafter's final hidden state there. The codebooks
    are bare ``[vocab, rank]`` tensors (z-lab's checkpoint names:
    ``candidate_selector.{predecessor,successor}_codebook``).
    """

    def __init__(self, config: Qwen3Config):
        super().__init__()
        rank = int(dflash_value(config, "selector_rank"))
        self.top_k = int(dflash_value(config, "selector_top_k"))
        self.std = getattr(config, "initializer_range", 0.02)
        self.predecessor_codebook = nn.Parameter(torch.empty(config.vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.empty(config.vocab_size, rank))
        self.hidden_projection = nn.Linear(config.hidden_size, rank, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.normal_(self.predecessor_codebook, mean=0.0, std=self.std)
        init.zeros_(self.successor_codebook)  # zero: the pairwise term vanishes, the selector picks the argmax
        init.normal_(self.hidden_projection.weight, mean=0.0, std=self.std)

    def candidates(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(unary, ids)`` [..., K]: the top-K logits and their token ids, best first."""
        return torch.topk(logits, self.top_k, dim=-1)

    def scores(self, projected, predecessor, candidates, unary) -> torch.Tensor:
        """Scores [..., K] of ``candidates`` [..., K] after ``predecessor`` [...]; ``projected`` = W h [..., rank]."""
        query = self.predecessor_codebook[predecessor] * projected
        pair = torch.einsum("...r,...kr->...k", query.to(self.successor_codebook.dtype),
                            self.successor_codebook[candidates])
        return unary + pair.to(unary.dtype)

    def select(self, hidden, logits, anchor_ids, temperature: float = 0.0, generator=None):
        """Walk the block from ``anchor_ids`` [b]: ``hidden`` [b, m, hidden] and ``logits`` [b, m, vocab] of the m
        drafted positions. Returns ``(path [b, m], candidates [b, m, K], probs [b, m, K])``: greedy (temperature 0)
        takes each position's best score and ``probs`` is the softmax of the scores; sampled, each position is drawn
        from ``probs`` = softmax(scores / temperature), the K-way proposal the rejection step divides by."""
        unary, candidates = self.candidates(logits)
        projected = self.hidden_projection(hidden)
        predecessor, path, probs = anchor_ids, [], []
        for k in range(hidden.shape[1]):
            scores = self.scores(projected[:, k], predecessor, candidates[:, k], unary[:, k]).float()
            if temperature > 0:
                p = torch.softmax(scores / temperature, dim=-1)
                index = torch.multinomial(p, 1, generator=generator)[:, 0]
            else:
                p = torch.softmax(scores, dim=-1)
                index = scores.argmax(dim=-1)
            predecessor = candidates[:, k].gather(-1, index[:, None])[:, 0]
            path.append(predecessor)
            probs.append(p)
        return torch.stack(path, 1), candidates, torch.stack(probs, 1)


# -- 7. the transformers classes -----------------------------------------------------------------------------------

class DFlashDraftModel(DFlashModules, PreTrainedModel):
    """The drafter for transformers users: z-lab's class name and call signature (see the module docstring)."""

    config_class = Qwen3Config
    base_model_prefix = "dflash"
    _no_split_modules = ["DFlashDecoderLayer"]

    def __init__(self, config: Qwen3Config):
        PreTrainedModel.__init__(self, config)
        self.build(config)
        # transformers' own initialisation pass: also builds the RoPE buffers, which a checkpoint does not hold.
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (GroupedDynamicCausalConv, CandidateSelector, nn.Linear, Qwen3RMSNorm)):
            self.init_module(module, getattr(self.config, "initializer_range", 0.02))
        else:
            super()._init_weights(module)


class DFlash2DraftModel(DFlashDraftModel):
    """DFlash 2: the same class, its ``architectures`` entry adding the convolutions and the candidate selector."""
