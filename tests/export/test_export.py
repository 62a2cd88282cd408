"""The export stage: each format read back the way its trainer reads it, and merged again as a base.

SpecForge and speculators pin torch / datasets versions this environment cannot hold (and train only on GPUs), so
their readers are replayed from their source, cited at each check; the ``hf`` format is read by transformers itself.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import datasets
import pytest
import torch
from conftest import default_params
from merge_support import make_rows, train_tokenizer, write_target, write_tokenized
from transformers import Qwen3Config, Qwen3ForCausalLM

from draftline.core import dataset as fmt
from draftline.core.errors import MissingInput
from draftline.core.params import ParamsError
from draftline.core.runner import StageRun, execute, main, run_file
from draftline.export.params import ExportParams
from draftline.export.stage import ExportArgs, run_export
from draftline.merge.guards import MergeGuardError
from draftline.merge.params import MergeParams
from draftline.merge.stage import MergeArgs, run_merge

FORMATS = ["specforge", "speculators", "hf"]


def merge(root: Path, out: str, **params) -> dict:
    """The merge's details (its report)."""
    name = out.replace("/", "-")
    args = MergeArgs(tokenized=root / "data/tokenized", target=root / "data/target/target.json", out=root / out,
                     metrics=root / f"metrics-{name}.json", report=root / f"report-{name}.json",
                     plot=root / f"mix-{name}.csv", bases=root / "data/bases")
    return execute("merge", run_merge, MergeParams.parse(default_params("merge", **params), "merge"), args).details


GGUF = {"drafter": "f32", "target": "f32"}


def export_args(root: Path, merged: Path, out: Path) -> ExportArgs:
    # No gguf here: the drafter and target paths are passed as dvc.yaml passes them and never read.
    return ExportArgs(merged=merged, checkpoint=root / "data/checkpoints", target=root / "data/target/target.json",
                      out=out, metrics=root / "metrics/export.json", report=root / "reports/export.json")


def export(root: Path, formats: list[str], merged: Path, out: Path) -> StageRun:
    return execute("export", run_export, ExportParams.parse({"formats": formats, "gguf": GGUF}, "export"),
                   export_args(root, merged, out))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export")
    tok_dir = train_tokenizer(root / "tok")
    info = write_target(root / "data/target/target.json", tok_dir)
    write_tokenized(root / "data/tokenized", make_rows(tok_dir, [f"a{i}" for i in range(40)], seed=1), info)
    merge(root, "data/merged")
    export(root, FORMATS, root / "data/merged", root / "data/export")
    # The next round's new rows: ten repeat prompts of the exported set.
    write_tokenized(root / "data/tokenized",
                    make_rows(tok_dir, [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(15)], seed=2), info)
    return root


def merged_rows(root: Path) -> list[dict]:
    ds, order, _ = fmt.load_training_set(root / "data/merged")
    return ds.to_list()


def test_manifest_and_lineage_beside_every_format(world):
    meta = fmt.read_meta(world / "data/merged")
    manifest = json.loads((world / "data/export/export.json").read_text())
    assert manifest["formats"] == FORMATS
    for name in FORMATS:
        lineage = json.loads((world / "data/export" / name / "export.json").read_text())
        assert lineage["format"] == name and lineage["num_rows"] == meta.num_rows == 40
        assert lineage["tokenizer_fingerprint"] == meta.tokenizer_fingerprint
        assert lineage["enable_thinking"] is meta.enable_thinking is False


def test_metrics_through_the_runner(world):
    """Headline rows and formats; the report is the manifest; only the run file holds the time."""
    assert json.loads((world / "metrics/export.json").read_text()) == {"rows": 40, "formats": 3, "skipped": 0}
    report = json.loads((world / "reports/export.json").read_text())
    assert report == {**json.loads((world / "data/export/export.json").read_text()), "skips": {}}
    assert set(json.loads(run_file(world / "reports/export.json").read_text())) == {"stage_seconds"}


def test_export_off_writes_the_manifest_and_metrics_and_is_deterministic(world, tmp_path):
    reported = []
    for name in ("a", "b"):
        stage = export(tmp_path / name, [], world / "data/merged", tmp_path / name / "export")
        assert stage.headline == {"rows": 0, "formats": 0}
        assert [p.name for p in (tmp_path / name / "export").iterdir()] == [fmt.EXPORT_FILE]
        reported.append([(tmp_path / name / f).read_bytes() for f in ("metrics/export.json", "reports/export.json")])
    assert reported[0] == reported[1]


def test_a_missing_merged_set_is_refused_in_one_line(tmp_path, capsys):
    args = export_args(tmp_path, tmp_path / "merged", tmp_path / "export")
    with pytest.raises(MissingInput, match="run the merge stage first"):
        execute("export", run_export, ExportParams.parse({"formats": ["hf"], "gguf": GGUF}, "export"), args)
    argv = [f"--{k}={v}" for k, v in vars(args).items()]
    with pytest.raises(SystemExit) as exit_:
        main("export", ExportArgs, lambda _args: ExportParams.parse({"formats": ["hf"], "gguf": GGUF}, "export"), run_export, argv)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("export: ") and "run the merge stage" in line]) == 1
    assert not (tmp_path / "export").exists() and not (tmp_path / "metrics").exists()


