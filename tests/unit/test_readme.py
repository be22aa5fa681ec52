"""The README's commands: each one parses, each ``train.py`` and ``eval.py`` command line
composes and passes the config checks, the ``odb-check`` ones run and print what the
README says they print; the README's links lead to pages that exist."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

from odb_lightning.app import chat, check, export, plan, preview
from odb_lightning.app.config_store import prepare_composition

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def readme_commands() -> list[list[str]]:
    """Every command of the README's ``bash`` blocks, as words (continuation lines joined,
    comments dropped)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


COMMANDS = readme_commands()


def by_program(*programs: str) -> list[list[str]]:
    """The commands that run one of ``programs`` (``train.py``, ``odb-check``, ``make``)."""
    return [words for words in COMMANDS if any(Path(w).name in programs for w in words[:2])]


def sweep_points(overrides: list[str]) -> list[list[str]]:
    """A multirun's overrides as its points (``batching=odb,standard``: two)."""
    points: list[list[str]] = [[]]
    for override in overrides:
        key, _, values = override.partition("=")
        options = values.split(",") if "," in values and "[" not in values else [values]
        points = [[*p, f"{key}={v}"] for p in points for v in options]
    return points


def composed(config_name: str, overrides: list[str]):
    prepare_composition()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def test_the_readme_has_the_two_commands_on_its_first_screen() -> None:
    first_screen = README.read_text(encoding="utf-8").splitlines()[:24]
    assert any(line.startswith("make train ") for line in first_screen)
    assert any(re.match(r"make test .*\([\d,]+ tests", line) for line in first_screen)
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
    assert {w[1] for w in by_program("make")} <= set(targets)


@pytest.mark.parametrize("words", by_program("train.py", "eval.py"), ids=lambda w: " ".join(w[1:]))
def test_each_train_and_eval_command_composes_and_passes_the_checks(words: list[str]) -> None:
    script = next(w for w in words if w.endswith(".py"))
    overrides = [w for w in words[words.index(script) + 1 :] if w != "-m"]
    for point in sweep_points(overrides):
        cfg = composed(Path(script).stem, point)
        check.check_config(cfg)


def test_each_tool_command_parses() -> None:
    parsers = {
        "odb-plan": plan.build_parser(),
        "odb-preview": preview.build_parser(),
        "odb-export": export.build_parser(),
        "odb-check": check.build_parser(),
        "odb-chat": chat.build_parser(),
    }
    seen = set()
    for words in COMMANDS:
        name = Path(words[0]).name
        if name in parsers:
            parsers[name].parse_args(words[1:])
            seen.add(name)
            if name in ("odb-preview", "odb-check"):
                composed("train", parsers[name].parse_args(words[1:]).overrides)
    assert seen == set(parsers)


def write_sharegpt(path: Path, records: int) -> None:
    turns = [{"from": "human", "value": "How are you?"}, {"from": "gpt", "value": "Fine."}]
    path.write_text("".join(json.dumps({"conversations": turns}) + "\n" for _ in range(records)))


def test_the_odb_check_commands_run_and_print_what_the_readme_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    write_sharegpt(tmp_path / "my_chats.jsonl", records=20)
    runs = by_program("odb-check")
    assert runs
    for words in runs:
        assert check.main(words[1:]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "config: ok (batching=odb, token_budget=4096, " in out
    line = "data.source jsonl (my_chats.jsonl): the first 8 records read and valid, layout sharegpt"
    assert line in out
    assert "model: ok" in out
    readme = " ".join(README.read_text(encoding="utf-8").split())
    assert (
        " ".join(line.split()) in readme and "config: ok (batching=odb, token_budget=4096" in readme
    )


def test_the_readmes_links_lead_to_pages() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    assert links
    assert not [link for link in links if not (ROOT / link).exists()]
    docs = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert docs <= {Path(link).name for link in links}, "a docs page the README does not name"
