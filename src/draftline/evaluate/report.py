"""What an evaluation found: the headline (tau, the lowest source's tau, losslessness), the report (tau per source,
forwards saved, stop reasons...) and the acceptance rate by draft position (the stage's plot)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from draftline.drafter.decoding import Generation

ACCEPTANCE_COLUMNS = ["position", "steps", "accepted", "accept_rate", "conditional_rate"]


@dataclass
class PromptResult:
    id: str
    source: str
    prompt_tokens: int
    baseline: Generation
    speculative: Generation

    @property
    def identical(self) -> bool:
        return self.baseline.tokens == self.speculative.tokens


def _tau(results: list[PromptResult]) -> float | None:
    steps = sum(r.speculative.steps for r in results)
    return round(sum(sum(r.speculative.produced) for r in results) / steps, 4) if steps else None


def summarize(results: list[PromptResult], block_size: int, max_new_tokens: int,
              enable_thinking: bool | None) -> dict[str, Any]:
    """The report: tau pooled over all verification steps and per source, losslessness, forwards saved, accounting
    (the skipped prompts are the stage's skips, which the runner adds)."""
    by_source: dict[str, list[PromptResult]] = defaultdict(list)
    for r in results:
        by_source[r.source].append(r)
    with_drafter = sum(r.speculative.target_forwards for r in results)
    without = sum(r.baseline.target_forwards for r in results)
    steps = sum(r.speculative.steps for r in results)
    return {
        "n_prompts": len(results),
        "n_prompts_per_source": {s: len(rs) for s, rs in sorted(by_source.items())},
        "tau": _tau(results),
        "tau_per_source": {s: _tau(rs) for s, rs in sorted(by_source.items())},
        "lossless": round(sum(r.identical for r in results) / len(results), 4) if results else None,
        "mismatched_prompts": sorted(r.id for r in results if not r.identical),
        "target_forwards": {
            "with_drafter": with_drafter,
            "without_drafter": without,
            "saved_fraction": round(1 - with_drafter / without, 4) if without else None,
        },
        "verification_steps": steps,
        "mean_accepted_drafts": round(sum(sum(r.speculative.accepted) for r in results) / steps, 4) if steps else None,
        "generated_tokens": sum(len(r.speculative.tokens) for r in results),
        "stop_reasons": dict(sorted(Counter(r.speculative.stop_reason for r in results).items())),
        "block_size": block_size,
        "max_new_tokens": max_new_tokens,
        "enable_thinking": enable_thinking,
    }


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The figures compared between experiments: ``tau``, ``tau_min`` (the lowest source's tau: the drafter's
    weakest kind of prompt) and ``lossless``."""
    per_source = [t for t in report["tau_per_source"].values() if t is not None]
    return {"tau": report["tau"], "tau_min": min(per_source) if per_source else None, "lossless": report["lossless"]}


def acceptance_by_position(results: list[PromptResult], block_size: int) -> list[dict[str, Any]]:
    """Per draft position k: how often the target accepted it (``accept_rate``), and how often when k-1 was.

    Position k is accepted when the first k drafts all match; a falling ``conditional_rate`` shows where in the
    block the drafter loses the thread.
    """
    pairs = [(a, d) for r in results for a, d in zip(r.speculative.accepted, r.speculative.drafted)]
    rows = []
    for k in range(1, block_size):
        steps = sum(1 for _, d in pairs if d >= k)
        reached = sum(1 for a, d in pairs if d >= k and a >= k - 1)
        accepted = sum(1 for a, _ in pairs if a >= k)
        rows.append({
            "position": k,
            "steps": steps,
            "accepted": accepted,
            "accept_rate": round(accepted / steps, 4) if steps else 0.0,
            "conditional_rate": round(accepted / reached, 4) if reached else 0.0,
        })
    return rows
