"""The ``merge`` stage: a base training set + the new tokenized rows -> the merged set, the base's shards carried
byte-identical. ``parts`` opens datasets without reading them, ``guards`` refuses a base that does not fit,
``reencode`` tests its tokenizer in a child process, ``carry`` links or copies shards, ``stage`` runs it all.

Imports nothing: ``python -m draftline.merge.reencode`` must start with ``tokenizers`` alone.
"""
