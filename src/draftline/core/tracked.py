"""Files a param names from an earlier round (a drafter, its evaluation, a base) live where DVC tracks them.

dvc.yaml makes the prompts, generate and train stages depend on ``${paths.drafters}`` (``--drafters``), the folder
that holds the previous rounds' drafters and evaluations, and the prompts and merge stages on ``${paths.bases}``
(``--bases``), the folder that holds the training sets a round extends (``merge.base``) and the tokenizer a legacy
one was made with (``merge.base_tokenizer``). A file a param names outside them is not a dependency: DVC cannot see
it change, and a rerun reuses the result made from the old file. So such a path is refused, before anything is
read, naming the param and the commands that put it where it is tracked.
"""

from __future__ import annotations

from pathlib import Path

from draftline.core.errors import Refusal


class Untracked(Refusal):
    """A param names a file outside the folder the stage depends on."""


def require_tracked(path: str | None, folder: Path, field: str) -> None:
    """Refuse ``path`` (the value of param ``field``; None: unset) unless it lies inside ``folder``."""
    if path is None or Path(path).resolve().is_relative_to(Path(folder).resolve()):
        return
    inside = Path(folder) / Path(path).name
    raise Untracked(f"params.yaml: {field} ({path}) is outside {folder}, which DVC tracks for this stage: a change to "
                    f"it would not rerun the stage. Copy it in and track it: cp -r {path} {inside} && dvc add {inside}; "
                    f"then set {field}: {inside}")
