"""The ``prompts`` stage: conversations -> normalised, deduplicated, blended prompts (see docs/prompts.md).

``canonical`` cuts a prompt out of a conversation and gives it its content id, ``dedup`` removes exact and near
duplicates, ``template`` settles what the target's chat template cannot render (tools, thinking), ``blend``
picks the training mix, ``costs`` counts tokens under the target tokenizer, ``report``
writes what happened per source, ``stage`` runs it all.
"""
