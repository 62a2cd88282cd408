"""The conversations stage writes each source's conversations once; the embedded target and the prompt stage
both read those files, so a source configured by adapter options reaches both the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_TARGET_PARAMS, default_params

from draftline.conversations.stage import ConversationsParams, run_conversations
from draftline.core.logs import get_logger
from draftline.core.params import ParamsError
from draftline.core.records import CONVERSATIONS_FILE, CONVERSATIONS_STATS_FILE, read_conversations
from draftline.core.skips import Skips
from draftline.core.source_spec import SourceSpec
from draftline.prompts.blend import BlendParams
from draftline.prompts.dedup import DedupParams
from draftline.prompts.stage import PromptsParams, run_prompts
from draftline.sources.stage import run_source
from draftline.target.stage import TargetParams, run_target

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
    run_source("qa", spec, tmp_path / "raw", tmp_path / "metrics")
    stats = run_conversations("qa", spec, CONVERSATIONS, tmp_path / "raw", tmp_path / "conv", tmp_path / "metrics")
    assert stats == {"adapter": "fields", "rows_read": 61, "conversations": 60, "skipped": {"malformed": 1},
                     "media_parts_dropped": 0}
    assert json.loads((tmp_path / "conv" / "qa" / CONVERSATIONS_STATS_FILE).read_text()) == stats
    convs = list(read_conversations(tmp_path / "conv" / "qa" / CONVERSATIONS_FILE, Skips(get_logger("test"))))
    assert [m["role"] for m in convs[0].messages] == ["user", "assistant"]

    info = run_target(TargetParams.parse(TINY_TARGET_PARAMS, "target"), tmp_path / "target", tmp_path / "conv",
                      tmp_path / "metrics" / "target.json", tmp_path / "loss.csv")
    assert info.embedded
    target = json.loads((tmp_path / "metrics" / "target.json").read_text())
    assert target["corpus_conversations"] + target["held_out"]["qa"]["prompts"] == len(convs)

    blend = {**default_params("blend"), "total": 20, "eval_per_source": 2, "sources": {}}
    run_prompts(["qa"], PromptsParams.parse(default_params("prompts"), "prompts"),
                DedupParams.parse(default_params("dedup", priority=[], near={"exact_numbers": []}), "dedup"),
                BlendParams.parse(blend, "blend"), False, conversations_root=tmp_path / "conv",
                target_dir=tmp_path / "target", out_dir=tmp_path / "prompts", metrics_path=tmp_path / "m.json",
                plots_path=tmp_path / "mix.csv")
    by_row = {c.row: c for c in convs}
    prompts = [json.loads(line) for line in (tmp_path / "prompts" / "train.jsonl").read_text().splitlines()]
    assert len(prompts) == 20
    for p in prompts:  # each prompt is its conversation's first turn; its reference is the conversation's answer
        conv = by_row[p["row"]]
        assert p["messages"] == conv.messages[:1] and p["reference"] == conv.messages[1]["content"]


def test_bad_adapter_options_fail_before_any_work(tmp_path):
    spec = SourceSpec.parse({"path": "x", "adapter": "fields", "options": {"prompt_feild": "q"}}, "sources.qa")
    with pytest.raises(ValueError, match=r"has no option\(s\) \['prompt_feild'\]"):
        run_conversations("qa", spec, CONVERSATIONS, tmp_path / "raw", tmp_path / "conv", tmp_path / "m")
    with pytest.raises(ParamsError, match="multimodal must be one of"):
        ConversationsParams.parse({"multimodal": "keep", "strict": False}, "conversations")
    assert not (tmp_path / "conv").exists()
