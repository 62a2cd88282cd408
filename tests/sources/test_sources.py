"""The sources stage: real rows of every source schema, broken lines, every input kind, the load_dataset path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftline.core.raw import RAW_FILE, json_columns, read_raw
from draftline.core.runner import execute, run_file
from draftline.core.skips import SkipError
from draftline.core.source_spec import SourceSpec
from draftline.sources.stage import SourceArgs, run_source

REPO = Path(__file__).resolve().parents[2]
FIXTURES = [
    "infinity_instruct_gen", "infinity_instruct_7M", "metamathqa", "codefeedback_filtered_instruction",
    "hermes_function_calling_v1", "agent_glaive_toolcall_sharegpt", "agent_reason_tool_use_llamafactory_v1",
    "openai_multimodal_request_bodies",
]


def source_args(root: Path, name: str, raw: str = "raw", reports: str = "reports") -> SourceArgs:
    return SourceArgs(source=name, out=root / raw / name, report=root / reports / f"{name}.json")


def run(tmp_path: Path, name: str, **params) -> dict:
    """The stage's report (what it read, skipped and wrote) after a run of source ``name``."""
    params.setdefault("adapter", name)
    args = source_args(tmp_path, name)
    execute("sources", run_source, SourceSpec.parse(params, f"sources.{name}"), args)
    return json.loads(args.report.read_text())


def raw_rows(tmp_path: Path, name: str) -> list[dict]:
    rows = list(read_raw(tmp_path / "raw" / name))
    assert [i for i, _ in rows] == list(range(len(rows)))
    return [r for _, r in rows]


