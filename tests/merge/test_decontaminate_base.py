"""Decontamination of the base in merge: planted copies of evaluation prompts among unrelated base rows.

The base holds copies (verbatim, a changed number, swapped sentences; a question shorter than an n-gram) of a
benchmark set's questions and of a held-out prompt, beside unrelated rows, over several shards. With
``decontaminate.base: drop`` the copies leave the merged set and are counted, the unrelated rows keep their tokens,
and every shard without a copy is carried byte-identical; with ``report`` nothing is dropped and the hits are
reported; two runs give the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import default_params
from merge_support import file_hashes, make_rows, train_tokenizer, write_legacy, write_target, write_tokenized
from transformers import AutoTokenizer

from draftline.core import dataset as fmt
from draftline.core.dataset import load_training_set
from draftline.core.records import CONVERSATIONS_FILE, Conversation, PromptRecord
from draftline.core.runner import execute
from draftline.merge.params import MergeParams
from draftline.merge.stage import MergeArgs, run_merge

QUESTIONS = [
    "A bakery sells 14 loaves of rye bread every morning and twice as many white loaves in the afternoon. How many "
    "loaves does the bakery sell in a week if it opens every day?",
    "Tom walks 3 kilometres to school each day and takes the bus back home in the evening. How far does Tom walk "
    "to school during a term of 60 school days?",
    "Draft a polite email to a landlord asking for the broken heater in the flat to be repaired soon. Mention that "
    "the problem started last Tuesday and that it is getting colder.",
    "Name three primary colours.",  # shorter than an n-gram: matched by its whole text
]
HELD_OUT = ("Explain the difference between a list and a tuple in Python with a small code example. Say when you "
            "would choose one over the other in a real program.")
# Where the copies sit among the 40 unrelated base rows, and how each is made from its question.
PLANTED = {
    3: QUESTIONS[0],  # verbatim
    4: QUESTIONS[1].replace("3 kilometres", "4 kilometres"),  # a changed number
    30: " ".join(f"{x}." for x in reversed(QUESTIONS[2].rstrip(".").split(". "))),  # swapped sentences
    20: QUESTIONS[3],  # verbatim, short
    31: "Please help me with this.\n" + HELD_OUT,  # a held-out prompt inside a longer one
}
ROWS = 45  # 40 unrelated + the 5 copies


def _row(tok, text: str) -> tuple[list[int], list[bool]]:
    prompt = tok(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    reply = tok("an answer<|im_end|>\n", add_special_tokens=False)["input_ids"]
    return prompt + reply, [False] * len(prompt) + [True] * len(reply)


def _base_rows(tok_dir: Path) -> pa.Table:
    """40 unrelated rows (random words) with the copies spliced in at their :data:`PLANTED` positions."""
    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    unrelated = make_rows(tok_dir, [f"b{i}" for i in range(40)], seed=1, source="old")
    ids, toks, masks = [], [], []
    for i in range(ROWS):
        if i in PLANTED:
            ids.append(f"planted{i}")
            t, m = _row(tok, PLANTED[i])
        else:
            k = i - sum(p < i for p in PLANTED)
            ids.append(f"b{k}")
            t, m = unrelated.column("input_ids")[k].as_py(), unrelated.column("loss_mask")[k].as_py()
        toks.append(t)
        masks.append(m)
    offsets = np.cumsum([0] + [len(t) for t in toks])
    return fmt.build_table(ids, ["old"] * ROWS, offsets, np.concatenate(toks), np.concatenate(masks).astype(bool))


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture
def world(tmp_path: Path, tok_dir: Path) -> Path:
    """A project: target, a base of several shards with the copies, 10 new rows, a set and the held-out prompts."""
    info = write_target(tmp_path / "data/target/target.json", tok_dir)
    write_tokenized(tmp_path / "data/bases/r1", _base_rows(tok_dir), info, max_shard_bytes=6000)
    write_tokenized(tmp_path / "data/tokenized", make_rows(tok_dir, [f"n{i}" for i in range(10)], seed=2), info)
    bench = tmp_path / "data/sets/conversations/bench"
    bench.mkdir(parents=True)
    (bench / CONVERSATIONS_FILE).write_text("".join(
        Conversation(source="bench", row=i, messages=[{"role": "user", "content": q},
                                                      {"role": "assistant", "content": "ok"}]).to_json() + "\n"
        for i, q in enumerate(QUESTIONS)), encoding="utf-8")
    (tmp_path / "data/prompts").mkdir(parents=True)
    (tmp_path / "data/prompts/eval.jsonl").write_text(PromptRecord(
        id="h0", source="s", row=0, messages=[{"role": "user", "content": HELD_OUT}]).to_json() + "\n", encoding="utf-8")
    return tmp_path


def _merge(root: Path, mode: str, out: str = "data/merged", base: str = "data/bases/r1", **merge) -> dict:
    params = MergeParams.parse({**default_params("merge", base=str(root / base), **merge),
                                "decontaminate": default_params("decontaminate", base=mode), "sets": ["bench"]}, "merge")
    args = MergeArgs(tokenized=root / "data/tokenized", target=root / "data/target/target.json", out=root / out,
                     metrics=root / "metrics/merge.json", report=root / "reports/merge.json",
                     plot=root / "plots/merge_mix.csv", bases=root / "data/bases",
                     sets=root / "data/sets/conversations", heldout=root / "data/prompts/eval.jsonl")
    execute("merge", run_merge, params, args)
    return json.loads((root / "reports/merge.json").read_text(encoding="utf-8"))


def _shard_rows(folder: Path) -> list[range]:
    meta, start, out = fmt.read_meta(folder), 0, []
    for s in meta.shards:
        out.append(range(start, start + s.num_rows))
        start += s.num_rows
    return out


def test_drop_leaves_the_copies_out_counts_them_and_carries_every_clean_shard(world):
    base = world / "data/bases/r1"
    shards = _shard_rows(base)
    clean = [f for f, rows in zip(fmt.shard_files(base), shards) if not set(rows) & set(PLANTED)]
    dirty = [rows for rows in shards if set(rows) & set(PLANTED)]
    assert len(clean) > 1 and all(len(rows) > 1 for rows in dirty)  # clean shards, and copies beside other rows
    report = _merge(world, "drop")
    out = world / "data/merged"
    ds, order, _ = load_training_set(out)
    base_ds = fmt.load(base)
    want = [i for i in range(ROWS) if i not in PLANTED]
    assert ds["id"] == [base_ds[i]["id"] for i in want] + [f"n{i}" for i in range(10)]
    assert ds["input_ids"][: len(want)] == [base_ds[i]["input_ids"] for i in want]  # unrelated rows unchanged
    assert sorted(order.tolist()) == list(range(len(want) + 10))
    base_h, out_h = file_hashes(base), file_hashes(out)
    assert {base_h[f] for f in clean} <= {out_h[f] for f in fmt.shard_files(out)}
    d = report["decontamination"]
    assert d["mode"] == "drop" and d["base_rows_hit"] == 5 and d["dropped"] == 5
    assert d["by_set"] == {"bench": 4, "heldout": 1}
    # The first 3 hits of each set, in row order (the counts above include the fourth, row 30).
    assert [e["row"] for e in d["examples"]["bench"]] == [3, 4, 20] and [e["row"] for e in d["examples"]["heldout"]] == [31]
    metrics = json.loads((world / "metrics/merge.json").read_text(encoding="utf-8"))
    assert metrics["contaminated"] == {"total": 5, "bench": 4, "heldout": 1}
    assert metrics["rows"] == len(want) + 10
    fmt.verify_shards(out, fmt.read_meta(out))


def test_report_keeps_every_row_and_carries_every_shard_but_reports_the_hits(world):
    base = world / "data/bases/r1"
    report = _merge(world, "report")
    out = world / "data/merged"
    base_h, out_h = file_hashes(base), file_hashes(out)
    base_files, out_files = fmt.shard_files(base), fmt.shard_files(out)
    assert [out_h[f] for f in out_files[: len(base_files)]] == [base_h[f] for f in base_files]
    assert load_training_set(out)[0]["id"][:ROWS] == fmt.load(base)["id"]
    d = report["decontamination"]
    assert d["mode"] == "report" and d["base_rows_hit"] == 5 and d["dropped"] == 0
    assert d["by_set"] == {"bench": 4, "heldout": 1}
    shown = {e["row"]: e for s in d["examples"].values() for e in s}
    assert shown[4]["eval"] == "row 1" and shown[4]["coverage"] >= 0.7
    assert json.loads((world / "metrics/merge.json").read_text(encoding="utf-8"))["contaminated"]["total"] == 5


def test_two_runs_give_the_same_bytes(world):
    first = _merge(world, "drop", out="data/m1")
    second = _merge(world, "drop", out="data/m2")
    assert file_hashes(world / "data/m1") == file_hashes(world / "data/m2")
    assert first["decontamination"] == second["decontamination"]


def test_a_legacy_base_is_checked_the_same_way_and_rewritten_without_the_copies(world, tok_dir):
    write_legacy(world / "data/bases/legacy", _base_rows(tok_dir))
    report = _merge(world, "drop", base="data/bases/legacy", assume_same_tokenizer=True)
    d = report["decontamination"]
    assert d["by_set"] == {"bench": 4, "heldout": 1} and d["dropped"] == 5
    assert load_training_set(world / "data/merged")[2].num_rows == ROWS - 5 + 10
