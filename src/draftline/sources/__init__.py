"""The ``sources@<name>`` stage: one dataset (hub or local files) kept as Parquet in the raw format
(:mod:`draftline.core.raw`), exactly as published; ``stage`` reads and writes it."""