def filled(rows: list[dict]) -> list[dict]:
    """What read_raw promises: every column on every row, a key a row lacked as None."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    return [{c: r.get(c) for c in cols} for r in rows]


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows))
    return path


def test_fixture_list_covers_every_real_file(datasets_dir):
    assert sorted(FIXTURES) == sorted(p.stem for p in datasets_dir.glob("*.jsonl"))


@pytest.mark.parametrize("name", FIXTURES)
def test_real_rows_load_with_values_preserved(tmp_path, datasets_dir, name):
    src = datasets_dir / f"{name}.jsonl"
    originals = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    metrics = run(tmp_path, name, path=str(src))
    assert metrics["rows_read"] == metrics["rows_written"] == len(originals)
    assert metrics["skips"] == {}
    got = raw_rows(tmp_path, name)
    assert got == filled(originals)
    # Same values, and the same JSON types: an int stays an int, a float a float.
    assert json.dumps(got, sort_keys=True) == json.dumps(filled(originals), sort_keys=True)


def test_real_schemas_are_native_where_arrow_can_hold_them(tmp_path, datasets_dir):
    run(tmp_path, "ii", path=str(datasets_dir / "infinity_instruct_7M.jsonl"))
    schema = pq.read_schema(tmp_path / "raw" / "ii" / RAW_FILE)
    assert schema.field("id").type == pa.int64()
    assert schema.field("conversations").type == pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())]))
    assert schema.field("label").type.num_fields == 4
    assert json_columns(schema) == []

    # Request bodies: an object in most rows, null beside raw text in one, differing keys: no single Arrow type.
    m = run(tmp_path, "http", path=str(datasets_dir / "openai_multimodal_request_bodies.jsonl"))
    assert m["json_columns"] == ["body"]
    rows = raw_rows(tmp_path, "http")
    assert isinstance(rows[0]["body"]["messages"][0]["content"], list)
    assert isinstance(rows[3]["body"]["messages"][0]["content"], str)
    bad = [r for r in rows if r["body"] is None]
    assert len(bad) == 1 and bad[0]["body_raw"].startswith("{") and bad[0]["parse_error"]


def test_mixed_types_stored_as_json_and_given_back(tmp_path):
    rows = [
        {"content": "plain", "n": 1, "big": 2**70, "meta": {"a": 1}, "empty": {}, "x": 1.5},
        {"content": [{"type": "text", "text": "hi"}], "n": 2.5, "big": 1, "meta": {"b": "two"}, "empty": {}, "x": 2.0},
        {"content": None, "n": None, "meta": None, "x": None},
    ]
    m = run(tmp_path, "mixed", path=str(write_jsonl(tmp_path / "m.jsonl", rows)))
    assert set(m["json_columns"]) == {"content", "n", "big", "meta", "empty"}
    got = raw_rows(tmp_path, "mixed")
    assert json.dumps(got, sort_keys=True) == json.dumps(filled(rows), sort_keys=True)
    assert pq.read_schema(tmp_path / "raw" / "mixed" / RAW_FILE).field("x").type == pa.float64()


def test_broken_lines_counted_with_line_numbers(tmp_path, caplog):
    path = write_jsonl(tmp_path / "b.jsonl", [{"q": "one"}, '{"q": "tw', "", {"q": "three"}, "[1, 2]", "not json"])
    m = run(tmp_path, "b", path=str(path))
    assert (m["rows_read"], m["rows_written"]) == (5, 2)
    assert m["skips"] == {"invalid JSON": 2, "not an object": 1}
    assert [b["where"] for b in m["broken"]] == [f"{path}:2", f"{path}:5", f"{path}:6"]
    assert raw_rows(tmp_path, "b") == [{"q": "one"}, {"q": "three"}]
    assert f"{path}:2" in caplog.text


def test_strict_raises_naming_file_and_line_and_keeps_old_output(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"q": "one"}, {"q": "two"}])
    run(tmp_path, "s", path=str(path))
    before = (tmp_path / "raw" / "s" / RAW_FILE).read_bytes()
    write_jsonl(path, [{"q": "one"}, {"q": "two"}, '{"q": oops}'])
    with pytest.raises(SkipError, match=rf"{path}:3: invalid JSON"):
        run(tmp_path, "s", path=str(path), strict=True)
    assert (tmp_path / "raw" / "s" / RAW_FILE).read_bytes() == before


def test_json_array_parquet_and_folder_inputs(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"a{i}", "score": i} for i in range(7)]
    (tmp_path / "arr.json").write_text(json.dumps(rows, indent=2))
    run(tmp_path, "arr", path=str(tmp_path / "arr.json"))
    assert raw_rows(tmp_path, "arr") == rows

    # A .json file that holds JSON Lines (as many hub datasets name them).
    write_jsonl(tmp_path / "lines.json", rows[:3])
    run(tmp_path, "lines", path=str(tmp_path / "lines.json"))
    assert raw_rows(tmp_path, "lines") == rows[:3]

    # Parquet keeps its own schema (int32 stays int32) and metadata.
    table = pa.table({"id": pa.array([1, 2, 3], pa.int32()), "text": ["x", "y", "z"]})
    pq.write_table(table, tmp_path / "t.parquet")
    run(tmp_path, "pq", path=str(tmp_path / "t.parquet"), max_rows=2)
    out = pq.read_table(tmp_path / "raw" / "pq" / RAW_FILE)
    assert out.schema.field("id").type == pa.int32() and out.num_rows == 2
    assert raw_rows(tmp_path, "pq") == [{"id": 1, "text": "x"}, {"id": 2, "text": "y"}]

    # A folder is read in sorted path order, recursively; other files are ignored; max_rows spans files.
    write_jsonl(tmp_path / "dir" / "b" / "part-0.jsonl", rows[3:5])
    write_jsonl(tmp_path / "dir" / "a.jsonl", rows[:3])
    (tmp_path / "dir" / "README.md").write_text("not data")
    m = run(tmp_path, "dir", path=str(tmp_path / "dir"), max_rows=4)
    assert m["files"] == 2 and m["rows_written"] == 4
    assert raw_rows(tmp_path, "dir") == rows[:4]

    pq.write_table(table, tmp_path / "dir" / "c.parquet")
    with pytest.raises(ValueError, match="mixes Parquet and JSON"):
        run(tmp_path, "dir", path=str(tmp_path / "dir"))


def test_bad_params_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="exactly one of"):
        run(tmp_path, "x", path="a.jsonl", hf="org/ds", revision="abc")
    with pytest.raises(ValueError, match="needs `revision`"):
        run(tmp_path, "x", hf="org/ds")
    with pytest.raises(ValueError, match="unknown key"):
        run(tmp_path, "x", path="a.jsonl", max_row=3)
    with pytest.raises(ValueError, match="max_rows"):
        run(tmp_path, "x", path="a.jsonl", max_rows=0)
    with pytest.raises(FileNotFoundError, match="missing.jsonl does not exist"):
        run(tmp_path, "x", path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="gave no rows"):
        run(tmp_path, "x", path=str(write_jsonl(tmp_path / "bad.jsonl", ["nope"])))


@pytest.fixture
def hub_like_folder(tmp_path, datasets_dir) -> Path:
    """A local dataset repo laid out like BAAI/Infinity-Instruct: two configs declared in the README's YAML."""
    root = tmp_path / "Infinity-Instruct"
    for config, fixture in (("7M", "infinity_instruct_7M"), ("Gen", "infinity_instruct_gen")):
        (root / config).mkdir(parents=True)
        (root / config / "train.jsonl").write_bytes((datasets_dir / f"{fixture}.jsonl").read_bytes())
    (root / "README.md").write_text(
        "---\nconfigs:\n- config_name: 7M\n  data_files:\n  - split: train\n    path: 7M/train.jsonl\n"
        "- config_name: Gen\n  data_files:\n  - split: train\n    path: Gen/train.jsonl\n---\n"
    )
    return root


