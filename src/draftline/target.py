"""The ``target`` stage: describe the target model once, in ``data/target/target.json``, for every later stage.

``target.path`` is either a Hugging Face checkpoint folder, used in place (never copied; a folder with only
tokenizer files is enough for the CPU stages), or ``embedded``: a tiny Qwen3-style target trained here from the
sample conversations and saved under ``data/target/model/``.

Later stages use :func:`load_target`, then :func:`load_tokenizer` / :func:`load_model`: nothing else needs to know
where the target lives or whether it is the embedded one.

The drafter's mask token must be an id that never occurs in training data: by default the highest-id *special*
added token that the chat template never writes and that is not eos/pad/bos/end-of-turn. Special added tokens are
only produced when their literal text is in the input, and decoding skips them. For Qwen3 that is
``<|video_pad|>`` (151656), a vision placeholder that text-only data never holds; for the embedded target it is its
last reserved token. The choice depends on the tokenizer alone, so a tokenizer-only folder (a CPU box) and the full
checkpoint (the GPU box) agree. ``target.mask_token_id`` overrides it, e.g. to match an existing drafter
(an id past the tokenizer, in the embedding's padding rows, is accepted when config.json shows those rows exist).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftline.files import atomic_path, write_csv, write_json, write_jsonl
from draftline.fingerprint import model_fingerprint, template_sha256, tokenizer_fingerprint
from draftline.logs import get_logger
from draftline.records import Conversation, TargetInfo
from draftline.skips import Skips

if TYPE_CHECKING:
    from draftline.embedded_target import EmbeddedBuild

log = get_logger("target")

EMBEDDED = "embedded"
TARGET_JSON = "target.json"
MODEL_DIR = "model"
END_OF_TURN = "<|im_end|>"
THINK_TAGS = ("<think>", "</think>")
LOSS_COLUMNS = ["step", "loss", "lr"]


# ---------------------------------------------------------------------------------------------- for later stages


def load_target(target_dir: str | os.PathLike = "data/target") -> TargetInfo:
    """Read ``target.json``; its relative ``path`` is resolved against ``target_dir``, so the result works anywhere."""
    target_dir = Path(target_dir)
    file = target_dir / TARGET_JSON
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist: run the target stage first (dvc repro target)")
    info = TargetInfo.from_dict(json.loads(file.read_text(encoding="utf-8")))
    if not os.path.isabs(info.path):
        info.path = os.path.normpath(target_dir.absolute() / info.path)
    return info


def load_tokenizer(info: TargetInfo, check: bool = True):
    """The target's tokenizer (``AutoTokenizer``, local files only).

    ``check`` recomputes the tokenizer fingerprint (milliseconds): a folder whose tokenizer changed after the
    target stage ran would otherwise make data that silently disagrees with ``target.json``.
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(info.path, local_files_only=True)
    if check and tokenizer_fingerprint(info.path, tok.chat_template) != info.tokenizer_fingerprint:
        raise ValueError(
            f"the tokenizer in {info.path} changed since the target stage described it; "
            "rerun it (dvc repro -f target) and the stages after it"
        )
    return tok


def load_model(info: TargetInfo, dtype: Any = "auto", device: Any = None):
    """The target model (``AutoModelForCausalLM``, local files only), in eval mode."""
    from transformers import AutoModelForCausalLM

    if info.model_fingerprint is None:
        raise ValueError(
            f"{info.path} holds no model weights (only a tokenizer): point target.path at the full checkpoint"
        )
    model = AutoModelForCausalLM.from_pretrained(info.path, dtype=dtype, local_files_only=True)
    if device is not None:
        model = model.to(device)
    return model.eval()


# ------------------------------------------------------------------------------------------ describing a folder


def _read_config(folder: Path) -> dict[str, Any] | None:
    """config.json's text-model fields; multimodal checkpoints (Qwen3.5/3.6) keep them under ``text_config``."""
    file = folder / "config.json"
    if not file.is_file():
        return None
    cfg = json.loads(file.read_text(encoding="utf-8"))
    text = cfg.get("text_config") or {}
    return {k: cfg.get(k, text.get(k)) for k in ("num_hidden_layers", "hidden_size", "vocab_size")}


