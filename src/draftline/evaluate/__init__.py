"""The ``evaluate`` stage: the drafter judged by greedy speculative decoding of held-out prompts, verified by the
target (``speculative``), reported as tau and acceptance by position (``report``); ``stage`` runs it."""
