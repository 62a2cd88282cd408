"""The stage runner: every ``stages/<stage>.py`` is ``main(<name>, <Args>, load, run)``.

What it owns, so that no stage hand-writes it (datatrove's base step owns its stats the same way):

- **The command line.** A stage's paths are arguments: its ``Args`` is a frozen dataclass of :class:`StageArgs`
  whose every field is a required ``--flag``. ``dvc.yaml`` names every path once (its ``vars``) and passes them;
  nothing under ``src/`` names a ``data/`` path, so a path changed in ``dvc.yaml`` is the path the stage uses.
- **Timing, skips and the three files a stage reports to.** ``run(params, args, stage)`` fills the
  :class:`StageRun` it is handed; the runner writes

  - ``args.metrics`` (when the stage has one): the headline figures, declared as DVC metrics, what
    ``dvc metrics show`` and ``dvc exp show`` compare (rows, tokens, skips, tau...), a few flat keys;
  - ``args.report``: every detail (per source, per reason, percentiles), a DVC output kept in git;
  - ``<report>.run.json`` beside it, ignored by git: what differs from run to run of the same inputs on the same
    machine (``stage_seconds``, speeds, resume counts, paths of this machine). Metrics and report are
    byte-identical between such runs; the run file never is.

  The skip counter is the stage's: its total is the headline ``skipped``, its reasons the report's ``skips``.
- **How a stage fails.** A :class:`~draftline.core.errors.Refusal` (a misspelt param, an infeasible blend, a
  refused base, a full disk, a missing input) prints its one message and exits 1, without a traceback; anything
  else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from draftline.core.errors import Refusal
from draftline.core.files import write_json
from draftline.core.logs import get_logger
from draftline.core.skips import Skips

RUN_SUFFIX = ".run.json"

A = TypeVar("A", bound="StageArgs")
P = TypeVar("P")


@dataclass(frozen=True, kw_only=True)
class StageArgs:
    """Where a stage reports; a stage's own ``Args`` adds its inputs and outputs as fields."""

    report: Path

    @property
    def label(self) -> str:
        """How logs and errors name this run: ``sources@agent`` for a ``foreach`` stage's entry."""
        return ""


@dataclass
class StageRun:
    """One run of a stage: what it counts and reports. The stage fills it; the runner writes it."""

    name: str
    skips: Skips
    headline: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)


def run_file(report: str | Path) -> Path:
    """The run-specific file beside a report: ``reports/prompts.json`` -> ``reports/prompts.run.json``."""
    report = Path(report)
    return report.with_name(report.name.removesuffix(".json") + RUN_SUFFIX)


def execute(name: str, run: Callable[[P, A, StageRun], None], params: P, args: A) -> StageRun:
    """Run one stage in this process and write what it reports (tests call this; ``main`` adds the command line)."""
    started = time.perf_counter()
    stage = StageRun(name, Skips(get_logger(name)))
    run(params, args, stage)
    stage.run["stage_seconds"] = round(time.perf_counter() - started, 2)
    metrics = getattr(args, "metrics", None)
    if metrics is not None:
        write_json(metrics, {**stage.headline, "skipped": stage.skips.total})
    write_json(args.report, {**stage.details, "skips": stage.skips.as_dict()})
    write_json(run_file(args.report), stage.run)
    get_logger(name).info("done in %.1f s: %s", stage.run["stage_seconds"],
                          ", ".join(f"{k} {v}" for k, v in sorted(stage.headline.items())))
    return stage


def main(name: str, args_type: type[A], load: Callable[[A], P], run: Callable[[P, A, StageRun], None],
         argv: list[str] | None = None) -> None:
    """The whole of a ``stages/<stage>.py``: parse the paths, load the params, run, report; refuse cleanly."""
    args = parse_args(args_type, name, argv)
    label = args.label or name
    try:
        execute(label, run, load(args), args)
    except Refusal as e:
        print(f"{label}: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def parse_args(args_type: type[A], name: str, argv: list[str] | None = None) -> A:
    """``args_type`` from ``--field value`` pairs: every field required, paths as :class:`Path`."""
    parser = argparse.ArgumentParser(description=f"the {name} stage (dvc.yaml passes its paths)")
    hints = typing.get_type_hints(args_type)
    for f in dataclasses.fields(args_type):
        parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, required=True, type=_parser_of(hints[f.name]))
    return args_type(**vars(parser.parse_args(argv)))


def _parser_of(hint: Any) -> Callable[[str], Any]:
    if hint not in (Path, str, int):
        raise TypeError(f"stage arguments are paths, strings or integers, not {hint!r}")
    return hint
