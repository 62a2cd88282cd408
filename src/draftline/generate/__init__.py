"""The ``generate`` stage: the target's own completions for every prompt, resumable to the row.

``params`` (the section), ``stage`` (the order of work), ``key`` (the journal key: what decides a result),
``journal`` (fsynced results, in the stage's scratch folder), ``order`` (dispatch order: prefix groups), ``work``
(a run's plan and where its results go), ``regeneration`` and ``turns`` (one prompt, turn by turn), the drivers
``remote`` (SGLang/vLLM over HTTP: ``openai_client``, ``launcher`` for a server run for the stage) and ``batches``
(the target in-process: ``local``), ``progress`` (this run's bar and speeds), ``shards`` and ``report`` (the outputs).
"""
