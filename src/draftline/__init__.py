"""draftline: instruction datasets -> target completions -> tokenized Arrow -> DFlash drafters, as one DVC pipeline."""

__version__ = "0.1.0"
