"""The progress of one run: a tqdm bar over conversations, and this run's counts and speeds.

Invariants: it counts only what THIS run finished (results resumed from the journal are not in it), so its figures
vary from run to run of the same inputs and go to the run file, never to the metrics or the report; it never
touches a result.
"""

from __future__ import annotations

import time
from typing import Any

from tqdm import tqdm


class Progress:
    """A tqdm bar over conversations with output tokens/s beside completions/s and the ETA."""

    def __init__(self, total: int):
        self.bar = tqdm(total=total, unit="completion", desc="generate", dynamic_ncols=True, mininterval=0.5)
        self.t0 = time.monotonic()
        self.output_tokens = 0
        self.finished = 0
        self.seconds = 0.0
        self._shown = 0.0

    def done(self, entry: dict[str, Any]) -> None:
        self.finished += 1
        self.output_tokens += entry["usage"]["completion_tokens"]
        self.bar.update(1)
        now = time.monotonic()
        if now - self._shown > 1.0:
            self._shown = now
            self.bar.set_postfix_str(f"{self.output_tokens / max(now - self.t0, 1e-9):.0f} out tok/s", refresh=False)

    def close(self) -> None:
        """Stop the bar and the clock (the generation's seconds: from before the first request to the last result)."""
        self.seconds = time.monotonic() - self.t0
        self.bar.close()

    def figures(self) -> dict[str, Any]:
        """This run's counts and speeds, for the run file."""
        wall = self.seconds
        return {
            "finished": self.finished,
            "output_tokens": self.output_tokens,
            "generation_seconds": round(wall, 2),
            "completions_per_s": round(self.finished / wall, 3) if wall > 0 else 0.0,
            "output_tokens_per_s": round(self.output_tokens / wall, 1) if wall > 0 else 0.0,
        }
