"""The ``export`` stage: the merged training set in the formats other drafter trainers read (SpecForge,
speculators, a plain Hugging Face dataset), each with its lineage beside it (``formats``, ``stage``)."""
