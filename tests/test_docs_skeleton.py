"""Every stage doc stands on one skeleton, so a reader finds the same thing in the same place in each.

A stage doc (each docs/*.md but the benchmarks index) has a title and a lead, then exactly these second-level
sections in this order, each with text in it: what it does, inputs and outputs, params, guarantees, tests, known
limits. A heading may say more after its name (``## Params (`params.yaml: merge`)``); the topics of a stage are
third-level sections inside them. Headings inside code fences are not headings.
"""

from __future__ import annotations

import pytest
from conftest import REPO

SKELETON = ("What it does", "Inputs and outputs", "Params", "Guarantees", "Tests", "Known limits")
STAGE_DOCS = sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "benchmarks.md")


def sections(text: str) -> list[tuple[str, str]]:
    """``(heading, body)`` of each second-level section, code fences skipped."""
    out: list[tuple[str, list[str]]] = []
    fenced = False
    for line in text.splitlines():
        fenced ^= line.lstrip().startswith("```")
        if not fenced and line.startswith("## "):
            out.append((line[3:].strip(), []))
        elif out:
            out[-1][1].append(line)
    return [(heading, "\n".join(body).strip()) for heading, body in out]


def test_the_docs_are_found() -> None:
    assert len(STAGE_DOCS) >= 11, [p.name for p in STAGE_DOCS]


@pytest.mark.parametrize("doc", STAGE_DOCS, ids=lambda p: p.stem)
def test_stage_doc_follows_the_skeleton(doc) -> None:
    found = sections(doc.read_text(encoding="utf-8"))
    names = [next((s for s in SKELETON if h == s or h.startswith(s + " ")), h) for h, _ in found]
    assert names == list(SKELETON), (
        f"docs/{doc.name}: second-level sections {[h for h, _ in found]}; the skeleton is {list(SKELETON)} "
        "(a topic goes under one of them as a ### section)")
    empty = [h for h, body in found if not body]
    assert not empty, f"docs/{doc.name}: empty sections {empty}"


def test_a_doc_off_the_skeleton_is_caught() -> None:
    text = "# x\n\nlead\n\n" + "".join(f"## {s}\n\ntext\n\n" for s in SKELETON)
    assert [h for h, _ in sections(text)] == list(SKELETON)
    swapped = text.replace("## Guarantees", "## Tmp").replace("## Tests", "## Guarantees").replace("## Tmp", "## Tests")
    assert [h for h, _ in sections(swapped)] != list(SKELETON)
    fenced = text + "```\n## Not a heading\n```\n"
    assert [h for h, _ in sections(fenced)] == list(SKELETON)
