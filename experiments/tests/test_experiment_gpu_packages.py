"""The GPU study's carried wheels: what the arms lack is installed offline from the wheel
folder and put on their ``PYTHONPATH``; with nothing to install from, the run stops with
the command that prepares the folder."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from experiments.gpu import packages

MODULE = "odb_carried_probe"


def write_wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel of one module that knows its own name."""
    dist_info = f"{MODULE}-1.0.dist-info"
    wheel = folder / f"{MODULE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{MODULE}.py", "NAME = 'carried'\n")
        archive.writestr(
            f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {MODULE}\nVersion: 1.0\n"
        )
        archive.writestr(
            f"{dist_info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr(f"{dist_info}/RECORD", "")
    return wheel


def test_missing_packages_are_installed_offline_for_the_arms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    write_wheel(wheels)
    monkeypatch.setattr(packages, "CARRIED", {MODULE: MODULE, "hydra-core": "hydra"})
    assert packages.missing_distributions() == [MODULE]  # hydra is installed here
    env = packages.arm_environment(tmp_path / "site", wheels)
    assert env["PYTHONPATH"].split(":")[0] == str(tmp_path / "site")
    done = subprocess.run(
        [sys.executable, "-c", f"import {MODULE}; print({MODULE}.NAME, {MODULE}.__file__)"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    name, path = done.stdout.split()
    assert name == "carried" and Path(path).parent == tmp_path / "site"


def test_no_wheels_names_the_prepare_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packages, "CARRIED", {MODULE: MODULE})
    with pytest.raises(SystemExit, match="--prepare"):
        packages.arm_environment(tmp_path / "site", tmp_path / "no_wheels")
