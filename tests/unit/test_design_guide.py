"""``docs/design.md`` against the code: the "Where each variant lives" table and the file
counts of the guides for adding a text source, an image-text family, a batching mode and
a strategy."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest
import yaml

from odb_lightning.core.modes import MODES
from odb_lightning.data.sources.table import SOURCES, SourceKind
from odb_lightning.data.vision_family import VISION_FAMILIES
from odb_lightning.lit.model.loss import GRADIENTS_ON_EVERY_RANK

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "odb_lightning"
DESIGN = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
PACKAGE_DIRS = ("core/", "runtime/", "data/", "lit/", "app/")


def section(title: str) -> str:
    """The text of the section ``## <title>`` (up to the next ``## ``)."""
    start = DESIGN.index(f"## {title}")
    end = DESIGN.find("\n## ", start + 1)
    return DESIGN[start : end if end != -1 else None]


def variant_rows() -> dict[str, list[str]]:
    """Each row of the "Where each variant lives" table: its variant and the backticked
    names in its files cell."""
    rows = {}
    for line in section("Where each variant lives").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("variant", "---"):
            rows[cells[0]] = re.findall(r"`([^`]+)`", cells[1])
    return rows


def as_path(name: str) -> Path | None:
    """The file or folder a backticked name means (``None``: not a path, or a pattern)."""
    if "<" in name or " " in name:
        return None
    if name.startswith(PACKAGE_DIRS):
        return SRC / name
    if name.startswith("conf/"):
        return ROOT / name
    if name.endswith((".py", ".yaml")):
        return None  # a bare file name: resolved against the row's folders below
    return None


def row_files(names: list[str]) -> list[Path]:
    """Every source or config file a row names (folders expanded)."""
    files = []
    for name in names:
        path = as_path(name)
        if path is None:
            continue
        files += (
            sorted(path.rglob("*.py")) + sorted(path.rglob("*.yaml")) if path.is_dir() else [path]
        )
    return files


def names_files(pattern: str) -> set[str]:
    """The package's modules (relative to it) whose text matches ``pattern`` as a word."""
    regex = re.compile(rf"\b({pattern})\b")
    return {
        p.relative_to(SRC).as_posix()
        for p in SRC.rglob("*.py")
        if regex.search(p.read_text(encoding="utf-8"))
    }


def test_the_table_has_its_rows() -> None:
    assert {"each batching mode", "the packed row layout", "each data source"} <= set(
        variant_rows()
    )
    assert {"each image-text family", "each strategy", "each data concern"} <= set(variant_rows())


@pytest.mark.parametrize("variant", sorted(variant_rows()))
def test_every_path_of_a_row_exists_and_every_name_is_in_its_files(variant: str) -> None:
    names = variant_rows()[variant]
    paths = [as_path(n) for n in names]
    missing = [n for n, p in zip(names, paths, strict=True) if p is not None and not p.exists()]
    assert missing == [], f"{variant}: no such file {missing}"
    files = row_files(names)
    text = "\n".join(f.read_text(encoding="utf-8") for f in files)
    bare = [
        n for n in names if n.endswith((".py", ".yaml")) and as_path(n) is None and "<" not in n
    ]
    assert all(any(f.name == n for f in files) for n in bare), f"{variant}: {bare}"
    identifiers = [n for n in names if re.fullmatch(r"[A-Za-z_]\w*", n)]
    absent = [n for n in identifiers if not re.search(rf"\b{n}\b", text)]
    assert absent == [], f"{variant}: {absent} not in {[f.name for f in files]}"


def test_the_packed_rows_row_lists_exactly_the_files_that_name_the_layout() -> None:
    listed = {n for n in variant_rows()["the packed row layout"] if n.endswith(".py")}
    assert names_files("PackedRows|packed_attention|pack_collate") == listed


def test_a_text_source_is_three_files() -> None:
    """Its reader module, its ``SOURCES`` line, its preset; nothing outside
    ``data/sources/`` imports a reader module but the stream converter, which reads the
    user's files as the ``jsonl`` reader does."""
    assert "touches **3 files**" in section("Adding a data source")
    readers = set()
    for source in SOURCES.values():
        if source.kind is not SourceKind.CHAT:
            continue
        module, _, function = (source.reader or source.table).partition(":")
        assert callable(getattr(importlib.import_module(module), function))
        reader_file = SRC / "data" / "sources" / f"{module.rsplit('.', 1)[1]}.py"
        preset = ROOT / "conf" / "data" / f"{source.name}.yaml"
        files = {reader_file, SRC / "data" / "sources" / "table.py", preset}
        assert all(f.is_file() for f in files) and len(files) == 3, source.name
        readers.add(module)
    importers = {
        p.relative_to(SRC).as_posix()
        for p in SRC.rglob("*.py")
        if not p.is_relative_to(SRC / "data" / "sources")
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.module in readers
    }
    assert importers <= {"data/stream_convert.py"}


def test_an_image_text_family_is_three_files() -> None:
    """Its module under ``data/vision_family/``, its ``VISION_FAMILIES`` line, a model
    preset of the image-text module."""
    assert "touches\n**3 files**" in section("Adding an image-text family")
    registry = (SRC / "data" / "vision_family" / "__init__.py").read_text(encoding="utf-8")
    presets = [
        p
        for p in (ROOT / "conf" / "model").glob("*.yaml")
        if "vision_language" in (yaml.safe_load(p.read_text()) or {}).get("defaults", [])
    ]
    assert presets
    for family in VISION_FAMILIES.values():
        module = Path(inspect.getfile(family))
        assert module.parent == SRC / "data" / "vision_family" and module.name != "__init__.py"
        assert re.search(rf"^\s+{family.__name__},$", registry, re.MULTILINE)


def test_a_batching_mode_is_two_files() -> None:
    """Its policy's module and its ``MODES`` line: a planned policy is named nowhere else
    (``app/plan_args.py`` only for an ``odb-plan`` knob; ``app/plan.py`` names the
    bucketed policy for its bucket table)."""
    assert "new mode touches **2 files**" in section("Adding a batching mode")
    for mode in MODES.values():
        module = inspect.getfile(mode.policy)
        assert Path(module).parent == SRC / "core"
        if not mode.policy().online:  # the online policy drives the runtime
            own = {Path(module).relative_to(SRC).as_posix(), "core/modes.py"}
            own |= {"app/plan_args.py", "app/plan.py"}
            assert names_files(mode.policy.__name__) <= own, mode.name


def test_a_strategy_is_its_preset_and_the_loss_scale() -> None:
    """Every shipped trainer preset's strategy is one the loss mixin accepts."""
    assert "touches **2 files** and a test" in section("Adding a strategy")
    for preset in sorted((ROOT / "conf" / "trainer").glob("*.yaml")):
        strategy = (yaml.safe_load(preset.read_text()) or {}).get("strategy")
        if not isinstance(strategy, dict):
            continue  # Lightning's own default or a registry name
        module, _, name = strategy["_target_"].rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, GRADIENTS_ON_EVERY_RANK), preset.name
