"""``odb-check`` and the checks ``train.py`` runs first: config and data errors in seconds,
before torch, Lightning or transformers load, and the presets named in their messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.utils import get_class
from lightning.fabric.utilities.rank_zero import _get_rank

from odb_lightning.app.check import main
from odb_lightning.app.config_store import MODULES
from odb_lightning.app.run_dir import lightning_rank
from odb_lightning.lit.data.datamodule import ODBDataModule
from odb_lightning.lit.data.vlm_datamodule import VisionDataModule
from odb_lightning.lit.model.module import CausalLMModule
from odb_lightning.lit.model.vlm_module import VisionLanguageModule

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "lightning", "transformers")


def write_chats(path: Path, bad_line: int | None = None) -> Path:
    lines = []
    for n in range(1, 11):
        answer = None if n == bad_line else f"answer {n}"
        turns = [{"role": "user", "content": f"question {n}"}]
        lines.append(
            {"id": f"c{n}", "messages": [*turns, {"role": "assistant", "content": answer}]}
        )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_the_config_and_the_first_records_are_checked_without_torch(tmp_path: Path) -> None:
    """Composing ``conf/train.yaml``, building every config object but the model's and
    reading the first records load neither torch, Lightning nor transformers."""
    chats = write_chats(tmp_path / "chats.jsonl")
    code = f"""
import json, sys
from odb_lightning.app.check import check_config, check_records
from odb_lightning.app.preview import compose_train_config
cfg = compose_train_config(["debug=smoke", "data=jsonl", "data.source.path={chats}"], False)
built = check_config(cfg)
checks = check_records(cfg, 3)
heavy = [m for m in {HEAVY!r} if m in sys.modules]
print(json.dumps([sorted(built), len(checks[0].records), heavy]))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    built, read, heavy = json.loads(done.stdout.splitlines()[-1])
    assert {"batching", "data.source", "data.sizes", "data.caches", "stop"} <= set(built)
    assert (read, heavy) == (3, [])


def test_the_generated_nodes_name_the_modules_that_build_them() -> None:
    assert get_class(MODULES["text_data"]) is ODBDataModule
    assert get_class(MODULES["image_text_data"]) is VisionDataModule
    assert get_class(MODULES["causal_lm"]) is CausalLMModule
    assert get_class(MODULES["vision_language"]) is VisionLanguageModule


