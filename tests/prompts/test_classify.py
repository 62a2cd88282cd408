"""Domain and language labels against a hand-labelled set of prompts in the real schemas of the seven sources.

tests/prompts/labels.jsonl holds the hand labels (domain, ISO 639-1 language), one prompt a line:

- ``set: samples``: rows of the project's embedded samples (data/samples/<source>.jsonl), by source and row;
- ``set: fixtures``: real rows of the source datasets (../shared/fixtures/datasets), by fixture and row; skipped
  where that folder is absent;
- ``set: written``: rows written for this test (no dataset's text), in a source's own schema (``raw``), to cover
  languages and shapes the samples lack.

Every row goes through its source's real adapter (the conversations stage) and the prompt stage's cut, then
:func:`draftline.core.classify.classify_messages`, exactly as the prompt stage labels its records.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import early_stages as run
import pytest
from conftest import SHARED

from draftline.conversations.params import ConversationsParams
from draftline.core.classify import DOMAINS, classify_messages, classify_rendered, domain_of, language_of
from draftline.core.raw import rows_to_table, write_raw
from draftline.core.records import CONVERSATIONS_FILE, Conversation
from draftline.core.source_spec import SourceSpec
from draftline.prompts.canonical import cut_prompt

HERE = Path(__file__).parent
REPO = HERE.parents[1]
LABELS = [json.loads(line) for line in (HERE / "labels.jsonl").read_text(encoding="utf-8").splitlines()]
CONVERSATIONS = ConversationsParams.parse({"multimodal": "drop", "strict": False}, "conversations")
FIXTURES = {
    "glaive": ("agent_glaive_toolcall_sharegpt", "agent"),
    "agent_reason": ("agent_reason_tool_use_llamafactory_v1", "agent"),
    "codefeedback": ("codefeedback_filtered_instruction", "codefeedback"),
    "hermes": ("hermes_function_calling_v1", "hermes_fc"),
    "infinity_7m": ("infinity_instruct_7M", "infinity_instruct"),
    "infinity_gen": ("infinity_instruct_gen", "infinity_instruct"),
    "metamathqa": ("metamathqa", "metamathqa"),
    "http": ("openai_multimodal_request_bodies", "http_traces"),
}
# Measured on this set (tests/prompts/labels.jsonl); the issue asks >= 90% / >= 95%.
MIN_DOMAIN, MIN_LANGUAGE = 0.90, 0.95


def _adapt(root: Path, name: str, adapter: str, rows: list[dict] | Path) -> dict[int, Conversation]:
    spec = SourceSpec.parse({"path": str(rows) if isinstance(rows, Path) else "x", "adapter": adapter}, f"sources.{name}")
    if isinstance(rows, Path):  # the sources stage reads it, quirks and all
        run.sources(root, name, spec)
    else:
        write_raw(rows_to_table(rows), root / "raw" / name)
    run.conversations(root, name, spec, CONVERSATIONS)
    lines = (root / "conversations" / name / CONVERSATIONS_FILE).read_text(encoding="utf-8").splitlines()
    return {c.row: c for c in (Conversation.from_dict(json.loads(line)) for line in lines)}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _labelled(root: Path, shared: Path | None) -> list[tuple[dict, Conversation]]:
    out = []
    for source in sorted({lab["source"] for lab in LABELS if lab["set"] == "samples"}):
        convs = _adapt(root / "samples", source, source, REPO / "data" / "samples" / f"{source}.jsonl")
        out += [(lab, convs[lab["row"]]) for lab in LABELS if lab["set"] == "samples" and lab["source"] == source]
    if shared is not None:
        for name, (fixture, adapter) in FIXTURES.items():
            convs = _adapt(root / "fixtures", name, adapter, _jsonl(shared / "fixtures" / "datasets" / f"{fixture}.jsonl"))
            out += [(lab, convs[lab["row"]]) for lab in LABELS if lab["set"] == "fixtures" and lab["source"] == name]
    written = [lab for lab in LABELS if lab["set"] == "written"]
    for source in sorted({lab["source"] for lab in written}):
        mine = [lab for lab in written if lab["source"] == source]
        convs = _adapt(root / "written", source, source, [lab["raw"] for lab in mine])
        out += [(lab, convs[i]) for i, lab in enumerate(mine)]
    return out


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[dict, str, str]]:
    shared = SHARED if (SHARED / "fixtures" / "datasets").is_dir() else None
    out = []
    for lab, conv in _labelled(tmp_path_factory.mktemp("labels"), shared):
        record = cut_prompt(conv, "first")
        got = classify_messages(record.messages, record.tools)
        out.append((lab, got.domain, got.lang))
    return out


def test_the_labelled_set_is_large_and_covers_every_domain(scored: list) -> None:
    assert len(LABELS) >= 200 and len(scored) >= 200
    assert {lab["domain"] for lab in LABELS} == set(DOMAINS)
    assert len({lab["source"] for lab in LABELS if lab["set"] == "samples"}) == 7


def test_agreement_with_hand_labels(scored: list) -> None:
    domain = sum(lab["domain"] == d for lab, d, _ in scored) / len(scored)
    lang = sum(lab["lang"] == g for lab, _, g in scored) / len(scored)
    misses = Counter(f"{lab['domain']}->{d}" for lab, d, _ in scored if lab["domain"] != d)
    print(f"labelled {len(scored)}: domain {domain:.1%}, language {lang:.1%}; domain misses {dict(misses)}")
    for lab, d, g in scored:
        if lab["domain"] != d or lab["lang"] != g:
            print("  miss", lab["set"], lab["source"], lab.get("row"), lab["domain"], d, lab["lang"], g)
    assert domain >= MIN_DOMAIN, dict(misses)
    assert lang >= MIN_LANGUAGE


def test_each_rule_fires_on_its_own() -> None:
    assert domain_of("What is the weather in Oslo?", tools_offered=True) == "tool_use"
    assert domain_of("```\nx = 1\n```\nWhy does this fail?", False) == "code"
    assert domain_of("Write a function that adds two numbers.", False) == "code"
    assert domain_of("Solve $2x + 3 = 7$.", False) == "math"
    assert domain_of("Tom has 3 apples and buys 4 more. How many apples does he have?", False) == "math"
    assert domain_of("Describe a sunset over the sea.", False) == "general"
    assert language_of("42 = 6 * 7") == "und"
    assert language_of("Ceci est une phrase écrite en français, assez longue pour être reconnue.") == "fr"


def test_a_rendered_prompt_reads_like_its_messages() -> None:
    """A base row is classified from its decoded tokens, chat template included: the same label as its messages."""
    tools = "<|im_start|>system\n# Tools\n<tools>\n{\"type\": \"function\"}\n</tools><|im_end|>\n"
    assert classify_rendered(tools + "<|im_start|>user\nBook a flight<|im_end|>\n<|im_start|>assistant\n").domain == "tool_use"
    text = "<|im_start|>user\nWrite a Python function that reverses a list.<|im_end|>\n<|im_start|>assistant\n"
    assert classify_rendered(text).domain == "code"
    assert classify_rendered("<|im_start|>user\nWie viel ist 12 mal 7? Rechne bitte.<|im_end|>\n").lang == "de"
    assert classify_rendered("no template at all: what is 15% of 80?").domain == "math"
