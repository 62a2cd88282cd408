"""A dataset's content mix from its tokens: labelled once per shard, then read back from the cache or the record."""

from __future__ import annotations

from pathlib import Path

import pytest
from merge_support import chat_rows, train_tokenizer, write_legacy, write_target, write_tokenized
from transformers import AutoTokenizer

from draftline.core import mix
from draftline.core.mix import Mix, fingerprint_of, folder_mix, read_record, shares, write_record


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=600)


def test_a_legacy_base_is_labelled_once_then_read_from_the_cache(tok_dir: Path, tmp_path: Path) -> None:
    domains = ["code"] * 77 + ["math"] * 10 + ["tool_use"] * 5 + ["general"] * 8
    write_legacy(tmp_path / "base", chat_rows(tok_dir, domains))
    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    first, _ = folder_mix(tmp_path / "base", tok, cache=tmp_path / "cache")
    assert first.total.amounts("samples") == {"code": 77, "math": 10, "tool_use": 5, "general": 8}
    assert shares(first.total.amounts("samples"))["code"] == 0.77
    assert first.labelled == len(first.checksums) and first.rows_labelled == 100
    assert first.total.languages == {"en": 100}
    again, _ = folder_mix(tmp_path / "base", tok, cache=tmp_path / "cache")
    assert again.labelled == 0 and again.cached == len(first.checksums)
    assert again.total == first.total and again.total.amounts("tokens") == first.total.amounts("tokens")
    assert sum(first.total.amounts("tokens").values()) == sum(len(r) for r in chat_rows(tok_dir, domains)
                                                               .column("input_ids").to_pylist())


def test_a_recorded_folder_is_read_from_its_record_without_a_tokenizer(tok_dir: Path, tmp_path: Path) -> None:
    info = write_target(tmp_path / "target.json", tok_dir)
    write_tokenized(tmp_path / "ds", chat_rows(tok_dir, ["code", "math"] * 30), info, max_shard_bytes=3000)
    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    labelled, _ = folder_mix(tmp_path / "ds", tok, cache=tmp_path / "cache")
    assert len(labelled.checksums) > 1
    write_record(tmp_path / "ds", labelled.entries())
    assert set(read_record(tmp_path / "ds")) == set(labelled.checksums)
    recorded, _ = folder_mix(tmp_path / "ds", None, cache=tmp_path / "empty-cache")
    assert recorded.recorded == len(labelled.checksums) and recorded.labelled == 0
    assert recorded.total == labelled.total


def test_mix_arithmetic() -> None:
    a = Mix.of_labels(["code", "math"], ["en", "fr"], [10, 5])
    b = Mix.of_labels(["code"], ["en"], [1])
    assert (a + b).amounts("samples") == {"code": 2, "math": 1, "tool_use": 0, "general": 0}
    assert (a + b).amounts("tokens")["code"] == 11 and (a + b).languages == {"en": 2, "fr": 1}
    assert Mix.from_dict((a + b).to_dict()) == a + b


def test_a_changed_rule_gives_another_classifier_fingerprint() -> None:
    """The fingerprint is of the rules' text: one cue taken out of the math rule, another fingerprint."""
    import draftline.core.classify as classify

    text = Path(classify.__file__).read_text(encoding="utf-8")
    assert "(?:how many|how much|" in text
    assert fingerprint_of([text]) != fingerprint_of([text.replace("(?:how many|how much|", "(?:how much|", 1)])
    assert fingerprint_of(["ab", "c"]) != fingerprint_of(["a", "bc"])


def test_labels_and_records_of_other_rules_are_never_read(tok_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    write_legacy(tmp_path / "base", chat_rows(tok_dir, ["code", "math"] * 10))
    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    first, _ = folder_mix(tmp_path / "base", tok, cache=tmp_path / "cache")
    write_record(tmp_path / "rec", first.entries())
    assert read_record(tmp_path / "rec") == first.entries()
    # The rules change (their fingerprint with them): the cached labels and the record are of the old rules.
    monkeypatch.setattr(mix, "classifier_fingerprint", lambda: "other-rules")
    again, _ = folder_mix(tmp_path / "base", tok, cache=tmp_path / "cache")
    assert again.cached == 0 and again.labelled == len(first.checksums)
    assert read_record(tmp_path / "rec") == {}
