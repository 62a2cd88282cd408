"""Domain and language labels against two hand-labelled sets of prompts in the real schemas of the seven sources.

- **dev** (tests/prompts/labels.jsonl, 479 rows): the set the rules were tuned on, so its agreement is an in-sample
  figure. Rules may be tuned on this set only.
- **held-out** (tests/prompts/labels_heldout.jsonl, 247 rows, all ``set: written``): written blind (from the sources'
  descriptions, before its author read the classifier, its docs or this test) and committed alone, never used to
  tune a rule. Its agreement is the out-of-sample figure; the file is never edited to fit the rules (a miss is
  reported, not relabelled). ``pytest -s -k heldout tests/prompts/test_classify.py`` prints it with a seeded
  percentile bootstrap 95% interval over rows.

tests/prompts/labels.jsonl holds the dev hand labels (domain, ISO 639-1 language), one prompt a line:

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
from draftline.core.intervals import Interval, bootstrap, first
from draftline.core.raw import rows_to_table, write_raw
from draftline.core.records import CONVERSATIONS_FILE, Conversation
from draftline.core.source_spec import SourceSpec
from draftline.prompts.canonical import cut_prompt

HERE = Path(__file__).parent
REPO = HERE.parents[1]
LABELS = [json.loads(line) for line in (HERE / "labels.jsonl").read_text(encoding="utf-8").splitlines()]
HELDOUT = [json.loads(line) for line in (HERE / "labels_heldout.jsonl").read_text(encoding="utf-8").splitlines()]
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
# Required on both sets (the dev set, tests/prompts/labels.jsonl, and the held-out one); the issue asks >= 90% / >= 95%.
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
    return out + _written(root / "written", [lab for lab in LABELS if lab["set"] == "written"])


def _written(root: Path, labels: list[dict]) -> list[tuple[dict, Conversation]]:
    """Rows written in a source's own schema (``raw``), each source's rows through its real adapter, in label order
    within a source. Every row must come out as a conversation: one the adapter skips fails here, by position."""
    out = []
    for source in sorted({lab["source"] for lab in labels}):
        mine = [lab for lab in labels if lab["source"] == source]
        convs = _adapt(root, source, source, [lab["raw"] for lab in mine])
        skipped = sorted(set(range(len(mine))) - set(convs))
        assert not skipped, f"{source}: its rows {skipped} (0-based, within the source) were skipped by the adapter"
        out += [(lab, convs[i]) for i, lab in enumerate(mine)]
    return out


def _score(labelled: list[tuple[dict, Conversation]]) -> list[tuple[dict, str, str]]:
    """Each conversation cut and classified exactly as the prompt stage labels its records."""
    out = []
    for lab, conv in labelled:
        record = cut_prompt(conv, "first")
        got = classify_messages(record.messages, record.tools)
        out.append((lab, got.domain, got.lang))
    return out


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[dict, str, str]]:
    shared = SHARED if (SHARED / "fixtures" / "datasets").is_dir() else None
    return _score(_labelled(tmp_path_factory.mktemp("labels"), shared))


@pytest.fixture(scope="module")
def heldout_scored(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[dict, str, str]]:
    return _score(_written(tmp_path_factory.mktemp("heldout"), HELDOUT))


def _agreement(scored: list[tuple[dict, str, str]]) -> tuple[Interval, Interval]:
    """Domain and language agreement, each with a seeded percentile bootstrap 95% interval over rows."""
    hits = [(lab["domain"] == d, lab["lang"] == g) for lab, d, g in scored]
    domain = bootstrap([[d] for d, _ in hits], first, resamples=10_000, seed=0)
    lang = bootstrap([[g] for _, g in hits], first, resamples=10_000, seed=0)
    return domain, lang


def test_the_labelled_set_is_large_and_covers_every_domain(scored: list) -> None:
    assert len(LABELS) >= 200 and len(scored) >= 200
    assert {lab["domain"] for lab in LABELS} == set(DOMAINS)
    assert len({lab["source"] for lab in LABELS if lab["set"] == "samples"}) == 7


def test_agreement_with_hand_labels(scored: list) -> None:
    """In sample: the dev set the rules were tuned on."""
    domain_ci, lang_ci = _agreement(scored)
    domain, lang = domain_ci.estimate, lang_ci.estimate
    misses = Counter(f"{lab['domain']}->{d}" for lab, d, _ in scored if lab["domain"] != d)
    print(f"dev {len(scored)} (in sample): domain {domain:.1%} (95% CI {domain_ci.low:.1%}-{domain_ci.high:.1%}), "
          f"language {lang:.1%} (95% CI {lang_ci.low:.1%}-{lang_ci.high:.1%}); domain misses {dict(misses)}")
    for lab, d, g in scored:
        if lab["domain"] != d or lab["lang"] != g:
            print("  miss", lab["set"], lab["source"], lab.get("row"), lab["domain"], d, lab["lang"], g)
    assert domain >= MIN_DOMAIN, dict(misses)
    assert lang >= MIN_LANGUAGE


def test_the_heldout_set_is_frozen_and_balanced() -> None:
    """The held-out file as committed: written rows only, every domain and source, about half not English."""
    assert len(HELDOUT) >= 200 and {lab["set"] for lab in HELDOUT} == {"written"}
    domains = Counter(lab["domain"] for lab in HELDOUT)
    assert set(domains) == set(DOMAINS) and min(domains.values()) >= 50, domains
    assert {lab["source"] for lab in HELDOUT} == {lab["source"] for lab in LABELS if lab["set"] == "samples"}
    for d in DOMAINS:
        langs = Counter(lab["lang"] for lab in HELDOUT if lab["domain"] == d)
        assert len(langs) >= 11 and 0.3 <= langs["en"] / sum(langs.values()) <= 0.7, (d, langs)
    texts = {json.dumps(lab["raw"], sort_keys=True) for lab in HELDOUT}
    assert len(texts) == len(HELDOUT)


def test_agreement_with_heldout_labels(heldout_scored: list) -> None:
    """Out of sample: the rules were never tuned on these rows."""
    domain, lang = _agreement(heldout_scored)
    misses = Counter(f"{lab['domain']}->{d}" for lab, d, _ in heldout_scored if lab["domain"] != d)
    print(f"held-out {domain.n}: domain {domain.estimate:.1%} (95% CI {domain.low:.1%}-{domain.high:.1%}), "
          f"language {lang.estimate:.1%} (95% CI {lang.low:.1%}-{lang.high:.1%}); "
          f"bootstrap over rows, {domain.resamples} resamples, seed {domain.seed}; domain misses {dict(misses)}")
    for lab, d, g in heldout_scored:
        if lab["domain"] != d or lab["lang"] != g:
            print("  miss line", HELDOUT.index(lab) + 1, lab["source"], lab["domain"], d, lab["lang"], g)
    assert len(heldout_scored) == len(HELDOUT)
    assert domain.estimate >= MIN_DOMAIN, dict(misses)
    assert lang.estimate >= MIN_LANGUAGE


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
