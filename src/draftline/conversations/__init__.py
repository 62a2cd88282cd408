"""The ``conversations@<name>`` stage: one source's raw rows adapted, once, into whole conversations.

``adapters`` turns rows of many dataset schemas into OpenAI-style messages, ``tools`` turns the tool specs and
calls datasets really use into OpenAI function specs, ``stage`` writes ``data/conversations/<name>/``. The
embedded target and the prompt stage both read those files, so they see the same conversations.
"""
