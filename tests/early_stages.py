"""Running the early stages (sources, conversations, target, prompts) in a test folder laid out as the pipeline's:
``<root>/raw/<name>``, ``<root>/conversations/<name>``, ``<root>/target``, ``<root>/prompts``, and each stage's
metrics and report under ``<root>/reports``. Each call is the stage as ``stages/<stage>.py`` runs it
(:func:`draftline.core.runner.execute`), minus the command line."""

from __future__ import annotations

from pathlib import Path

from draftline.conversations.params import ConversationsParams, ConversationsSettings
from draftline.conversations.stage import ConversationsArgs, run_conversations
from draftline.core.runner import StageRun, execute
from draftline.core.source_spec import SourceSpec
from draftline.prompts.params import PromptsSettings
from draftline.prompts.stage import PromptsArgs, run_prompts
from draftline.sources.stage import SourceArgs, run_source
from draftline.target.params import TargetParams
from draftline.target.stage import TargetArgs, run_target


def sources(root: Path, name: str, spec: SourceSpec) -> StageRun:
    return execute("sources", run_source, spec,
                   SourceArgs(source=name, out=root / "raw" / name, report=root / "reports" / f"sources-{name}.json"))


def conversations(root: Path, name: str, spec: SourceSpec, params: ConversationsParams,
                  out: Path | None = None) -> StageRun:
    args = ConversationsArgs(source=name, raw=root / "raw" / name, out=(out or root / "conversations") / name,
                             report=root / "reports" / f"conversations-{name}.json")
    return execute("conversations", run_conversations, ConversationsSettings(spec, params), args)


def target(root: Path, params: TargetParams) -> StageRun:
    r = root / "reports"
    return execute("target", run_target, params, TargetArgs(
        conversations=root / "conversations", out=root / "target", metrics=r / "target-metrics.json",
        report=r / "target.json", plot=r / "target_loss.csv"))


def prompts(root: Path, settings: PromptsSettings, out: Path | None = None, conversations_dir: Path | None = None,
            target_dir: Path | None = None, drafters: Path | None = None) -> StageRun:
    """The prompt stage into ``out`` (default ``root/prompts``); its metrics, report and plot beside it. Earlier
    rounds' files live in ``root/drafters`` (unless ``drafters``) and ``root/bases`` (merge.base)."""
    out = out or root / "prompts"
    return execute("prompts", run_prompts, settings, PromptsArgs(
        conversations=conversations_dir or root / "conversations", target=(target_dir or root / "target") / "target.json",
        out=out, metrics=out.parent / f"{out.name}-metrics.json", report=out.parent / f"{out.name}-report.json",
        plot=out.parent / f"{out.name}-mix.csv", plot_shares=out.parent / f"{out.name}-shares.csv",
        plot_languages=out.parent / f"{out.name}-languages.csv",
        drafters=drafters or root / "drafters",
        bases=root / "bases"))
