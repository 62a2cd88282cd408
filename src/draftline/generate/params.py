"""``params.yaml: generate``: the backend, the sampling (part of the journal key) and how requests are sent.

Every Params dataclass of the stage lives here (:class:`GenerateParams`, :class:`LocalParams`; ``launch`` is
:class:`~draftline.core.launch.LaunchParams`, shared with the serve stage); :func:`load` is what
``stages/generate.py`` reads. No field has a default: params.yaml
holds them all."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Literal

from draftline.core.launch import LaunchParams
from draftline.core.params import Params, ParamsError
from draftline.core.threads import idle_cores

# The sampling params: with the target, thinking mode, backend (and the local backend's settings) they decide a
# result, so they make up the journal key; the transport settings do not.
SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed")


@dataclass(frozen=True)
class LocalParams(Params):
    """``generate.local``: the target in-process (batch shape changes float results: part of the journal key)."""

    device: str
    dtype: Literal["float32", "bfloat16", "float16", "auto"]
    batch_size: int
    threads: int
    # Processes sharing the fixed batches; not part of the journal key: a batch's result does not depend on them.
    workers: int | Literal["auto"]

    def validate(self, where: str) -> None:
        if self.batch_size < 1 or (self.workers != "auto" and self.workers < 1) or self.threads < 0:
            raise ParamsError(f"params.yaml: {where}: batch_size must be >= 1, workers >= 1 or auto, threads >= 0")

    def num_workers(self) -> int:
        """``workers``, or with ``auto``: one per core idle now on the CPU (core/threads.py), one on a GPU (each
        worker loads the target)."""
        if self.workers != "auto":
            return self.workers
        import torch

        on_gpu = self.device != "cpu" and (self.device != "auto" or torch.cuda.is_available())
        return 1 if on_gpu else idle_cores()


@dataclass(frozen=True)
class GenerateParams(Params):
    """``params.yaml: generate`` (documented there and in docs/generate.md)."""

    # local: the target in-process; sglang: HTTP servers; dataset: each prompt's own dataset answer, no target.
    backend: Literal["local", "sglang", "dataset"]
    enable_thinking: bool
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    shard_size: int
    keep_truncated: bool
    # The most of the replies that may end cut at max_tokens: above it the stage stops naming max_tokens, writing
    # nothing (report.check_truncated); the journal keeps the replies. Not part of the journal key.
    max_truncated_share: float
    # true: the first bad line of the prompts file stops the stage; false: it is counted (``skipped``) and skipped.
    strict: bool
    model: str | None
    endpoints: list[str]
    concurrency: int
    timeout_s: float
    retries: int
    backoff_s: float
    backoff_max_s: float
    # The name of an environment variable holding the servers' API key (never the key itself: params are in git).
    api_key_env: str | None
    launch: LaunchParams | None
    local: LocalParams
    # A drafter checkpoint folder (e.g. the previous round's, under data/drafters/): the target verifies its blocks, so
    # generation is faster and the result the same (greedy: the same bytes). Not part of the journal key.
    draft_model: str | None

    def api_key(self) -> str | None:
        """The bearer token from ``$<api_key_env>``; a named variable that is unset or empty is an error."""
        if self.api_key_env is None:
            return None
        token = os.environ.get(self.api_key_env, "")
        if not token:
            raise ParamsError(f"generate.api_key_env names ${self.api_key_env}, which is unset or empty: export the "
                              "servers' API key in it (or set generate.api_key_env: null)")
        return token

    def validate(self, where: str) -> None:
        if self.max_tokens < 1 or self.shard_size < 1 or self.concurrency < 1 or self.retries < 0:
            raise ParamsError(f"params.yaml: {where}: max_tokens, shard_size and concurrency must be >= 1, retries >= 0")
        if not 0.0 <= self.max_truncated_share <= 1.0:
            raise ParamsError(f"params.yaml: {where}.max_truncated_share must be in [0, 1], got {self.max_truncated_share}")
        if self.backend == "sglang" and self.launch is None and not self.endpoints:
            raise ParamsError(f"params.yaml: {where}.endpoints is empty: list at least one server URL, e.g. "
                              "http://127.0.0.1:30000 (or set generate.launch to start SGLang here)")

    @property
    def sampling(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SAMPLING_KEYS}

    def local_dict(self) -> dict[str, Any]:
        """The local settings that decide a result (the journal key's part): all but ``workers``."""
        decides = asdict(self.local)
        del decides["workers"]
        return decides


def load(_args: object = None) -> GenerateParams:
    """``params.yaml: generate``, checked whole (the stage reads nothing else of params.yaml)."""
    return GenerateParams.load("generate")
