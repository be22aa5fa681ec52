"""The run's own files are never written through a symbolic link (lit/run_files.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from odb_lightning.lit.run_files import RunFileLinkError, open_run_file, write_run_file


def test_a_run_file_is_written_and_appended(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    write_run_file(path, "one\n")
    with open_run_file(path, "a") as file:
        file.write("two\n")
    assert path.read_text() == "one\ntwo\n"
    write_run_file(path, "three\n")
    assert path.read_text() == "three\n"


@pytest.mark.parametrize("mode", ["w", "a"])
def test_a_link_in_place_of_a_run_file_is_refused_naming_it(tmp_path: Path, mode: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    link = tmp_path / "emitted_ids_rank0.jsonl"
    link.symlink_to(victim)
    with pytest.raises(RunFileLinkError) as refused:
        open_run_file(link, mode)
    assert str(refused.value) == (
        f"{link} is a symbolic link (to {victim}); a run writes only into its own directory: "
        "remove the link"
    )
    assert victim.read_text() == "keep me\n"