@pytest.mark.parametrize("streaming", [False, True])
def test_load_dataset_path_on_a_local_dataset_folder(tmp_path, datasets_dir, hub_like_folder, streaming, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    originals = [json.loads(line) for line in (datasets_dir / "infinity_instruct_7M.jsonl").read_text().splitlines()]
    m = run(tmp_path, "ii", hf=str(hub_like_folder), revision="main", config="7M", split="train", max_rows=5,
            streaming=streaming, adapter="infinity_instruct")
    assert m["rows_written"] == 5 and m["origin"].startswith("hf:")
    got = raw_rows(tmp_path, "ii")
    assert [r["id"] for r in got] == [r["id"] for r in originals[:5]]
    assert [r["conversations"] for r in got] == [r["conversations"] for r in originals[:5]]
    assert got[0]["label"] == originals[0]["label"]


def test_two_runs_give_identical_bytes(tmp_path, datasets_dir):
    src = str(datasets_dir / "openai_multimodal_request_bodies.jsonl")
    spec = SourceSpec.parse({"path": src, "adapter": "http_traces"}, "sources.a")
    first, second = source_args(tmp_path, "a", "r1", "m1"), source_args(tmp_path, "a", "r2", "m2")
    execute("sources", run_source, spec, first)
    execute("sources", run_source, spec, second)
    assert (first.out / RAW_FILE).read_bytes() == (second.out / RAW_FILE).read_bytes()
    assert first.report.read_bytes() == second.report.read_bytes()  # the time is the run file's alone
    assert json.loads(run_file(first.report).read_text())["stage_seconds"] >= 0


def test_stage_script_reads_its_params(tmp_path):
    sample = REPO / "data" / "samples" / "webinstructsub.jsonl"
    (tmp_path / "params.yaml").write_text(
        f"sources:\n  web:\n    path: {sample}\n    adapter: webinstructsub\n    max_rows: 50\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    script = str(REPO / "stages" / "sources.py")

    def stage(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, script, "--source", name, "--out", f"raw/{name}", "--report",
                               f"reports/{name}.json"], cwd=tmp_path, env=env, capture_output=True, text=True)

    assert stage("web").returncode == 0
    assert json.loads((tmp_path / "reports" / "web.json").read_text())["rows_written"] == 50
    assert len(list(read_raw(tmp_path / "raw" / "web"))) == 50
    # An expected refusal is its message alone: one line, exit 1, no traceback.
    bad = stage("nope")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1] == (
        "sources@nope: params.yaml: sources has no entry 'nope'; it has ['web']")
