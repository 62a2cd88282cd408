"""How each row was made, through the merge: the mix of every round's target, engine, sampling and thinking mode in
the report and the metrics, rows of another target refused unless ``merge.allow_other_target``, a base written
before provenance was recorded counted as unknown, and one generate -> tokenize -> merge run keeping it all."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import default_params
from generate_helpers import make_prompts, run_in, sglang_params
from merge_support import make_rows, train_tokenizer, write_target, write_tokenized
from sglang_server import FakeSGLang

from draftline.core import dataset as fmt
from draftline.core import provenance
from draftline.core.files import write_json, write_jsonl
from draftline.core.runner import StageRun, execute
from draftline.merge.guards import MergeGuardError
from draftline.merge.params import MergeParams
from draftline.merge.stage import MergeArgs, run_merge
from draftline.tokenize.params import TokenizeParams
from draftline.tokenize.stage import TokenizeArgs, run_tokenize

OTHER_TARGET = "f00d" * 16


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok"))


def merge_run(root: Path, **params) -> StageRun:
    args = MergeArgs(tokenized=root / "data/tokenized", target=root / "data/target/target.json",
                     out=root / "data/merged", metrics=root / "metrics/merge.json", report=root / "reports/merge.json",
                     plot=root / "plots/merge_mix.csv", bases=root / "data/bases")
    return execute("merge", run_merge, MergeParams.parse(default_params("merge", **params), "merge"), args)


def generation(target: str, temperature: float, engine: tuple[str, str] = ("sglang", "0.5.4"),
               thinking: bool = False) -> dict:
    """A completion's ``generation`` as the generate stage writes it."""
    return {"backend": "sglang", "tokenizer_fingerprint": "tok", "model_fingerprint": target,
            "sampling": {"max_tokens": 64, "temperature": temperature, "top_p": 0.8, "top_k": 20, "seed": 0},
            "enable_thinking": thinking, "engine": {"name": engine[0], "version": engine[1]}}


def round_of(root: Path, folder: str, tok_dir: Path, ids: list[str], gen: dict | None, seed: int):
    """A tokenized folder of ``ids`` made with ``gen`` (None: written before provenance was recorded); its table."""
    info = write_target(root / "data/target/target.json", tok_dir)
    table = make_rows(tok_dir, ids, seed=seed)
    write_tokenized(root / folder, table, info, provenance=[provenance.of_generation(gen)] * len(ids) if gen else None)
    return table


def tokens_of(table, ids: list[str]) -> int:
    n = dict(zip(table.column("id").to_pylist(), table.column("num_tokens").to_pylist()))
    return sum(n[i] for i in ids)


def test_a_merged_set_of_two_rounds_made_with_different_sampling_reports_both(tmp_path, tok_dir):
    root = tmp_path
    target = f"path:{tok_dir}"  # the test tokenizer folder has no model weights: completions record its path
    warm, greedy = generation(target, 0.7), generation(target, 0.0, engine=("vllm", "0.11.0"))
    r1_ids = [f"a{i}" for i in range(30)]
    r1 = round_of(root, "data/tokenized", tok_dir, r1_ids, warm, seed=1)
    merge_run(root)
    shutil.copytree(root / "data/merged", root / "data/bases/round1")
    # Round 2 answers 20 prompts at temperature 0 on vLLM; 5 of them are in round 1 already and are dropped, so its
    # shard is written anew from the kept rows: their provenance must follow them.
    r2_ids = [f"a{i}" for i in range(5)] + [f"b{i}" for i in range(15)]
    r2 = round_of(root, "data/tokenized", tok_dir, r2_ids, greedy, seed=2)
    m = merge_run(root, base=str(root / "data/bases/round1"))

    labels = provenance.labels(warm)["sampling"], provenance.labels(greedy)["sampling"]
    assert labels == ("max_tokens=64 seed=0 temperature=0.7 top_k=20 top_p=0.8",
                      "max_tokens=64 seed=0 temperature=0.0 top_k=20 top_p=0.8")
    kept = r2_ids[5:]
    merged = m.details["provenance"]["merged"]
    assert {k: (v["rows"], v["tokens"]) for k, v in merged["sampling"].items()} == {
        labels[0]: (30, tokens_of(r1, r1_ids)), labels[1]: (15, tokens_of(r2, kept))}
    assert {k: v["rows"] for k, v in merged["engine"].items()} == {"sglang 0.5.4": 30, "vllm 0.11.0": 15}
    assert {k: v["rows"] for k, v in merged["target"].items()} == {target: 45}
    assert {k: v["rows"] for k, v in merged["thinking"].items()} == {"off": 45}
    assert merged["sampling"][labels[1]]["row_share"] == round(15 / 45, 4)
    assert {k: v["rows"] for k, v in m.details["provenance"]["base"]["sampling"].items()} == {labels[0]: 30}
    assert {k: v["rows"] for k, v in m.details["provenance"]["new"]["sampling"].items()} == {labels[1]: 20}
    # Not in the metrics: a column per engine version or sampling string would widen `dvc metrics show` each round.
    assert "provenance" not in json.loads((root / "metrics/merge.json").read_text())
    # Row by row: every merged row names the round that made it.
    meta = fmt.read_meta(root / "data/merged")
    rows = [p for s in meta.shards for p in provenance.per_row(s.provenance, s.num_rows)]
    ids = [i for t in fmt.mapped_shards(root / "data/merged", [s.filename for s in meta.shards])
           for i in t.column("id").to_pylist()]
    assert ids == r1_ids + kept
    assert rows == [provenance.of_generation(warm)] * 30 + [provenance.of_generation(greedy)] * 15


