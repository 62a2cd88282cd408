"""The layout the pipeline's correctness rests on, checked from the code itself:

- every path is written once, in dvc.yaml: no module under ``src/`` holds a pipeline path literal (``data/...``,
  ``metrics/...``, ``plots/...``, ``reports/...``; docstrings may name them);
- a stage's package imports only what its dvc.yaml code deps cover (``core``, its own package, a shared package its
  stage lists, such as ``drafter`` for train and evaluate), so a change DVC cannot see never changes a stage;
- no draftline module imports itself back through others (a lazy or ``TYPE_CHECKING`` import counts: a reader and a
  type checker follow it all the same), so every module can be read after the ones it imports;
- every stage command passes exactly the data paths its stage declares (each argument is a dep or an output, or
  inside one, and each data dep or output is passed), and every stage script has the one shape of
  :func:`draftline.core.runner.main`.

The checkers are functions of a source tree, and each is shown to fail on a planted violation.
"""

from __future__ import annotations

import ast
import graphlib
import re
import shlex
from pathlib import Path

from dvc.repo import Repo

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "draftline"
PIPELINE_PATH = re.compile(r"^(\./)?(data|metrics|plots|reports)/")
# Packages every stage may import: what dvc.yaml lists for all of them.
SHARED = {"core"}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def path_literals(src: Path) -> list[str]:
    """``file:line: literal`` for every pipeline path written in code under ``src``."""
    found = []
    for file in sorted(src.rglob("*.py")):
        tree = ast.parse(file.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                    and PIPELINE_PATH.match(node.value)):
                found.append(f"{file.relative_to(src)}:{node.lineno}: {node.value!r}")
    return found


def imported_packages(file: Path) -> set[str]:
    """The ``draftline.<package>`` names a module imports (absolute imports; draftline uses no relative ones)."""
    out = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
        out |= {n.split(".")[1] for n in names if n.startswith("draftline.") and n.count(".") >= 1}
    return out


def stage_code_deps() -> dict[str, set[str]]:
    """Per stage package, the ``src/draftline/<package>`` folders its dvc.yaml stage lists as deps."""
    allowed: dict[str, set[str]] = {}
    for stage in Repo(str(REPO)).index.stages:
        folders = {d.def_path.removeprefix("src/draftline/") for d in stage.deps
                   if d.def_path.startswith("src/draftline/")}
        package = stage.addressing.split("@")[0]
        allowed.setdefault(package, set()).update(folders)
    return allowed


def import_violations(src: Path, allowed: dict[str, set[str]]) -> list[str]:
    """``module imports draftline.<package>`` wherever a package imports one its stage does not depend on."""
    found = []
    for file in sorted(src.rglob("*.py")):
        package = file.relative_to(src).parts[0]
        if package not in allowed and package not in SHARED:
            continue  # a shared package (drafter): its importers' deps decide
        may = SHARED | allowed.get(package, {package})
        for imported in sorted(imported_packages(file) - may):
            found.append(f"{file.relative_to(src)} imports draftline.{imported}")
    return found


def _module_name(src: Path, file: Path) -> str:
    parts = file.relative_to(src).with_suffix("").parts
    return ".".join((src.name, *(parts[:-1] if parts[-1] == "__init__" else parts)))


