"""The case-study generator writes chat JSON Lines whose token lengths are the profile's.

Read back the way ``data=jsonl`` reads it (the jsonl source, the default template and
tokenizer), every record is exactly its drawn length, so the file follows the case study's
length profile at any ``--length-scale``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.scale_data.generate import main, records, write_jsonl
from odb_lightning.core.profiles import CASE_STUDY_LENGTHS
from odb_lightning.data import ChatDataset, QwenTokenizer, load_source


def token_lengths(path: Path, tokenizer: QwenTokenizer) -> tuple[list[str], list[int]]:
    kept = load_source("jsonl", path=path).records
    dataset = ChatDataset(kept, tokenizer, max_seq_len=1 << 20)
    return [r["id"] for r in kept], [dataset[i]["input_ids"].numel() for i in range(len(kept))]


@pytest.mark.parametrize(("num_records", "scale"), [(160, 1.0), (600, 0.125)])
def test_token_lengths_are_the_profile_draws(
    num_records: int, scale: float, tmp_path: Path, tokenizer: QwenTokenizer
) -> None:
    path = tmp_path / "cs.jsonl"
    summary = write_jsonl(path, num_records, length_scale=scale, seed=5)
    ids, lengths = token_lengths(path, tokenizer)
    assert ids == [f"cs-{i:07d}" for i in range(num_records)]
    draws = CASE_STUDY_LENGTHS.lengths(num_records, 5, max_len=round(8191 * scale), scale=scale)
    shortest = min(lengths)
    assert lengths == [max(shortest, d) for d in draws]
    assert summary["raised_to_minimum"] == sum(d < shortest for d in draws)
    assert summary["tokens"] == sum(lengths) and summary["records"] == num_records
    assert not (tmp_path / "cs.jsonl.partial").exists()


def test_scaled_file_quantiles(tmp_path: Path, tokenizer: QwenTokenizer) -> None:
    """Quantiles of the tokenized lengths of a 1/8-scale file: the profile's over 8,
    within a few tokens and the sampling error of 1,500 records."""
    path = tmp_path / "cs.jsonl"
    write_jsonl(path, 1500, length_scale=0.125, seed=0)
    ordered = sorted(token_lengths(path, tokenizer)[1])
    quantile = {q: ordered[int(q * len(ordered))] for q in (0.1, 0.5, 0.9)}
    assert 70 <= quantile[0.1] <= 92  # full profile: 600-700 tokens
    assert 195 <= quantile[0.5] <= 230  # 1,600-1,800
    assert 510 <= quantile[0.9] <= 560  # 4,100-4,400
    assert ordered[-1] <= 1024


def test_command_line_writes_the_file_and_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sub" / "cs.jsonl"
    assert main(["--records", "7", "--length-scale", "0.5", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().err)
    assert summary["records"] == 7 and summary["bytes"] == out.stat().st_size
    assert len(out.read_text().splitlines()) == 7


def test_same_seed_same_file(tmp_path: Path) -> None:
    first = [json.dumps(r) for r, _, _ in records(50, 0.25, 1, QwenTokenizer())]
    again = [json.dumps(r) for r, _, _ in records(50, 0.25, 1, QwenTokenizer())]
    other = [json.dumps(r) for r, _, _ in records(50, 0.25, 2, QwenTokenizer())]
    assert first == again and first != other


def test_lengths_only_are_the_files_lengths(tmp_path: Path, tokenizer: QwenTokenizer) -> None:
    out = tmp_path / "lengths.txt"
    assert (
        main(["--records", "40", "--length-scale", "0.125", "--lengths-only", "--out", str(out)])
        == 0
    )
    path = tmp_path / "cs.jsonl"
    write_jsonl(path, 40, length_scale=0.125, seed=0)
    assert [int(x) for x in out.read_text().split()] == token_lengths(path, tokenizer)[1]
