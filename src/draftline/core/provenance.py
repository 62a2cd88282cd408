"""How each training row was made, from the completion to the merged set: the target, the engine, the sampling and
the thinking mode, kept per row without a column.

A completion's ``generation`` (:class:`draftline.core.records.CompletionRecord`) names everything; a row keeps
:data:`FIELDS` of it (:func:`of_generation`; the tokenizer fingerprint is the whole dataset's, in ``draftline.json``).
A shard records its rows' provenance as **runs** in its :class:`~draftline.core.dataset.ShardInfo`: consecutive rows
of one provenance as ``{"rows", "tokens", "generation"}``, in row order. Rows of one generate run share one run, so
the record is a few lines a shard, and the shard files keep the schema every trainer reads: a carried shard keeps
its record, and a shard written before provenance was recorded (``provenance: null``) counts as :data:`UNKNOWN`.

Invariants: the runs of a shard cover its rows exactly, in order; a provenance has one encoding whether made or read
back (:func:`of_generation`); a label (:func:`labels`) is a pure function of the recorded dict, so the same rows give
the same report on every machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from draftline.core.records import TargetInfo

# What a row keeps of its completion's ``generation``.
FIELDS = ("model_fingerprint", "engine", "sampling", "enable_thinking")
# The report's name for each field, and the label of a row that recorded none (a shard written before provenance).
KINDS = ("target", "engine", "sampling", "thinking")
UNKNOWN = "unknown"


def model_identity(info: TargetInfo) -> str:
    """The target's model fingerprint as completions record it: its path where it has none (a tokenizer folder)."""
    return info.model_fingerprint or f"path:{info.path}"


def of_generation(generation: dict[str, Any]) -> str:
    """A row's provenance, encoded (one string per distinct provenance: rows compare and group by it). Keys sorted
    at every depth, as ``draftline.json`` stores them, so a provenance read back encodes to the same string."""
    return json.dumps({k: generation.get(k) for k in FIELDS}, sort_keys=True, ensure_ascii=False,
                      separators=(",", ":"))


def runs(provenance: Sequence[str | None], num_tokens: np.ndarray) -> list[dict[str, Any]]:
    """Consecutive rows of one provenance (an encoded :func:`of_generation`, or None: not recorded) as runs."""
    out: list[dict[str, Any]] = []
    for i, p in enumerate(provenance):
        if out and out[-1]["key"] == p:
            out[-1]["rows"] += 1
            out[-1]["tokens"] += int(num_tokens[i])
        else:
            out.append({"key": p, "rows": 1, "tokens": int(num_tokens[i])})
    return [{"rows": r["rows"], "tokens": r["tokens"],
             "generation": json.loads(r["key"]) if r["key"] is not None else None} for r in out]


def per_row(shard_runs: list[dict[str, Any]] | None, num_rows: int) -> list[str | None]:
    """A shard's runs back to one encoded provenance per row (None throughout where it recorded none)."""
    if shard_runs is None:
        return [None] * num_rows
    out: list[str | None] = []
    for r in shard_runs:  # encoded once a run, not once a row
        out += [of_generation(r["generation"]) if r["generation"] is not None else None] * r["rows"]
    return out


def labels(generation: dict[str, Any] | None) -> dict[str, str]:
    """The report's label of each :data:`KINDS` for one recorded provenance (all :data:`UNKNOWN` for none)."""
    if generation is None:
        return dict.fromkeys(KINDS, UNKNOWN)
    engine = generation.get("engine") or {}
    sampling = generation.get("sampling")
    thinking = generation.get("enable_thinking")
    return {
        "target": generation.get("model_fingerprint") or UNKNOWN,
        # name and version, then what else it names (the local backend's torch)
        "engine": " ".join([str(engine[k]) for k in ("name", "version") if engine.get(k)]
                           + [f"{k} {v}" for k, v in sorted(engine.items()) if k not in ("name", "version") and v])
        or UNKNOWN,
        # null: nothing was sampled (the dataset's own answers)
        "sampling": " ".join(f"{k}={v}" for k, v in sorted(sampling.items())) if sampling else "none",
        "thinking": UNKNOWN if thinking is None else "on" if thinking else "off",
    }


def mix(shard_runs: Iterable[tuple[list[dict[str, Any]] | None, int, int]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Rows, tokens and their shares per label of each kind, over shards given as ``(runs, rows, tokens)`` (a shard
    without runs counts whole as :data:`UNKNOWN`)."""
    counts: dict[str, dict[str, list[int]]] = {k: {} for k in KINDS}
    for recorded, rows, tokens in shard_runs:
        for r in recorded if recorded is not None else [{"rows": rows, "tokens": tokens, "generation": None}]:
            for kind, label in labels(r["generation"]).items():
                c = counts[kind].setdefault(label, [0, 0])
                c[0] += r["rows"]
                c[1] += r["tokens"]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for kind, by_label in counts.items():
        rows, tokens = sum(c[0] for c in by_label.values()), sum(c[1] for c in by_label.values())
        out[kind] = {label: {"rows": c[0], "tokens": c[1], "row_share": round(c[0] / rows, 4) if rows else 0.0,
                             "token_share": round(c[1] / tokens, 4) if tokens else 0.0}
                     for label, c in sorted(by_label.items())}
    return out


def other_targets(shard_runs: Iterable[list[dict[str, Any]] | None], target: str) -> dict[str, int]:
    """Rows per model fingerprint other than ``target`` (rows that recorded none are not counted: unknown)."""
    found: dict[str, int] = {}
    for recorded in shard_runs:
        for r in recorded or []:
            fp = (r["generation"] or {}).get("model_fingerprint")
            if fp is not None and fp != target:
                found[fp] = found.get(fp, 0) + r["rows"]
    return found
