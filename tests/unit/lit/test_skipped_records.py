"""Records read but not trained on are named, not only counted: ``skipped_records.jsonl``
in the run directory holds every skipped source line (file:line and reason) and every
training record without an assistant turn (its id); a file read only up to
``data.sizes.max_samples`` (``debug=smoke``) says so."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from helpers.configs import ComposeConfig
from odb_lightning.app.components import build_data
from odb_lightning.app.validation import validate_config
from odb_lightning.core.config import BatchingConfig
from odb_lightning.data import QwenTokenizer
from odb_lightning.lit.data.datamodule import ODBDataModule
from odb_lightning.lit.data.skipped_records import NO_ASSISTANT_TURN, SKIPPED_RECORDS_FILE
from odb_lightning.lit.run_context import RunContext


def chat(record_id: object, *, answer: bool = True) -> dict:
    messages = [{"role": "user", "content": f"question {record_id}"}]
    if answer:
        messages.append({"role": "assistant", "content": f"answer {record_id}"})
    return {"id": record_id, "messages": messages}


def write_lines(path: Path, lines: list[dict | bytes]) -> Path:
    raw = [line if isinstance(line, bytes) else json.dumps(line).encode() for line in lines]
    path.write_bytes(b"\n".join(raw) + b"\n")
    return path


def test_skipped_lines_and_unsupervised_records_are_named_in_the_run_dir(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines: list[dict | bytes] = [chat(f"g{k}") for k in range(8)]
    lines[2] = b'{"id": "broken", "messages": ['  # line 3: not JSON
    lines[5] = {"id": "m"}  # no messages (line 7 once q1 is in)
    lines.insert(4, chat("q1", answer=False))  # line 5: no assistant turn
    lines.append(chat("q2", answer=False))  # line 10
    path = write_lines(tmp_path / "chats.jsonl", lines)
    run_dir = tmp_path / "run"
    data = ODBDataModule.of(
        QwenTokenizer(), BatchingConfig.of(on_bad_sample="skip"), name="jsonl", path=str(path),
        val_samples=0, record_dir=str(tmp_path / "records"),
        run=RunContext(output_dir=str(run_dir)),
    )  # fmt: skip
    with caplog.at_level(logging.WARNING):
        data.setup("fit")
    entries = [json.loads(line) for line in (run_dir / SKIPPED_RECORDS_FILE).open()]
    assert [e["record"] for e in entries] == [f"{path}:3", f"{path}:7", "q1", "q2"]
    assert {e["source"] for e in entries} == {"jsonl"}
    assert entries[0]["reason"].startswith("field '<line>': invalid JSON")
    assert entries[1]["reason"] == "field 'messages': missing"
    assert [e["reason"] for e in entries[2:]] == [NO_ASSISTANT_TURN] * 2
    # The same records the summary counts.
    report = data.run_report().summary_facts()
    assert report["skipped_bad_records"] == 2 and report["unsupervised_samples"] == 2
    logged = [r.getMessage() for r in caplog.records if SKIPPED_RECORDS_FILE in r.getMessage()]
    assert logged == [
        "source lines skipped as bad records: 2, training records without a supervised "
        f"token: 2; each one named in {run_dir / SKIPPED_RECORDS_FILE}"
    ]


def test_a_clean_file_writes_no_list(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "chats.jsonl", [chat(k) for k in range(5)])
    data = ODBDataModule.of(
        QwenTokenizer(), BatchingConfig.of(), name="jsonl", path=str(path), val_samples=0,
        record_dir=str(tmp_path / "records"),
        run=RunContext(output_dir=str(tmp_path / "run")),
    )  # fmt: skip
    data.setup("fit")
    assert not (tmp_path / "run" / SKIPPED_RECORDS_FILE).exists()


def partial_read_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "the rest is not checked" in r.getMessage()]


def test_debug_smoke_says_it_read_only_the_first_records(
    tmp_path: Path, compose_cfg: ComposeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_lines(tmp_path / "mine.jsonl", [chat(k) for k in range(100)])
    cfg = compose_cfg(["debug=smoke", "data=jsonl", f"data.source.path={path}"])
    validate_config(cfg)
    with caplog.at_level(logging.WARNING):
        data = build_data(cfg, world_size=1, device="cpu").datamodule
        data.setup("fit")
    assert len(data.dataset) == 80
    assert partial_read_warnings(caplog) == [
        f"debug=smoke: read the first 80 records of {path}; the rest is not checked "
        "(drop debug=smoke to read every record)"
    ]
    # Set on the command line, the key is named instead of the preset.
    caplog.clear()
    cfg = compose_cfg(
        ["debug=smoke", "data=jsonl", f"data.source.path={path}", "data.sizes.max_samples=90"]
    )
    with caplog.at_level(logging.WARNING):
        build_data(cfg, world_size=1, device="cpu").datamodule.setup("fit")
    assert partial_read_warnings(caplog) == [
        f"data.sizes.max_samples=90: read the first 90 records of {path}; the rest is not checked "
        "(data.sizes.max_samples=null reads every record)"
    ]


def test_a_file_read_whole_under_debug_smoke_says_nothing(
    tmp_path: Path, compose_cfg: ComposeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_lines(tmp_path / "mine.jsonl", [chat(k) for k in range(30)])
    cfg = compose_cfg(["debug=smoke", "data=jsonl", f"data.source.path={path}"])
    with caplog.at_level(logging.WARNING):
        data = build_data(cfg, world_size=1, device="cpu").datamodule
        data.setup("fit")
    assert len(data.dataset) == 30 and partial_read_warnings(caplog) == []


def test_without_a_run_directory_the_first_records_are_named_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = [chat("a"), *(chat(f"q{k}", answer=False) for k in range(7))]
    path = write_lines(tmp_path / "chats.jsonl", lines)
    data = ODBDataModule.of(
        QwenTokenizer(), BatchingConfig.of(), name="jsonl", path=str(path), val_samples=0,
        record_dir=str(tmp_path / "records"),
    )  # fmt: skip
    with caplog.at_level(logging.WARNING):
        data.setup("fit")
    (logged,) = [r.getMessage() for r in caplog.records if "without a supervised" in r.getMessage()]
    named = "; ".join(f"q{k}: {NO_ASSISTANT_TURN}" for k in range(5))
    assert logged == f"training records without a supervised token: 7: {named} (and 2 more)"
    assert list(tmp_path.rglob(SKIPPED_RECORDS_FILE)) == []


def test_the_whole_files_count_is_given_where_a_run_read_it_before(
    tmp_path: Path, compose_cfg: ComposeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """A run that read every record left the file's table: debug=smoke then says of how
    many records it read 80, without reading the rest."""
    path = write_lines(tmp_path / "mine.jsonl", [chat(k) for k in range(120)])
    build_data(compose_cfg(["data=jsonl", f"data.source.path={path}"]), 1, "cpu").datamodule.setup(
        "fit"
    )
    cfg = compose_cfg(["debug=smoke", "data=jsonl", f"data.source.path={path}"])
    with caplog.at_level(logging.WARNING):
        build_data(cfg, world_size=1, device="cpu").datamodule.setup("fit")
    assert partial_read_warnings(caplog) == [
        f"debug=smoke: read the first 80 of 120 records of {path}; the rest is not checked "
        "(drop debug=smoke to read every record)"
    ]