def _added_id(tok, token: str) -> int | None:
    """The id of ``token`` when the tokenizer has it as one piece (an added token), else None."""
    for tid, added in tok.added_tokens_decoder.items():
        if added.content == token:
            return tid
    return None


def _template_text(template: str | dict[str, str]) -> str:
    return template if isinstance(template, str) else "\n".join(template.values())


def pick_mask_token(tok, template: str | dict[str, str], reserved: set[int]) -> int:
    """The highest-id special added token the template never writes and that is not in ``reserved``."""
    text = _template_text(template)
    for tid in sorted(tok.added_tokens_decoder, reverse=True):
        added = tok.added_tokens_decoder[tid]
        if added.special and added.content not in text and tid not in reserved:
            return tid
    raise ValueError(
        "the tokenizer has no special added token that its chat template leaves unused; "
        "set target.mask_token_id to an id the target never produces"
    )


def _check_mask_token(tok, template: str | dict[str, str], mask_id: int, reserved: set[int], rows: int | None) -> None:
    """An explicit mask id must be an added special token the template never writes, or an embedding padding row."""
    if mask_id in reserved:
        raise ValueError(f"target.mask_token_id={mask_id} is eos/pad/bos/end-of-turn; choose an unused id")
    added = tok.added_tokens_decoder.get(mask_id)
    if added is not None:
        if not added.special or added.content in _template_text(template):
            raise ValueError(
                f"target.mask_token_id={mask_id} is {added.content!r}, which the chat template writes or decoding "
                "keeps; choose a special token the template never uses"
            )
    elif mask_id < len(tok):
        raise ValueError(
            f"target.mask_token_id={mask_id} is an ordinary vocabulary token that text encodes to; "
            "choose a reserved special token or an embedding padding row"
        )
    elif rows is None:
        raise ValueError(
            f"target.mask_token_id={mask_id} lies past the tokenizer ({len(tok)} tokens) and this folder has no "
            "config.json to show that the embedding has such a row; add config.json beside the tokenizer"
        )
    elif mask_id >= rows:
        raise ValueError(f"target.mask_token_id={mask_id} is outside the embedding ({rows} rows, config.json)")


def describe_target(
    folder: str | os.PathLike, mask_token_id: int | None = None, hash_weights: bool = True, embedded: bool = False
) -> TargetInfo:
    """Everything later stages need to know about the checkpoint (or tokenizer-only) folder ``folder``."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"target.path {folder} is not a folder; give a Hugging Face checkpoint folder or 'embedded'")
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    template = tok.chat_template
    if not template:
        raise ValueError(f"the tokenizer in {folder} has no chat template; add chat_template.jinja")
    if tok.eos_token_id is None:
        raise ValueError(f"the tokenizer in {folder} has no eos token (tokenizer_config.json: eos_token)")
    eot_id = _added_id(tok, END_OF_TURN)
    eot, eot_id = (END_OF_TURN, eot_id) if eot_id is not None else (tok.eos_token, tok.eos_token_id)
    think = [t if _added_id(tok, t) is not None else None for t in THINK_TAGS]

    config = _read_config(folder)
    rows = config["vocab_size"] if config else None
    if rows is not None and rows < len(tok):
        raise ValueError(f"{folder}: the tokenizer has {len(tok)} tokens but config.json vocab_size is only {rows}")
    reserved = {i for i in (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id, tok.unk_token_id, eot_id) if i is not None}
    if mask_token_id is None:
        mask_token_id = pick_mask_token(tok, template, reserved)
    else:
        _check_mask_token(tok, template, mask_token_id, reserved, rows)

    return TargetInfo(
        path=str(folder),
        tokenizer_fingerprint=tokenizer_fingerprint(folder, template),
        chat_template_sha256=template_sha256(template),
        eos_token=tok.eos_token,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        end_of_turn_token=eot,
        end_of_turn_token_id=eot_id,
        think_start_token=think[0],
        think_end_token=think[1],
        mask_token_id=mask_token_id,
        vocab_size=rows if rows is not None else len(tok),
        num_hidden_layers=config["num_hidden_layers"] if config else None,
        hidden_size=config["hidden_size"] if config else None,
        model_fingerprint=model_fingerprint(folder, hash_weights),
        embedded=embedded,
    )


# ------------------------------------------------------------------------------------------------------ the stage


def source_conversations(sources: Mapping[str, Any], raw_root: str | os.PathLike, skips: Skips) -> Iterator[Conversation]:
    """Every readable conversation of every source (``data/raw/<name>``), read by the prompt stage's adapters."""
    from draftline.prompts.adapters import iter_conversations

    for name, cfg in sources.items():
        raw_dir = Path(raw_root) / name
        if not raw_dir.is_dir():
            raise FileNotFoundError(f"{raw_dir} does not exist: run the sources stage first (dvc repro sources)")
        yield from iter_conversations(name, cfg, str(raw_dir), skips)


