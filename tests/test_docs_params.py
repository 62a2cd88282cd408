"""Every stage doc's params table says what ``params.yaml`` holds, as the layout test does for paths.

Each docs/<stage>.md has a ``## Params`` section whose first table names ``params.yaml`` keys in its first column,
relative to the section the doc documents (docs/prompts.md documents four sections and names keys in full). A row
may name several keys, later ones relative to the first's parent (``a.b, .c`` and ``a.b, c`` name ``a.b`` and
``a.c``). Checked, per doc:

- every key its table names exists in ``params.yaml``; below a ``<name>`` (a mapping of the user's own names, such
  as ``sources.<name>``) only the part above it, since ``params.yaml`` sets only some of an entry's keys;
- every leaf of every section it owns is named, itself or by a key above it (``local`` names ``local.device``);
  a section no doc owns fails, naming it;
- a default the table states equals ``params.yaml``'s, both read as YAML: the cell, or one comma-separated part of
  it per key, that starts with a backticked value or is one word or a flow list or mapping (``8``, ``null``,
  ``[0.9, 0.95]``). A default described in words (``tool/agent sources first``) is not checked.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from conftest import REPO

PARAMS = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
# doc -> (what its table's keys are relative to, the params.yaml sections it owns)
DOCS = {
    "sources": ("sources.<name>", ["sources"]),
    "conversations": ("conversations", ["conversations"]),
    "target": ("target", ["target"]),
    "prompts": ("", ["prompts", "dedup", "decontaminate", "blend"]),
    "generate": ("generate", ["generate"]),
    "tokenize": ("tokenize", ["tokenize"]),
    "merge": ("merge", ["merge"]),
    "export": ("export", ["export"]),
    "train": ("train", ["train"]),
    "evaluate": ("evaluate", ["evaluate"]),
    "serve": ("serve", ["serve"]),
}
# A ``|`` that ends a cell: one with an even number of backticks after it (not inside a code span).
CELL_END = re.compile(r"\|(?=(?:[^`]*`[^`]*`)*[^`]*$)")


def params_table(text: str, name: str) -> list[list[str]]:
    """The body rows (cells) of the first table under the ``## Params`` heading of a doc's ``text``."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## Params")), None)
    assert start is not None, f"docs/{name}.md has no '## Params' section"
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in CELL_END.split(line.strip().strip("|"))])
        elif rows or line.startswith("## "):
            break
    assert len(rows) > 2, f"docs/{name}.md's Params section has no table"
    return rows[2:]  # after the header and its |---| line


def row_keys(cell: str, prefix: str) -> list[str]:
    """The full keys a first cell names (code spans, else comma-separated words), later ones relative to the first's
    parent when they start with ``.`` or have no dot."""
    names = re.findall(r"`([^`]+)`", cell) or [n.strip() for n in cell.split(",")]
    first = ".".join(p for p in (prefix, names[0]) if p)
    parent = first.rsplit(".", 1)[0]
    return [first] + [f"{parent}.{n.lstrip('.')}" if n.startswith(".") or "." not in n
                      else ".".join(p for p in (prefix, n) if p) for n in names[1:]]


def _top_level_parts(cell: str) -> list[str]:
    """``cell`` split at the commas outside code spans and brackets."""
    parts, depth, code, start = [], 0, False, 0
    for i, ch in enumerate(cell):
        code ^= ch == "`"
        depth += (ch in "[{(") - (ch in "]})") if not code else 0
        if ch == "," and not code and depth == 0:
            parts.append(cell[start:i])
            start = i + 1
    return [p.strip() for p in [*parts, cell[start:]]]


def _stated(part: str) -> str | None:
    """The value a default cell's part states: a backticked value it starts with, or the part itself where it is one
    word or a flow list or mapping; None for words that describe (``tool/agent sources first``)."""
    if m := re.match(r"`([^`]*)`", part):
        return m.group(1)
    return part if part and (" " not in part or part[0] in "[{") else None


