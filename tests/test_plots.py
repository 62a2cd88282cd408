"""Every plot dvc.yaml declares names a template DVC has (built in, or a custom one under .dvc/plots/) whose x and y
are columns its CSV writer produces: a categorical mix is drawn as bars, never as a line over row numbers."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BUILT_IN = {"simple", "linear", "confusion", "confusion_normalized", "scatter", "scatter_jitter", "smooth",
            "bar_horizontal_sorted", "bar_horizontal"}
# Plots of categories (a mix, a histogram): bars or columns.
CATEGORICAL = {"prompts_mix.csv", "prompts_shares.csv", "prompts_languages.csv", "merge_mix.csv", "seq_len.csv"}


def _plots() -> dict[str, dict]:
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    out = {}
    for stage in stages.values():
        for entry in stage.get("plots", []):
            (path, spec), = entry.items()
            out[path.rsplit("/", 1)[-1]] = spec
    return out


def test_every_template_exists_and_categories_are_bars() -> None:
    plots = _plots()
    assert CATEGORICAL <= set(plots)
    for name, spec in plots.items():
        template = spec.get("template")
        if template is None:
            assert name not in CATEGORICAL, f"{name}: a category plot needs a bar template"
            continue
        custom = REPO / ".dvc" / "plots" / f"{template}.json"
        assert template in BUILT_IN or custom.is_file(), f"{name}: no template {template}"
        if custom.is_file():
            body = json.loads(custom.read_text())
            assert body["mark"]["type"] == "bar" and "<DVC_METRIC_DATA>" in json.dumps(body)
        if name in CATEGORICAL:
            assert template.startswith("bar") or template in ("stacked_bars", "grouped_bars", "columns"), name
