"""The ``tokenize`` stage: completions rendered with the target's template, tokenized, and masked to the tokens
the target generated (``loss_mask``), in chunks on several processes (``chunks``), written as a dataset folder
(``stage``; the format is :mod:`draftline.core.dataset`)."""
