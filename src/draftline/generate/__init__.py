"""The ``generate`` stage: the target's own completions for every prompt, resumable to the row.

``params`` (the section), ``turns`` (one request per user turn), ``journal`` (fsynced results, in the stage's
scratch folder), ``openai_client`` (SGLang/vLLM over HTTP), ``launcher`` (an SGLang server run for the stage),
``local`` (the target in-process), ``shards`` and ``report`` (the outputs), ``stage`` (the order of work).
"""