def _relative_path(path: str, target_dir: Path) -> str:
    """An absolute ``target.path`` is kept as given; a relative one is rewritten relative to ``target_dir``."""
    return path if os.path.isabs(path) else os.path.relpath(path, target_dir)


def write_target(
    params: Mapping[str, Any], target_dir: str | os.PathLike, conversations: Iterable[Conversation] = (),
    skips: Skips | None = None,
) -> EmbeddedBuild | None:
    """Write ``target_dir`` at once (or not at all): ``target.json``, and for the embedded target ``model/`` and
    ``greedy_samples.jsonl``, trained on ``conversations`` (consumed only then). Returns the embedded build, if any.
    """
    target_dir = Path(target_dir)
    path = str(params["path"])
    mask_token_id, hash_weights = params.get("mask_token_id"), bool(params.get("hash_weights", True))
    build = None
    with atomic_path(target_dir) as tmp:
        tmp.mkdir()
        if path == EMBEDDED:
            # Imported here: torch costs every other stage seconds at start-up, and only this build needs it.
            from draftline.embedded_target import EmbeddedSpec, build_embedded_target

            spec = EmbeddedSpec.from_params(params.get("embedded") or {}, seed=int(params.get("seed", 0)))
            build = build_embedded_target(conversations, tmp / MODEL_DIR, spec, skips or Skips(log))
            info = describe_target(tmp / MODEL_DIR, mask_token_id, hash_weights, embedded=True)
            info.path = MODEL_DIR
            write_jsonl(tmp / "greedy_samples.jsonl", build.samples)
        else:
            info = describe_target(path, mask_token_id, hash_weights)
            info.path = _relative_path(path, target_dir)
        write_json(tmp / TARGET_JSON, info.to_dict())
    return build


def run_target(
    params: Mapping[str, Any],
    sources: Mapping[str, Any],
    target_dir: str | os.PathLike = "data/target",
    raw_root: str | os.PathLike = "data/raw",
    metrics_path: str | os.PathLike = "metrics/target.json",
    plot_path: str | os.PathLike = "plots/target_loss.csv",
) -> TargetInfo:
    """The stage: ``target_dir``, its metrics and the loss curve (empty for a real checkpoint)."""
    t0 = time.perf_counter()
    skips = Skips(log)
    conversations = source_conversations(sources, raw_root, skips) if params["path"] == EMBEDDED else ()
    build = write_target(params, target_dir, conversations, skips)
    info = load_target(target_dir)
    metrics = dict(build.metrics) if build else {}
    metrics.update(
        embedded=info.embedded, num_hidden_layers=info.num_hidden_layers, hidden_size=info.hidden_size,
        vocab_size=info.vocab_size, skipped=skips.as_dict(), stage_wall_s=round(time.perf_counter() - t0, 1),
    )
    write_json(metrics_path, metrics)
    write_csv(plot_path, build.loss_curve if build else [], LOSS_COLUMNS)
    log.info("target: %s (%s layers, hidden %s, mask token %d)", info.path, info.num_hidden_layers, info.hidden_size, info.mask_token_id)
    return info