def test_specforge_reads_it_as_pretokenized_prompts(world):
    """SpecForge ``specforge/data/prompt_builder.py``: ``prepare_prompt_tasks`` (l. 57-69) treats the file as
    pre-tokenized when its first record has ``input_ids`` and ``loss_mask``; ``_prompt_from_record`` /
    ``_normalize_integer_sequence`` (l. 219-287) want flat integer lists (bools refused in ids) of one length and a
    mask of exactly 0/1; DFlash keeps a record only with two adjacent supervised tokens."""
    lines = (world / "data/export/specforge/train.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert {"input_ids", "loss_mask"} <= set(records[0])
    for rec, row in zip(records, merged_rows(world)):
        ids, mask = rec["input_ids"], rec["loss_mask"]
        assert all(type(x) is int for x in ids) and set(mask) <= {0, 1} and len(ids) == len(mask)
        assert any(a and b for a, b in zip(mask, mask[1:]))
        assert ids == row["input_ids"] and mask == [int(m) for m in row["loss_mask"]] and rec["id"] == row["id"]


def test_speculators_reads_it_with_load_from_disk_in_torch_format(world):
    """speculators ``train/data.py`` ``ArrowDataset``: ``load_from_disk(datapath)`` (l. 164), lengths from
    ``self.data.with_format(None)["seq_len"]`` (l. 225), then ``self.data[index]["input_ids"]`` compared with
    ``torch.equal`` to the hidden-state file's ``token_ids`` and ``self.data[index]["loss_mask"]`` (l. 314-332)."""
    ds = datasets.load_from_disk(str(world / "data/export/speculators"))
    assert ds.format["type"] == "torch"
    rows = merged_rows(world)
    assert list(ds.with_format(None)["seq_len"]) == [r["num_tokens"] for r in rows]
    for i in (0, 17, 39):
        item = ds[i]
        assert item["input_ids"].dtype == torch.int64 and item["loss_mask"].dtype == torch.int64
        assert torch.equal(item["input_ids"], torch.tensor(rows[i]["input_ids"]))
        assert item["loss_mask"].tolist() == [int(m) for m in rows[i]["loss_mask"]]


def test_hf_labels_train_a_transformers_causal_lm_on_exactly_the_supervised_tokens(world):
    ds = datasets.load_from_disk(str(world / "data/export/hf")).with_format("torch")
    row = merged_rows(world)[3]
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    ids, labels = ds[3]["input_ids"][None], ds[3]["labels"][None]
    out = model(input_ids=ids, labels=labels)  # transformers' own loss: shifts, ignores -100
    logits = model(input_ids=ids).logits[0, :-1]
    targets = torch.tensor(row["input_ids"][1:])
    keep = torch.tensor(row["loss_mask"][1:])
    expected = torch.nn.functional.cross_entropy(logits[keep], targets[keep])
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.parametrize("name", FORMATS)
def test_an_exported_set_is_a_merge_base_with_its_lineage_as_the_claim(world, name):
    base = shutil.copytree(world / "data/export" / name, world / "data/bases" / f"export-{name}")  # where bases live
    m = merge(world, f"round2-{name}", base=str(base))
    g = m["guards"]
    assert g["base_kind"] == name and g["tokenizer_claim"] == "export.json"
    assert g["reencode"]["matched"] == g["reencode"]["checked"] > 0
    assert m["overlap"]["dropped"] == 10 and m["merged"]["samples"] == 40 + 15
    merged = fmt.load(world / f"round2-{name}")
    assert merged.num_rows == 55
    assert merged.select(range(40))["input_ids"] == [r["input_ids"] for r in merged_rows(world)]


def test_a_foreign_set_without_lineage_needs_a_claim_and_a_wrong_one_is_refused(world):
    bare = world / "data/bases/bare-speculators"
    datasets.load_from_disk(str(world / "data/export/speculators")).save_to_disk(str(bare))  # no export.json
    with pytest.raises(MergeGuardError, match="nothing says which tokenizer"):
        merge(world, "round2-bare", base=str(bare))
    assert merge(world, "round2-assumed", base=str(bare), assume_same_tokenizer=True)["guards"]["base_kind"] == "speculators"
    lying = world / "data/bases/lying-hf"
    datasets.load_from_disk(str(world / "data/export/hf")).save_to_disk(str(lying))
    claim = json.loads((world / "data/export/hf/export.json").read_text())
    (lying / "export.json").write_text(json.dumps({**claim, "tokenizer_fingerprint": "0" * 64}))
    info = json.loads((world / "data/target/target.json").read_text())
    with pytest.raises(MergeGuardError, match=re.escape(
            f"params.yaml: merge.base ({lying}) was made, says its export.json, with tokenizer fingerprint "
            f"000000000000, the target's is {info['tokenizer_fingerprint'][:12]}: ")):
        merge(world, "round2-lying", base=str(lying))


def test_export_params_are_checked():
    with pytest.raises(ParamsError, match="must be one of"):
        ExportParams.parse({"formats": ["eagle"], "gguf": GGUF}, "export")
    with pytest.raises(ParamsError, match="twice"):
        ExportParams.parse({"formats": ["hf", "hf"], "gguf": GGUF}, "export")
