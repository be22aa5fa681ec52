"""``odb-plan --source``: the names it lists, a user's jsonl through ``--path`` tokenized
exactly as training tokenizes it, and errors without a traceback."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from helpers.own_data import write_own_jsonl
from odb_lightning.app.plan import build_parser, main
from odb_lightning.app.plan_inputs import SOURCES
from odb_lightning.data import HFTokenizer, QwenTokenizer
from odb_lightning.data.sources.jsonl import jsonl_records
from odb_lightning.data.sources.table import SOURCES as TABLE
from odb_lightning.data.sources.table import SourceKind
from odb_lightning.data.template_choice import build_chat_template


def test_source_choices_are_the_source_tables_text_sources() -> None:
    text = [s.name for s in TABLE.values() if s.kind is not SourceKind.IMAGE_CHAT]
    assert list(SOURCES) == text == ["sharegpt", "chitchat", "ultrachat", "jsonl", "synthetic"]


def test_help_lists_sources_and_modes_and_speaks_of_samples() -> None:
    text = " ".join(build_parser().format_help().split())
    assert "one int per sample" in text and "per token" not in text
    assert "{sharegpt,chitchat,ultrachat,jsonl,synthetic}" in text
    assert "among standard,sorted,bucketed,oracle,odb,odb_packed" in text
    assert "token budget(s) per step" in text


def test_jsonl_path_plans_over_the_training_lengths(tmp_path: Path, capsys) -> None:
    data = tmp_path / "mine.jsonl"
    write_own_jsonl(data, num_short=30, num_long=2)
    cache = ["--record-cache-dir", str(tmp_path / "records")]
    # The broken line: refused without a traceback, naming the file and the line.
    assert main(["--source", "jsonl", "--path", str(data), *cache]) == 2
    assert f"--source jsonl: record {data}:3" in capsys.readouterr().err
    good = tmp_path / "good.jsonl"
    good.write_text("".join(line for line in data.open() if "broken" not in line))
    argv = ["--source", "jsonl", "--max-seq-len", "64", "--json", *cache]
    assert main([*argv, "--path", str(data), "--skip-bad-records"]) == 0
    skipped = json.loads(capsys.readouterr().out)["lengths"]
    assert skipped["origin"].endswith(", 1 bad records skipped")
    assert main([*argv, "--path", str(good)]) == 0
    described = json.loads(capsys.readouterr().out)["lengths"]
    assert {k: v for k, v in skipped.items() if k != "origin"} == {
        k: v for k, v in described.items() if k != "origin"
    }
    template = build_chat_template(QwenTokenizer())
    expected = [
        min(template.tokenize(r["messages"]).full_length, 64) for r in jsonl_records(good).records
    ]
    assert described["n"] == len(expected) == 32
    assert described["mean"] == pytest.approx(statistics.fmean(expected))
    assert described["max"] == max(expected) == 64
    # Read from record tables, one per file and reader arguments, as train.py does.
    assert len(list((tmp_path / "records").glob("jsonl-*/records.arrow"))) == 2


def test_source_that_needs_a_path_says_so(capsys) -> None:
    assert main(["--source", "jsonl"]) == 2
    assert "--source jsonl needs --path" in capsys.readouterr().err


def test_a_template_error_names_the_flag_not_the_training_key(tmp_path: Path, capsys) -> None:
    """A tokenizer whose layout no template recognizes: ``odb-plan`` says ``--template``
    (its own flag); train.py's wording (``data.source.template``) stays in the data layer."""
    from helpers.chat_tokenizers import write_deepseek_tokenizer

    tokenizer = write_deepseek_tokenizer(tmp_path / "tok", chat_template=None)
    data = tmp_path / "mine.jsonl"
    write_own_jsonl(data, num_short=3, num_long=0)
    argv = [
        "--source",
        "jsonl",
        "--path",
        str(data),
        "--tokenizer",
        str(tokenizer),
        "--skip-bad-records",
    ]
    assert main([*argv, "--record-cache-dir", str(tmp_path / "records")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--template auto: tokenizer" in err and "has no chat template" in err
    assert "set --template to one of chatml," in err and "data.source.template" not in err
    with pytest.raises(ValueError, match="set data.source.template to one of chatml,"):
        build_chat_template(HFTokenizer(str(tokenizer)))


def test_a_mixture_plans_over_the_records_training_mixes(tmp_path: Path, capsys) -> None:
    from odb_lightning.core.config import BatchingConfig
    from odb_lightning.lit.data.datamodule import ODBDataModule

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_own_jsonl(a, num_short=30, num_long=4)
    write_own_jsonl(b, num_short=20, num_long=0)
    for path in (a, b):  # without the broken line
        path.write_text("".join(line for line in path.open() if "broken" not in line))
    cache = str(tmp_path / "records")
    argv = ["--mixture", f"{a}:3", str(b), "--record-cache-dir", cache, "--json"]
    assert main([*argv, "--template", "chatml"]) == 0
    planned = json.loads(capsys.readouterr().out)["lengths"]
    data = ODBDataModule.of(
        QwenTokenizer(), BatchingConfig.of(num_workers=0), template="chatml", record_dir=cache,
        mixture=[{"path": str(a), "weight": 3}, {"path": str(b)}], val_samples=0,
    )  # fmt: skip
    data.setup("fit")
    trained = [len(data.dataset[i]["input_ids"]) for i in range(len(data.dataset))]
    assert planned["n"] == len(trained) == 34 + 11  # 3:1 as far as the 34 records of a allow
    assert planned["mean"] == pytest.approx(statistics.fmean(trained))
    assert planned["max"] == max(trained)
    assert "mixture (" in planned["origin"]
    assert main(["--mixture", f"{a}:0"]) == 2
    assert "the weight after ':' must be a number > 0" in capsys.readouterr().err
