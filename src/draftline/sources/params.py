"""The sources stage's params: ``sources.<name>`` of params.yaml, one :class:`~draftline.core.source_spec.SourceSpec`
(in core: the conversations stage reads the same entry for its adapter)."""

from __future__ import annotations

from draftline.core.source_spec import SourceSpec, load_source


def load(args) -> SourceSpec:
    """``sources.<args.source>``."""
    return load_source(args.source)
