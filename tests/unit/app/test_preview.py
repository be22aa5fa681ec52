"""``odb-preview``: the samples training gets, their supervised tokens marked. The marked
spans are exactly the assistant turns (each with its ``<|im_end|>``), the lengths and
supervised counts are the data module's samples', on the embedded default data and on a
user's JSON Lines file, with ``train.py``'s overrides."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from helpers.configs import ComposeConfig
from odb_lightning.app.components import build_data
from odb_lightning.app.preview import (
    SUPERVISED_STYLE,
    main,
    plain_text,
    preview,
    rich_text,
)
from odb_lightning.sample import count_loss_tokens

ROOT = Path(__file__).resolve().parents[3]
HEADER = re.compile(
    r"^--- sample (\d+)/(\d+): id '(.*)', index (\d+)(.*): "
    r"([\d,]+) tokens(.*), ([\d,]+) supervised$"
)


def shown(output: str) -> list[dict]:
    """The samples of plain output: header fields and the supervised spans of the text."""
    samples: list[dict] = []
    for line in output.splitlines(keepends=True):
        match = HEADER.match(line.rstrip("\n"))
        if match:
            samples.append({
                "id": match[3], "index": int(match[4]), "held": match[5],
                "length": int(match[6].replace(",", "")), "cut": match[7],
                "supervised": int(match[8].replace(",", "")), "text": "",
            })  # fmt: skip
        elif samples and not line.startswith("supervised tokens (those with a label)"):
            samples[-1]["text"] += line
    for sample in samples:
        sample["spans"] = re.findall(r"\[\[(.*?)\]\]", sample["text"], flags=re.DOTALL)
    return samples


def assistant_spans(messages: list[dict]) -> list[str]:
    return [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]


def check_against_the_data_module(samples: list[dict], datamodule) -> None:
    for sample in samples:
        item = datamodule.dataset[sample["index"]]
        assert sample["length"] == len(item["input_ids"])
        assert sample["supervised"] == count_loss_tokens(item["labels"])
        assert sample["id"] == str(datamodule.record_ids([sample["index"]])[0])


@pytest.mark.slow
def test_the_default_data_as_python_m(tmp_path: Path, compose_cfg: ComposeConfig) -> None:
    """``python -m odb_lightning.app.preview`` with no overrides: train.py's default data
    (ShareGPT, whole conversations), three samples, plain off a terminal."""
    result = subprocess.run(
        [sys.executable, "-m", "odb_lightning.app.preview"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    samples = shown(result.stdout)
    assert [s["index"] for s in samples] == [0, 1, 2]
    cfg = compose_cfg([])  # its record table is the one the command wrote under tmp_path
    datamodule = build_data(cfg, world_size=1, device="cpu").datamodule
    datamodule.setup("fit")
    assert [s["index"] for s in samples] == list(datamodule.train_indices)[:3]
    check_against_the_data_module(samples, datamodule)
    for sample in samples:
        assert sample["cut"] == ""  # none is longer than max_seq_len=4096
        messages = datamodule.dataset.records[sample["index"]]["messages"]
        assert sample["spans"] == assistant_spans(messages)


def write_chats(path: Path) -> list[dict]:
    records = [
        {"id": "a", "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And 3+3?"},
            {"role": "assistant", "content": "6, of course."},
        ]},
        {"id": "b", "messages": [{"role": "user", "content": "Hello there"}]},
        {"id": "c", "messages": [
            {"role": "human", "content": "Name three colours."},
            {"role": "gpt", "content": "Red, green\nand blue."},
        ]},
        *({"id": f"x{k}", "messages": [
            {"role": "user", "content": f"question {k}"},
            {"role": "assistant", "content": f"answer {k}"},
        ]} for k in range(5)),
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return records


def test_a_jsonl_file_with_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compose_cfg: ComposeConfig
) -> None:
    path = tmp_path / "mine.jsonl"
    records = write_chats(path)
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    overrides = ["data=jsonl", f"data.source.path={path}", "data.sizes.val_samples=0"]
    assert main(["--num", "3", *overrides], console=Console(file=out)) == 0
    samples = shown(out.getvalue())
    assert [s["id"] for s in samples] == ["a", "b", "c"]
    datamodule = build_data(compose_cfg(overrides), world_size=1, device="cpu").datamodule
    datamodule.setup("fit")
    check_against_the_data_module(samples, datamodule)
    roles = {"human": "user", "gpt": "assistant"}
    for sample, record in zip(samples, records, strict=False):
        messages = [{**m, "role": roles.get(m["role"], m["role"])} for m in record["messages"]]
        assert sample["spans"] == assistant_spans(messages)
    assert samples[1]["supervised"] == 0 and samples[1]["spans"] == []
    assert "<|im_start|>system\nAnswer briefly.<|im_end|>" in samples[0]["text"]

    # --ids, a held-out record among them, and truncation to data.sizes.max_seq_len.
    out = io.StringIO()
    cut = [*overrides[:2], "data.sizes.val_samples=1", "data.sizes.max_seq_len=14"]
    cut.append("data.sizes.truncation=tail")  # the first 14 tokens: two of the answer
    datamodule = build_data(compose_cfg(cut), world_size=1, device="cpu").datamodule
    datamodule.setup("fit")
    held = str(datamodule.record_ids(list(datamodule.val_set.indices))[0])
    assert main(["--ids", f"c,{held}", *cut], console=Console(file=out)) == 0
    samples = shown(out.getvalue())
    assert [s["id"] for s in samples] == ["c", held]
    assert samples[1]["held"] == " (held out for validation)"
    assert samples[0]["length"] == 14 and samples[0]["cut"].startswith(", cut from ")
    check_against_the_data_module(samples, datamodule)


def test_colour_marks_the_same_tokens_and_plain_is_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mine.jsonl"
    write_chats(path)
    monkeypatch.chdir(tmp_path)
    (sample,) = preview(
        ["data=jsonl", f"data.source.path={path}", "data.sizes.val_samples=0"], num=1
    )
    text = rich_text(sample)
    styled = [text.plain[s.start : s.end] for s in text.spans if s.style == SUPERVISED_STYLE]
    assert styled == ["4.<|im_end|>", "6, of course.<|im_end|>"]
    assert plain_text(sample) == text.plain.replace("4.<|im_end|>", "[[4.<|im_end|>]]").replace(
        "6, of course.<|im_end|>", "[[6, of course.<|im_end|>]]"
    )
    terminal = io.StringIO()
    console = Console(file=terminal, force_terminal=True)
    args = ["--num", "1", "data=jsonl", f"data.source.path={path}", "data.sizes.val_samples=0"]
    assert main(args, console=console) == 0 and "[[" not in terminal.getvalue()
    assert "\x1b[" in terminal.getvalue()  # coloured
    forced = io.StringIO()
    console = Console(file=forced, force_terminal=True)
    assert main(["--plain", *args], console=console) == 0
    assert "[[4.<|im_end|>]]" in forced.getvalue()


def test_bad_input_is_named_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "mine.jsonl"
    write_chats(path)
    monkeypatch.chdir(tmp_path)
    assert main(["--ids", "nope", "data=jsonl", f"data.source.path={path}"]) == 2
    assert "--ids: no record with id 'nope' among the 8 records read" in capsys.readouterr().err
    assert main(["data=jsonl", f"data.source.path={tmp_path / 'missing.jsonl'}"]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert main(["data=nosuchgroup"]) == 2
    assert "nosuchgroup" in capsys.readouterr().err


def test_the_console_script_is_declared() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'odb-preview = "odb_lightning.app.preview:main"' in text


def test_image_chats_show_their_image_tokens_as_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compose_cfg: ComposeConfig
) -> None:
    """A vision-language set: the tokenizer decodes no image placeholder, so each image
    is named with its token count; the supervised spans are still the assistant turns."""
    monkeypatch.chdir(tmp_path)
    overrides = ["experiment=llava_odb", "debug=smoke"]
    samples = preview(overrides, num=2)
    datamodule = build_data(compose_cfg(overrides), world_size=1, device="cpu").datamodule
    datamodule.setup("fit")
    for sample in samples:
        item = datamodule.dataset[sample.index]
        text = plain_text(sample)
        runs = [int(n) for n in re.findall(r"<\|vision_start\|><\|image_pad\|>×(\d+)", text)]
        image_tokens = int((item["input_ids"] == datamodule.family.tokens.image_pad_id).sum())
        assert runs and sum(runs) == image_tokens
        assert sample.length == len(item["input_ids"])
        messages = datamodule.dataset.records[sample.index]["messages"]
        assert re.findall(r"\[\[(.*?)\]\]", text, flags=re.DOTALL) == assistant_spans(messages)