def test_rows_of_another_target_are_refused_naming_the_param_and_merged_with_it(tmp_path, tok_dir):
    root = tmp_path
    round_of(root, "data/bases/r1", tok_dir, [f"a{i}" for i in range(10)], generation(OTHER_TARGET, 0.7), seed=1)
    round_of(root, "data/tokenized", tok_dir, [f"b{i}" for i in range(6)], generation(f"path:{tok_dir}", 0.7), seed=2)
    with pytest.raises(MergeGuardError, match=r"10 rows of f00df00df00d.*merge\.allow_other_target: true"):
        merge_run(root, base=str(root / "data/bases/r1"))
    assert not (root / "data/merged").exists()
    m = merge_run(root, base=str(root / "data/bases/r1"), allow_other_target=True)
    assert {k: v["rows"] for k, v in m.details["provenance"]["merged"]["target"].items()} == {
        OTHER_TARGET: 10, f"path:{tok_dir}": 6}


def test_new_rows_of_another_target_are_refused_too(tmp_path, tok_dir):
    root = tmp_path
    round_of(root, "data/tokenized", tok_dir, [f"b{i}" for i in range(6)], generation(OTHER_TARGET, 0.7), seed=2)
    with pytest.raises(MergeGuardError, match=r"data/tokenized holds rows generated by another target model"):
        merge_run(root)


def test_a_base_made_before_provenance_was_recorded_counts_as_unknown(tmp_path, tok_dir):
    root = tmp_path
    old = round_of(root, "data/bases/r1", tok_dir, [f"a{i}" for i in range(10)], None, seed=1)
    round_of(root, "data/tokenized", tok_dir, [f"b{i}" for i in range(6)], generation(f"path:{tok_dir}", 0.7), seed=2)
    m = merge_run(root, base=str(root / "data/bases/r1"))  # unknown is not another target: merged
    merged = m.details["provenance"]["merged"]
    assert merged["engine"]["unknown"]["rows"] == 10 and merged["engine"]["sglang 0.5.4"]["rows"] == 6
    assert merged["thinking"]["unknown"]["tokens"] == int(np.sum(old.column("num_tokens").to_numpy()))
    assert m.details["provenance"]["base"]["target"] == {"unknown": {"rows": 10, "tokens": merged["thinking"][
        "unknown"]["tokens"], "row_share": 1.0, "token_share": 1.0}}


def test_provenance_survives_generate_tokenize_merge(tmp_path, tok_dir):
    """One real run of the three stages: the fake SGLang server reports its version, every completion records it,
    and the merged set's rows keep the target, the engine, the sampling and the thinking mode they were made with."""
    root = tmp_path
    info = write_target(root / "data/target/target.json", tok_dir)
    prompts = make_prompts(6)
    write_jsonl(root / "data/prompts/train.jsonl", prompts)
    with FakeSGLang(model=str(tok_dir), version="0.5.4.post1") as srv:
        p = sglang_params(srv.url, temperature=0.6, top_p=0.95, top_k=20, model=str(tok_dir))
        run_in(root, p)
    write_json(root / "data/target/target.json", info.to_dict())
    tokenize_params = TokenizeParams.parse(default_params("tokenize", workers=1), "tokenize")
    execute("tokenize", run_tokenize, tokenize_params, TokenizeArgs(
        completions=root / "data/completions", target=root / "data/target/target.json", out=root / "data/tokenized",
        metrics=root / "metrics/tokenize.json", report=root / "reports/tokenize.json", plot=root / "plots/seq_len.csv"))
    m = merge_run(root)
    expected = {"model_fingerprint": f"path:{tok_dir}", "engine": {"name": "sglang", "version": "0.5.4.post1"},
                "sampling": {"max_tokens": 32, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "seed": 0},
                "enable_thinking": False}
    meta = fmt.read_meta(root / "data/merged")
    assert meta.num_rows == 6
    assert [json.loads(p) for s in meta.shards for p in provenance.per_row(s.provenance, s.num_rows)] == [expected] * 6
    merged = m.details["provenance"]["merged"]
    assert {kind: list(by_label) for kind, by_label in merged.items()} == {
        "target": [f"path:{tok_dir}"], "engine": ["sglang 0.5.4.post1"],
        "sampling": ["max_tokens=32 seed=0 temperature=0.6 top_k=20 top_p=0.95"], "thinking": ["off"]}