def stated_defaults(cell: str, count: int) -> list[str | None]:
    """Per key of the row, the default its cell states (one comma-separated part per key), or None."""
    parts = _top_level_parts(cell)
    return [_stated(p) for p in parts] if len(parts) == count else [None] * count


def lookup(params: dict, key: str) -> tuple[bool, Any]:
    """Whether ``key`` (dotted) is in ``params`` and its value; a ``<name>`` part ends the walk (found)."""
    node: Any = params
    for part in key.split("."):
        if part.startswith("<"):
            return True, None
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def leaves(node: Any, path: str = "") -> list[str]:
    """The dotted keys of ``node``'s values that are not (non-empty) mappings."""
    if not isinstance(node, dict) or not node:
        return [path]
    return [leaf for k, v in node.items() for leaf in leaves(v, f"{path}.{k}" if path else k)]


def _names(key: str, leaf: str) -> bool:
    """Whether the documented ``key`` is ``leaf`` or above it (``<name>`` standing for any one part)."""
    want, have = key.split("."), leaf.split(".")
    return len(want) <= len(have) and all(w.startswith("<") or w == h for w, h in zip(want, have))


def _yaml(text: str) -> Any:
    value = yaml.safe_load(text)
    try:
        return float(value) if isinstance(value, str) else value  # YAML 1.1 reads 1e-3 as a string
    except ValueError:
        return value


def table_problems(rows: list[list[str]], prefix: str, sections: list[str], params: dict) -> list[str]:
    """What a params table gets wrong about ``params``: keys it names that are not there, leaves of ``sections`` it
    does not name, and backticked defaults that differ."""
    keyed = [(keys, stated_defaults(row[1], len(keys)) if len(row) > 2 else [None] * len(keys))
             for row in rows for keys in [row_keys(row[0], prefix)]]
    named = [k for keys, _ in keyed for k in keys]
    problems = [f"{k}: not in params.yaml" for k in named if not lookup(params, k)[0]]
    problems += [f"{leaf}: in params.yaml, not in the table" for s in sections for leaf in leaves(params[s], s)
                 if not any(_names(k, leaf) for k in named)]
    for keys, defaults in keyed:
        for key, default in zip(keys, defaults):
            found, value = lookup(params, key)
            if default is not None and found and _yaml(default) != value:
                problems.append(f"{key}: the table says {default}, params.yaml {value!r}")
    return problems


def test_every_section_has_a_doc() -> None:
    owned = {s for _, sections in DOCS.values() for s in sections}
    assert [s for s in PARAMS if s not in owned] == [], "params.yaml sections no doc's Params table documents"


@pytest.mark.parametrize("name", sorted(DOCS))
def test_the_params_table_matches_params_yaml(name: str) -> None:
    prefix, sections = DOCS[name]
    rows = params_table((REPO / "docs" / f"{name}.md").read_text(encoding="utf-8"), name)
    assert table_problems(rows, prefix, sections, PARAMS) == []


def test_the_check_fails_on_a_planted_mismatch() -> None:
    doc = ("# x\n\n## Params (`params.yaml: x`)\n\n| key | default | meaning |\n|---|---|---|\n"
           "| `a.b`, `.c` | `1`, `2` | two keys |\n| `gone` | `0` | not in params |\n"
           "| `d` | `{e: 1}` (the shape) | a mapping |\n| `m.<name>` | see params.yaml | names |\n"
           "| f, g | 2, words that describe | bare |\n\n## Next\n")
    params = {"x": {"a": {"b": 1, "c": 3}, "d": {"e": 1}, "m": {"u": {"v": 1}}, "f": 1, "g": 0, "new": None}}
    rows = params_table(doc, "x")
    assert [row_keys(r[0], "x") for r in rows] == [["x.a.b", "x.a.c"], ["x.gone"], ["x.d"], ["x.m.<name>"],
                                                   ["x.f", "x.g"]]
    assert table_problems(rows, "x", ["x"], params) == [
        "x.gone: not in params.yaml", "x.new: in params.yaml, not in the table",
        "x.a.c: the table says 2, params.yaml 3", "x.f: the table says 2, params.yaml 1"]
