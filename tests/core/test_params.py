"""One params pattern: every section of the repository's params.yaml parses with its stage's dataclass, and a
misspelt key at any depth is refused before any work, naming itself and the keys valid there."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from draftline.conversations.params import ConversationsParams
from draftline.core.params import Params, ParamsError, load_value
from draftline.core.source_spec import SourceSpec
from draftline.evaluate.params import EvalParams
from draftline.export.params import ExportParams
from draftline.generate.params import GenerateParams
from draftline.merge.params import MergeParams
from draftline.prompts.params import BlendParams, DecontaminateParams, DedupParams, PromptsParams
from draftline.serve.params import ServeParams
from draftline.target.params import TargetParams
from draftline.tokenize.params import TokenizeParams
from draftline.train.params import TrainParams

PARAMS = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
SECTIONS: dict[str, type[Params]] = {
    "conversations": ConversationsParams, "target": TargetParams, "prompts": PromptsParams, "dedup": DedupParams,
    "blend": BlendParams, "generate": GenerateParams, "tokenize": TokenizeParams, "merge": MergeParams,
    "export": ExportParams, "train": TrainParams, "evaluate": EvalParams, "serve": ServeParams,
    "decontaminate": DecontaminateParams,
}
# Nested mappings of keys, each checked like a section (a path into params.yaml).
NESTED = [("target", "embedded"), ("dedup", "near"), ("generate", "local"), ("blend", "sources", "agent"),
          ("export", "gguf")]


def test_every_section_of_params_yaml_is_known_and_parses():
    assert set(PARAMS) == set(SECTIONS) | {"sources"}
    for name, cls in SECTIONS.items():
        cls.parse(PARAMS[name], name)
    for name, entry in PARAMS["sources"].items():
        SourceSpec.parse(entry, f"sources.{name}")


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_a_misspelt_top_level_key_is_refused_naming_it_and_the_valid_keys(section):
    values = {**PARAMS[section], "treshold": 1}
    with pytest.raises(ParamsError, match=rf"{section} has unknown key\(s\) \['treshold'\]; valid keys: \[") as e:
        SECTIONS[section].parse(values, section)
    assert all(key in str(e.value) for key in PARAMS[section])


@pytest.mark.parametrize("path", NESTED, ids=".".join)
def test_a_misspelt_nested_key_is_refused_naming_where(path):
    values = copy.deepcopy(PARAMS[path[0]])
    node = values
    for key in path[1:]:
        node = node[key]
    node["treshold"] = 1
    with pytest.raises(ParamsError, match=rf"{'.'.join(path)} has unknown key\(s\) \['treshold'\]"):
        SECTIONS[path[0]].parse(values, path[0])


def test_a_misspelt_source_key_is_refused():
    with pytest.raises(ParamsError, match=r"sources.agent has unknown key\(s\) \['max_row'\]"):
        SourceSpec.parse({**PARAMS["sources"]["agent"], "max_row": 3}, "sources.agent")


def test_a_missing_key_is_an_error_not_a_default():
    values = {k: v for k, v in PARAMS["train"].items() if k != "lr"}
    with pytest.raises(ParamsError, match=r"train lacks key\(s\) \['lr'\]"):
        TrainParams.parse(values, "train")


def test_types_and_choices_are_checked():
    with pytest.raises(ParamsError, match=r"train.lr must be a number, not 'fast'"):
        TrainParams.parse({**PARAMS["train"], "lr": "fast"}, "train")
    with pytest.raises(ParamsError, match=r"tokenize.overflow must be one of \['drop', 'truncate'\]"):
        TokenizeParams.parse({**PARAMS["tokenize"], "overflow": "wrap"}, "tokenize")
    with pytest.raises(ParamsError, match=r"generate.local.batch_size must be an integer"):
        GenerateParams.parse({**PARAMS["generate"], "local": {**PARAMS["generate"]["local"], "batch_size": True}},
                             "generate")
    # An int is a number; an int or a list of ints are both target_layers.
    assert TrainParams.parse({**PARAMS["train"], "lr": 1, "target_layers": 5}, "train").lr == 1.0


def test_load_value_reads_one_key_of_another_section(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"generate": {"enable_thinking": True}}))
    assert load_value("generate.enable_thinking", bool, path) is True
    with pytest.raises(ParamsError, match="no generate.thinking"):
        load_value("generate.thinking", bool, path)


def test_a_stage_script_refuses_a_misspelt_key_before_any_work(tmp_path):
    params = copy.deepcopy(PARAMS)
    params["dedup"]["near"]["treshold"] = 0.5
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    paths = [arg for flag in ("conversations", "target", "out", "metrics", "report", "plot", "plot-shares", "plot-languages",
                              "drafters", "bases", "sets")
             for arg in (f"--{flag}", f"out/{flag}")]
    run = subprocess.run([sys.executable, str(REPO / "stages" / "prompts.py"), *paths], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    # A refusal, not a bug: its one message, exit 1, no traceback.
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [
        "prompts: params.yaml: dedup.near has unknown key(s) ['treshold']; valid keys: "
        "['enabled', 'exact_numbers', 'ngram', 'num_perm', 'seed', 'threshold']"]
    assert not Path(tmp_path / "out").exists()  # nothing read, nothing written