def module_imports(src: Path) -> dict[str, set[str]]:
    """Per module under ``src``, the modules under ``src`` it imports anywhere in its body (``from package import
    module`` names the module; ``from module import name`` the module)."""
    files = {_module_name(src, f): f for f in sorted(src.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, file in files.items():
        names = set()
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                          for a in node.names}
        graph[module] = (names & files.keys()) - {module}
    return graph


def import_cycle(src: Path) -> list[str]:
    """One cycle of imports among the modules under ``src`` (its first module again at its end), or [] if none."""
    try:
        graphlib.TopologicalSorter(module_imports(src)).prepare()
    except graphlib.CycleError as cycle:
        return cycle.args[1]
    return []


def test_no_pipeline_path_is_written_in_src() -> None:
    assert path_literals(SRC) == []


def test_no_stage_imports_what_its_deps_do_not_cover() -> None:
    allowed = stage_code_deps()
    assert set(allowed) >= {"sources", "conversations", "target", "prompts", "generate", "tokenize", "merge",
                            "export", "train", "evaluate"}
    assert import_violations(SRC, allowed) == []
    # core depends on nothing else of draftline.
    assert all(imported_packages(f) <= {"core"} for f in (SRC / "core").rglob("*.py"))


def test_no_module_imports_itself_back() -> None:
    assert import_cycle(SRC) == []


def test_the_checkers_fail_on_planted_violations(tmp_path: Path) -> None:
    src = tmp_path / "draftline"
    (src / "prompts").mkdir(parents=True)
    (src / "prompts" / "stage.py").write_text(
        '"""Writes data/prompts (a docstring may say so)."""\n'
        "from draftline.core.files import write_json\n"
        "from draftline.generate.journal import Journal\n"
        "OUT = 'data/prompts/train.jsonl'\n"
        "def f(x=\"metrics/prompts.json\"):\n    return x\n")
    allowed = {"prompts": {"core", "prompts"}, "generate": {"core", "generate"}}
    assert path_literals(src) == ["prompts/stage.py:4: 'data/prompts/train.jsonl'",
                                  "prompts/stage.py:5: 'metrics/prompts.json'"]
    assert import_violations(src, allowed) == ["prompts/stage.py imports draftline.generate"]
    assert import_cycle(src) == []
    (src / "prompts" / "text.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from draftline.prompts import stage\n")
    (src / "prompts" / "stage.py").write_text("from draftline.prompts.text import clean\n")
    assert sorted(import_cycle(src)[:-1]) == ["draftline.prompts.stage", "draftline.prompts.text"]


# ------------------------------------------------------------------------------- dvc.yaml and the stage scripts


def _argument_paths(cmd: str) -> list[str]:
    """The values of a stage command's ``--flag value`` pairs that are paths (the ones under the repository)."""
    words = shlex.split(cmd)
    values = [words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")]
    return [v for v in values if "/" in v]


def _covers(declared: str, path: str) -> bool:
    return path == declared or path.startswith(declared.rstrip("/") + "/")


def command_mismatches(stages) -> list[str]:
    """Arguments no dep or output covers, and data deps or outputs no argument lies in."""
    found = []
    for stage in stages:
        args = _argument_paths(stage.cmd)
        declared = [d.def_path for d in stage.deps if not d.def_path.startswith(("src/", "stages/"))
                    and d.def_path != "params.yaml"] + [o.def_path for o in stage.outs]
        found += [f"{stage.addressing}: --{a} is not a declared dep or output" for a in args
                  if not any(_covers(d, a) for d in declared)]
        # A folder only some of whose files are read (data/target for target.json) counts as passed.
        found += [f"{stage.addressing}: {d} is declared but not passed" for d in declared
                  if not any(_covers(d, a) or _covers(a, d) for a in args) and d not in OPTIONAL_DEPS]
    return found


# Declared deps that no argument names, on purpose: where the embedded default's sources live (a param, per source,
# names the file). data/drafters (--drafters) and data/bases (--bases) are passed wherever they are declared: the
# params that name files there are refused outside them (core/tracked.py).
OPTIONAL_DEPS = {"data/samples"}


def test_every_command_passes_exactly_its_declared_paths() -> None:
    stages = list(Repo(str(REPO)).index.stages)
    assert command_mismatches(stages) == []
    for stage in stages:
        script = REPO / shlex.split(stage.cmd)[1]
        tree = ast.parse(script.read_text(encoding="utf-8"))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "main"]
        assert len(calls) == 1 and len(calls[0].args) == 4, f"{script.name} is not main(name, Args, load, run)"


def test_the_command_check_fails_on_a_planted_mismatch() -> None:
    class Path_:  # a dep or output as DVC's index gives it
        def __init__(self, p):
            self.def_path = p

    class Stage:
        addressing = "prompts"
        cmd = "python stages/prompts.py --conversations data/conversation --out data/prompts --report reports/p.json"
        deps = [Path_("stages/prompts.py"), Path_("data/conversations"), Path_("data/target/target.json")]
        outs = [Path_("data/prompts"), Path_("reports/p.json")]

    assert command_mismatches([Stage()]) == [
        "prompts: --data/conversation is not a declared dep or output",
        "prompts: data/conversations is declared but not passed",
        "prompts: data/target/target.json is declared but not passed",
    ]


