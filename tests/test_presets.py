"""The real-model preset (scripts/smollm2.sh) stays a valid set of params as params.yaml changes.

The preset runs for most of an hour on the real model, so it runs only as a benchmark (docs/target.md); here its
``-S`` overrides are applied to params.yaml by DVC's own override code (what ``dvc exp run -S`` calls) and every
section is parsed by the stages' own params classes: a renamed or removed key, or a value a stage refuses, fails
here rather than an hour into a user's run.
"""

from __future__ import annotations

import re
import shlex
import shutil

import pytest
import yaml
from conftest import REPO
from dvc.utils.hydra import apply_overrides

from draftline.evaluate.params import EvalParams
from draftline.export.params import ExportParams
from draftline.generate.params import GenerateParams
from draftline.prompts.params import BlendParams, PromptsParams
from draftline.serve.params import ServeParams
from draftline.target.params import TargetParams
from draftline.train.params import TrainParams

SCRIPT = REPO / "scripts" / "smollm2.sh"


def preset_overrides() -> list[str]:
    """The ``-S`` values of the script's ``dvc exp run``, ``$GGUF`` filled in from the script."""
    text = SCRIPT.read_text(encoding="utf-8")
    gguf = re.search(r"^GGUF=(\S+)$", text, re.MULTILINE).group(1)
    launch = re.search(r"^LAUNCH='([^'\n]*)'$", text, re.MULTILINE).group(1)
    command = (text[text.index("exec dvc exp run"):].replace("\\\n", " ").replace('"$GGUF"', gguf)
               .replace('"generate.launch=$LAUNCH"', shlex.quote(f"generate.launch={launch}")))
    words = shlex.split(command.split("\n", 1)[0])
    return [words[i + 1] for i, w in enumerate(words) if w == "-S"]


@pytest.fixture(scope="module")
def preset(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("preset") / "params.yaml"
    shutil.copyfile(REPO / "params.yaml", path)
    apply_overrides(path, preset_overrides())
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_every_override_names_a_key_params_yaml_has(preset):
    overrides = preset_overrides()
    assert len(overrides) >= 10 and "prompts.tools_unsupported=drop" in overrides
    # DVC itself refuses a plain override of a missing key; the removed key and the added one are the blend's
    assert preset["blend"]["sources"]["http_traces"] == {"weight": 1}


def test_the_stages_accept_the_preset(preset):
    target = TargetParams.parse(preset["target"], "target")
    assert target.path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    PromptsParams.parse(preset["prompts"], "prompts")
    blend = BlendParams.parse(preset["blend"], "blend")
    assert blend.total == 1000
    generate = GenerateParams.parse(preset["generate"], "generate")
    assert generate.launch.engine == "llama.cpp" and generate.launch.llama_cpp.servers == "auto"
    train = TrainParams.parse(preset["train"], "train")
    assert train.target_layers == 3  # a count spread over the 30 layers, not the embedded target's [0, 1, 2]
    assert train.max_tokens_per_batch >= train.max_length
    EvalParams.parse(preset["evaluate"], "evaluate")
    assert ExportParams.parse(preset["export"], "export").formats == ["gguf"]
    assert ServeParams.parse(preset["serve"], "serve").engine == "llama.cpp"  # the served figure ends the run