def test_odb_check_says_what_it_read(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    chats = write_chats(tmp_path / "chats.jsonl")
    assert main(["debug=smoke", "data=jsonl", f"data.source.path={chats}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("config: ok (batching=odb, token_budget=")
    assert out[1] == (
        f"data.source jsonl ({chats}): the first 8 records read and valid, layout messages"
    )
    assert out[2] == "  first record: 'c1' user: question 1 | assistant: answer 1"
    assert out[3].startswith("model: ok (model.architecture, ")
    assert out[4].endswith(f"odb-preview debug=smoke data=jsonl data.source.path={chats}")


def test_odb_check_names_the_bad_record(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    chats = write_chats(tmp_path / "chats.jsonl", bad_line=4)
    assert main(["debug=smoke", "data=jsonl", f"data.source.path={chats}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"odb-check: BadRecordError: record {chats}:4: field 'messages[1].content'"
    )


def test_a_value_a_preset_set_is_named_with_the_preset(capsys: pytest.CaptureFixture) -> None:
    """debug=smoke sets max_seq_len 1024: under a smaller budget the message says so."""
    assert main(["debug=smoke", "batching.token_budget=512"]) == 1
    assert capsys.readouterr().err.strip() == (
        "odb-check: ConfigError: data.sizes.max_seq_len (1024) must not exceed "
        "batching.token_budget (512): a sample of max_seq_len tokens must fit one step "
        "(data.sizes.max_seq_len=1024 is set by debug=smoke: override it on the command line)"
    )
    # Set on the command line, the value is the user's own: no preset is named.
    assert main(["debug=smoke", "batching.token_budget=512", "data.sizes.max_seq_len=600"]) == 1
    assert "is set by" not in capsys.readouterr().err


def test_train_py_stops_on_a_config_error_before_torch_loads(tmp_path: Path) -> None:
    """train.py's config error: the message alone, exit 1, failed.json, and no module of
    torch, Lightning or transformers imported."""
    command = [
        sys.executable, "-X", "importtime", "train.py", "debug=smoke",
        "batching.token_budget=512", f"hydra.run.dir={tmp_path}",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "is set by debug=smoke" in done.stderr
    assert json.loads((tmp_path / "failed.json").read_text())["error"] == "ConfigError"
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert not {m for m in imported if m.split(".")[0] in HEAVY}


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"RANK": "3"},
        {"LOCAL_RANK": "1"},
        {"SLURM_PROCID": "5"},
        {"LOCAL_RANK": "2", "SLURM_PROCID": "7"},
    ],
)
def test_the_rank_read_before_lightning_is_lightnings(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    assert lightning_rank() == (_get_rank() or 0)


def test_odb_check_reads_each_part_of_a_mixture(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    good = write_chats(tmp_path / "good.jsonl")
    bad = write_chats(tmp_path / "bad.jsonl", bad_line=2)
    mixture = f"data.mixture=[{{path:'{good}',weight:3}},{{path:'{bad}'}}]"
    assert main(["debug=smoke", mixture]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(f"odb-check: BadRecordError: record {bad}:2: field")
    fixed = f"data.mixture=[{{path:'{good}',weight:3}},{{path:'{tmp_path / 'none.jsonl'}'}}]"
    assert main(["debug=smoke", fixed]) == 1
    assert capsys.readouterr().err.startswith(
        f"odb-check: DataCheckError: data.mixture[1].path={str(tmp_path / 'none.jsonl')!r}: "
        "no such file or folder"
    )
    assert main(["debug=smoke", f"data.mixture=[{{path:'{good}',weight:-1}}]"]) == 1
    assert "data.mixture[0]: weight must be a number > 0" in capsys.readouterr().err
    assert main(["debug=smoke", f"data.mixture=[{{path:'{good}'}},{{path:'{good}'}}]"]) == 1
    assert "data.mixture[1].label='good.jsonl' names another part" in capsys.readouterr().err
    two = f"data.mixture=[{{path:'{good}',weight:3}},{{path:'{good}',label:again}}]"
    assert main(["debug=smoke", two]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == (
        f"data.mixture[0] jsonl ({good}): the first 8 records read and valid, layout messages"
    )
    assert any(line.startswith("data.mixture[1] jsonl") for line in out)


def test_streamings_refusal_names_the_preset_that_set_max_samples(tmp_path: Path) -> None:
    """The data module's refusal of a streamed smoke run (raised after the checks) names
    the preset too: train.py logs every failure through the same explanation."""
    from odb_lightning.app.preview import compose_train_config
    from odb_lightning.app.run_log import explained

    chats = write_chats(tmp_path / "chats.jsonl")
    overrides = ["debug=smoke", "data=jsonl", f"data.source.path={chats}", "data.streaming=true"]
    compose_train_config(overrides, stream_as_table=False)
    refusal = ValueError(
        "data.streaming=true reads the whole file; data.sizes.max_samples=80 must be null"
    )
    assert explained(refusal) == (
        f"{refusal} (data.sizes.max_samples=80 is set by debug=smoke: override it on the "
        "command line)"
    )


def test_streamings_settings_are_checked_before_torch(capsys: pytest.CaptureFixture) -> None:
    """A stream's refusals (here the held-out records) come from the checks, in seconds."""
    overrides = ["data=jsonl", "data.source.path=chats.jsonl", "data.streaming=true"]
    assert main([*overrides, "batching.policy.shard_dealing=fixed"]) == 1
    assert capsys.readouterr().err.startswith(
        "odb-check: ConfigError: invalid config 'data.streaming': data.streaming=true: "
        "data.sizes.val_samples=0.05 holds out a seeded choice of records"
    )
