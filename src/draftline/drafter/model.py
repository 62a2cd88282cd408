"""draftline's side of the drafter: the config it is built from, the target it borrows, decoding, and checkpoints.

What makes it DFlash (z-lab, "Block Diffusion for Flash Speculative Decoding") and DFlash 2 is written once, in
:mod:`draftline.drafter.modeling_dflash`, the self-contained file every checkpoint carries (with ``auto_map``); the
:class:`DFlashDrafter` here *is* those modules (the same forward), and adds what training and decoding here need:

* the embedding and the lm_head are the target's own, frozen: they are borrowed (:class:`SharedTarget`), never
  saved, so a checkpoint holds only the drafter's weights under z-lab's names, which SGLang, vLLM and z-lab's
  ``dflash`` load as ``DFlashDraftModel`` / ``DFlash2DraftModel`` (``architectures`` chooses);
* :meth:`DFlashDrafter.draft` drafts one block after the accepted prefix with a :class:`DraftCache` of the context's
  keys and values, and :meth:`DFlashDrafter.select` walks a DFlash 2 drafter's candidate selector;
* a checkpoint's weights are in the target's dtype; its config.json has what transformers 4.5x and 5.x both read.
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
from transformers import DynamicCache, Qwen3Config

from draftline.core.errors import Refusal
from draftline.core.files import atomic_path
from draftline.drafter.modeling_dflash import DFLASH, DFLASH2, FULL, SLIDING, DFlashModules, is_dflash2

ARCHITECTURES = {"dflash": DFLASH, "dflash2": DFLASH2}
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# The self-contained modeling file copied into every checkpoint (config.json's auto_map names its class there).
MODELING_FILE = "modeling_dflash.py"
# DFlash 2's fields of dflash_config (z-lab's layout, e.g. SpecForge's configs/qwen3.6-27b-dflash2.json).
DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")

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
    architecture: str = "dflash",
    dflash2: dict[str, int] | None = None,
    sliding_window: int | None = None,
    max_window_layers: int | None = None,
) -> Qwen3Config:
    """The drafter's config: the target's shapes, ``num_layers`` layers, the DFlash fields in z-lab's layout, and
    ``lineage`` (what its training data was made with, under ``draftline``: see :func:`lineage_of`).

    ``architecture`` ``dflash2`` adds ``dflash2``'s fields (:data:`DFLASH2_FIELDS`) and ``block_size`` to
    ``dflash_config``. ``sliding_window`` (tokens) makes layers ``max_window_layers`` and up sliding-window layers,
    written as Qwen3 configs need it (``use_sliding_window``, ``max_window_layers``, and ``layer_types`` spelt out)."""
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
    dflash_config: dict[str, Any] = {"target_layer_ids": list(target_layer_ids), "mask_token_id": int(mask_token_id)}
    if architecture == "dflash2":
        missing = [k for k in DFLASH2_FIELDS if k not in (dflash2 or {})]
        if missing:
            raise DrafterMismatch(f"a DFlash 2 drafter needs {missing}")
        dflash_config = {"block_size": int(block_size), **{k: int(dflash2[k]) for k in DFLASH2_FIELDS},
                         **dflash_config}
    elif architecture != "dflash":
        raise DrafterMismatch(f"unknown drafter architecture {architecture!r}: dflash or dflash2")
    window: dict[str, Any] = {}
    if sliding_window is not None:
        first = num_layers if max_window_layers is None else int(max_window_layers)
        window = {"use_sliding_window": True, "sliding_window": int(sliding_window), "max_window_layers": first,
                  "layer_types": [SLIDING if i >= first else FULL for i in range(num_layers)]}
    return Qwen3Config(
        **shared,
        **window,
        num_hidden_layers=num_layers,
        architectures=[ARCHITECTURES[architecture]],
        block_size=block_size,
        num_target_layers=n_target,
        dflash_config=dflash_config,
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
    out["auto_map"] = {"AutoModel": f"{MODELING_FILE.removesuffix('.py')}.{out['architectures'][0]}"}
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
        A DFlash 1 drafter has no selector: refused."""
        if self.candidate_selector is None:
            raise DrafterMismatch("select() needs a DFlash 2 drafter (a candidate selector); this one is DFlash 1")
        return self.candidate_selector.select(block.hidden, block.logits, verified_token, temperature, generator)

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
        """Load a drafter saved in z-lab's layout (DFlash 1 or 2); bind it to ``target`` when given."""
        model = cls(read_config(path))
        model.load_state_dict(
            {k: v.to(model.fc.weight.dtype) for k, v in read_weights(path).items()}, strict=True)
        if target is not None:
            model.bind(target)
            model.to(target.get_input_embeddings().weight.device)
        return model.eval()


def read_config(path: str | Path) -> Qwen3Config:
    """A drafter checkpoint's config (draftline's or z-lab's layout: ``architectures`` names DFlash 1 or 2)."""
    path = Path(path)
    raw = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    if not set(ARCHITECTURES.values()) & set(raw.get("architectures") or []):
        raise DrafterMismatch(f"{path / CONFIG_FILE} is not a {' or '.join(ARCHITECTURES.values())} config: "
                              f"{raw.get('architectures')}")
    for key in ("dtype", "torch_dtype", "auto_map", "transformers_version"):
        raw.pop(key, None)
    return Qwen3Config(**raw)


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors, one ``model.safetensors`` or the shards its index names; a ``model.`` prefix (some
    trainers write it) dropped."""
    path = Path(path)
    index = path / f"{WEIGHTS_FILE}.index.json"
    files = ([path / f for f in sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))]
             if index.exists() else [path / WEIGHTS_FILE])
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update({k.removeprefix("model."): v for k, v in load_file(str(f)).items()})
    return state

