"""Decoding one request: every turn rendered as the target saw its prompts in generation, drafted by the drafter,
verified by the target, and (greedy) checked against the target alone.

Invariants: a request's results depend on the request, its setting and the models alone. Every random draw comes
from the turn's own seed (``evaluate.seed``, setting, request, turn: :func:`turn_seed`), and the target's and the
drafter's caches start empty at every turn, so requests can be decoded in any order, in any process
(:mod:`draftline.evaluate.pool`), and give the same tokens on the same machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftline.core.logs import get_logger
from draftline.core.records import TargetInfo
from draftline.core.requests import Request, render_prompt, stop_token_ids, turn_seed
from draftline.core.skips import Skips
from draftline.core.target_loader import load_model, load_tokenizer
from draftline.drafter.config import lineage_of
from draftline.drafter.fit import check_lineage, load_fitting, resolve_device, torch_dtype
from draftline.drafter.model import DFlashDrafter
from draftline.drafter.speculative import DFlashProposer, Proposer, Sampling, greedy_reference, speculative_generate
from draftline.evaluate.params import EvalParams
from draftline.evaluate.report import TurnResult, selector_counts

log = get_logger(__name__)


@dataclass
class Decoder:
    """What decodes every turn of one run: the models, the drafter's proposer, and how."""

    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    proposer: Proposer
    stop_ids: set[int]
    params: EvalParams
    enable_thinking: bool | None  # the training data's mode (null: the template's own); a request names its own

    def request(self, setting: str, sampling: Sampling, req: Request, thinking: bool | None,
                skips: Skips) -> list[TurnResult]:
        """Every turn of ``req`` rendered in ``thinking`` mode, each next user turn after the target's own reply; a
        turn that cannot be rendered or is too long is a counted skip and ends the request (its later turns would
        lack their context)."""
        messages, results = list(req.prefix), []
        for turn, user in enumerate(req.turns):
            messages.append(user)
            try:
                ids = render_prompt(self.tokenizer, messages, req.tools, thinking)
            except Exception as e:  # a template error names one bad prompt; the rest still count
                skips.add("chat template failed", f"{req.id}#{turn}", f"{type(e).__name__}: {e}")
                break
            if len(ids) > self.params.max_prompt_tokens:
                skips.add("prompt longer than max_prompt_tokens", f"{req.id}#{turn}", f"{len(ids)} tokens")
                break
            seed = turn_seed(self.params.seed, setting, req, turn)
            spec = speculative_generate(self.target, self.proposer, ids, self.params.max_new_tokens, self.stop_ids,
                                        sampling, seed)
            base = None
            if sampling.greedy:  # sampled outputs are checked by distribution (tests), not byte for byte
                base = greedy_reference(self.target, ids, spec.tokens, self.stop_ids)
                if base.tokens != spec.tokens:
                    at = next((i for i, (a, b) in enumerate(zip(base.tokens, spec.tokens)) if a != b), None)
                    log.error("%s turn %d: speculative output differs from target-only greedy at token %s",
                              req.id, turn, at)
            selector = None
            if sampling.greedy and getattr(self.proposer, "steps", None):
                selector = selector_counts(self.proposer.steps, ids + spec.tokens)
            results.append(TurnResult(setting, req.set, req.source, req.id, turn, len(ids), spec, base, selector))
            messages.append({"role": "assistant",
                             "content": self.tokenizer.decode(spec.tokens, skip_special_tokens=True)})
        return results


def load_models(
    info: TargetInfo, checkpoint: str | os.PathLike, params: EvalParams
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, DFlashDrafter]:
    """The target (from its folder, in place) and the drafter bound to it, on one device in one dtype.

    A drafter whose training data was made with another tokenizer than the target's is refused: its ids would
    mean other tokens."""
    check_lineage(checkpoint, info)  # before the target loads: a foreign drafter is refused at once
    target = load_model(info, dtype=torch_dtype(params.dtype), device=resolve_device(params.device))
    return target, load_tokenizer(info), load_fitting(checkpoint, info, target)


def build_decoder(info: TargetInfo, checkpoint: str | os.PathLike, params: EvalParams) -> Decoder:
    """The models loaded and bound into a :class:`Decoder`; prompts are rendered in the thinking mode the drafter's
    training data was generated in (null: the template's own)."""
    target, tokenizer, drafter = load_models(info, checkpoint, params)
    thinking = lineage_of(drafter.config)["enable_thinking"]
    return Decoder(target, tokenizer, DFlashProposer(drafter), stop_token_ids(info), params, thinking)
