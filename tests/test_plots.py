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
            marks = [layer["mark"]["type"] for layer in body.get("layer", [body])]
            assert "<DVC_METRIC_DATA>" in json.dumps(body), f"{template}: DVC cannot fill it"
            assert name not in CATEGORICAL or marks == ["bar"], f"{name}: a category plot needs bars, not {marks}"
        if name in CATEGORICAL:
            assert template.startswith("bar") or template in ("stacked_bars", "grouped_bars", "columns"), name


def test_the_error_bar_plot_reads_columns_the_evaluate_stage_writes() -> None:
    """The interval plot's template names its bounds and colour by field (low, high, split): each must be a column of
    evaluate's interval CSV, as the plot's x and y are."""
    from draftline.evaluate.report import INTERVAL_COLUMNS

    spec = _plots()["acceptance_intervals"]
    body = json.loads((REPO / ".dvc" / "plots" / f"{spec['template']}.json").read_text())
    fields = {v["field"] for layer in body["layer"] for v in layer["encoding"].values() if "field" in v}
    fields |= {v["field"] for v in body["encoding"].values() if "field" in v}
    named = {f for f in fields if not f.startswith("<DVC_") and f != "rev"}  # rev: DVC's own column
    assert {spec["x"], spec["y"]} | named <= set(INTERVAL_COLUMNS), named - set(INTERVAL_COLUMNS)
    assert {"low", "high", "split"} <= named
