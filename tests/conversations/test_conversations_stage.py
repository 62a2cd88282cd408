"""The conversations stage writes each source's conversations once; the embedded target and the prompt stage
both read those files, so a source configured by adapter options reaches both the same way."""

from __future__ import annotations

import json
from pathlib import Path

import early_stages as run
import pytest
from conftest import TINY_TARGET_PARAMS, default_params

from draftline.conversations.params import ConversationsParams
from draftline.core.logs import get_logger
from draftline.core.params import ParamsError
from draftline.core.records import CONVERSATIONS_FILE, CONVERSATIONS_STATS_FILE, read_conversations
from draftline.core.skips import Skips
from draftline.core.source_spec import SourceSpec
from draftline.prompts.params import BlendParams, DedupParams, PromptsParams, PromptsSettings
from draftline.target.params import TargetParams

CONVERSATIONS = ConversationsParams.parse(default_params("conversations"), "conversations")


def _fields_source(tmp_path: Path) -> SourceSpec:
    # Words differ from row to row (near dedup would merge questions that differ in their numbers alone).
    words = [f"{a}{b}{c}" for a in "bdgk" for b in "aeiou" for c in "lmnrst"]
    rows = [{"question": f"Why do {words[i]} and {words[-1 - i]} sound alike to a {words[(7 * i) % 120]}?",
             "answer": f"Both end in {words[i][-1]}.", "n": i} for i in range(60)]
    rows.insert(7, {"question": None, "answer": "an answer without a question"})
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"path": str(path), "adapter": "fields", "options": {"prompt_field": "question", "answer_field": "answer"}}
    return SourceSpec.parse(spec, "sources.qa")


def test_a_fields_source_with_options_reaches_the_target_and_the_prompts_alike(tmp_path):
    spec = _fields_source(tmp_path)
    run.sources(tmp_path, "qa", spec)
    stage = run.conversations(tmp_path, "qa", spec, CONVERSATIONS)
    stats = {"adapter": "fields", "rows_read": 61, "conversations": 60, "skipped": {"malformed": 1},
             "media_parts_dropped": 0}
    assert json.loads((tmp_path / "conversations" / "qa" / CONVERSATIONS_STATS_FILE).read_text()) == stats
    assert stage.headline == {"rows": 60} and stage.skips.as_dict() == {"malformed": 1}
    convs = list(read_conversations(tmp_path / "conversations" / "qa" / CONVERSATIONS_FILE, Skips(get_logger("test"))))
    assert [m["role"] for m in convs[0].messages] == ["user", "assistant"]

    target = run.target(tmp_path, TargetParams.parse(TINY_TARGET_PARAMS, "target")).details
    assert target["embedded"]
    assert target["corpus_conversations"] + target["held_out"]["qa"]["prompts"] == len(convs)

    blend = {**default_params("blend"), "total": 20, "eval": {"dev": 1, "test": 1}, "sources": {}}
    run.prompts(tmp_path, PromptsSettings(
        ["qa"], PromptsParams.parse(default_params("prompts"), "prompts"),
        DedupParams.parse(default_params("dedup", priority=[], near={"exact_numbers": []}), "dedup"),
        BlendParams.parse(blend, "blend"), False))
    by_row = {c.row: c for c in convs}
    prompts = [json.loads(line) for line in (tmp_path / "prompts" / "train.jsonl").read_text().splitlines()]
    assert len(prompts) == 20
    for p in prompts:  # each prompt is its conversation's first turn; its reference is the conversation's answer
        conv = by_row[p["row"]]
        assert p["messages"] == conv.messages[:1] and p["reference"] == conv.messages[1]["content"]


def test_bad_adapter_options_fail_before_any_work(tmp_path):
    spec = SourceSpec.parse({"path": "x", "adapter": "fields", "options": {"prompt_feild": "q"}}, "sources.qa")
    with pytest.raises(ValueError, match=r"has no option\(s\) \['prompt_feild'\]"):
        run.conversations(tmp_path, "qa", spec, CONVERSATIONS)
    with pytest.raises(ParamsError, match="multimodal must be one of"):
        ConversationsParams.parse({"multimodal": "keep", "strict": False}, "conversations")
    assert not (tmp_path / "conversations").exists()
