"""The run config in checkpoints and the config of a resume (``app/run_config.py``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from odb_lightning.app.run_config import (
    RUN_CONFIG_KEY,
    RunConfigCheckpoint,
    command_line_keys,
    config_for_resume,
    leaves,
    merge_resume_config,
    nest,
    replaced_groups,
    saved_run_config,
    shape_conflict,
)

GROUPS = ["data", "model", "batching", "trainer", "logger", "callbacks", "paths", "debug"]

SAVED = {
    "seed": 0,
    "ckpt_path": None,
    "model": {"hidden_size": 48, "num_hidden_layers": 1, "learning_rate": 0.001},
    "trainer": {"max_epochs": 1},
    "data": {"sizes": {"max_samples": 80}, "source": {"path": "${paths.root_dir}/data.jsonl"}},
    "logger": {"csv": {"_target_": "CSVLogger", "save_dir": "${paths.output_dir}"}},
    "paths": {"output_dir": "/first/run", "root_dir": "/first"},
}
# What a resume's command line composes without the original overrides: the defaults.
CURRENT = {
    "seed": 0,
    "ckpt_path": "/first/run/checkpoints/last.ckpt",
    "model": {"hidden_size": 896, "num_hidden_layers": 24, "learning_rate": 0.001},
    "trainer": {"max_epochs": 3},
    "data": {"sizes": {"max_samples": 224}, "source": {"path": "${paths.root_dir}/data.jsonl"}},
    "logger": {
        "csv": {"_target_": "CSVLogger", "save_dir": "${paths.output_dir}"},
        "wandb": {"_target_": "WandbLogger", "offline": True},
    },
    "paths": {"output_dir": "/resumed/run", "root_dir": "/resumed"},
    "new_knob": 7,
}


def _merge(overrides: list[str], baseline: dict | None = None) -> tuple[dict, list[str]]:
    current = leaves(CURRENT)

    def compose_baseline() -> dict:
        assert baseline is not None, "the baseline is composed only for group overrides"
        return leaves(baseline)

    set_keys, deleted = command_line_keys(overrides, GROUPS, current, compose_baseline)
    replaced = replaced_groups(overrides, GROUPS, current)
    return merge_resume_config(SAVED, current, set_keys, deleted, replaced)


def test_leaves_and_nest_round_trip() -> None:
    assert nest(leaves(CURRENT)) == CURRENT
    assert leaves({"a": {"b": [1, 2], "c": {}}}) == {"a.b": [1, 2], "a.c": {}}


def test_resume_without_overrides_takes_the_checkpoint_config() -> None:
    merged, changed = _merge(["ckpt_path=/first/run/checkpoints/last.ckpt"])
    assert merged["model"] == SAVED["model"]  # not the defaults' 896 x 24
    assert merged["trainer"] == {"max_epochs": 1} and merged["data"]["sizes"]["max_samples"] == 80
    assert merged["ckpt_path"] == CURRENT["ckpt_path"]
    assert merged["paths"] == CURRENT["paths"]  # where this run writes
    assert merged["new_knob"] == 7  # a key the checkpoint's config predates
    assert "wandb" not in merged["logger"]  # the run had no W&B logger: none added
    assert changed == ["ckpt_path"]


def test_a_group_override_takes_the_whole_group_even_when_it_is_the_default() -> None:
    # The checkpoint ran under DDP; trainer=cpu (the default: nothing differs from the
    # baseline) must still resume in one process, without the saved strategy.
    saved = {**SAVED, "trainer": {"max_epochs": 1, "devices": 2, "strategy": {"_target_": "DDP"}}}
    current = leaves(CURRENT)
    overrides = ["ckpt_path=x", "trainer=cpu"]
    set_keys, deleted = command_line_keys(overrides, GROUPS, current, lambda: dict(current))
    replaced = replaced_groups(overrides, GROUPS, current)
    assert replaced == {"trainer"}
    merged, changed = merge_resume_config(saved, current, set_keys, deleted, replaced)
    assert merged["trainer"] == CURRENT["trainer"]
    assert {"trainer.devices", "trainer.strategy._target_", "trainer.max_epochs"} <= set(changed)
    assert merged["model"] == SAVED["model"], "other groups stay the checkpoint's"


def test_command_line_keys_win() -> None:
    merged, changed = _merge(["ckpt_path=x", "trainer.max_epochs=3", "~data.sizes.max_samples"])
    assert merged["trainer"]["max_epochs"] == 3
    assert "max_samples" not in merged["data"].get("sizes", {})
    assert merged["model"]["hidden_size"] == 48
    assert changed == ["ckpt_path", "trainer.max_epochs"]


def test_a_key_set_to_its_default_still_wins() -> None:
    merged, _ = _merge(["model.hidden_size=896"])
    assert merged["model"]["hidden_size"] == 896 and merged["model"]["num_hidden_layers"] == 1


def test_group_override_wins_for_the_keys_it_changes() -> None:
    baseline = {
        **CURRENT,
        "logger": {"csv": CURRENT["logger"]["csv"]},
        "trainer": {"max_epochs": 1},
    }
    merged, _ = _merge(["logger=wandb"], baseline=baseline)
    assert merged["logger"]["wandb"] == {"_target_": "WandbLogger", "offline": True}
    assert merged["trainer"]["max_epochs"] == 3  # changed by the group: 3 vs the default 1
    assert merged["model"] == SAVED["model"]  # untouched by the group: the checkpoint's


def test_checkpoint_holds_the_config_and_it_reads_back(tmp_path: Path) -> None:
    cfg = OmegaConf.create({"a": 1, "b": "${a}", "paths": {"output_dir": str(tmp_path)}})
    callback = RunConfigCheckpoint(cfg, ["a=1"])
    checkpoint: dict = {"state_dict": {"w": torch.zeros(1)}}
    callback.on_save_checkpoint(None, None, checkpoint)  # type: ignore[arg-type]
    assert checkpoint[RUN_CONFIG_KEY]["config"]["b"] == "${a}"
    assert checkpoint[RUN_CONFIG_KEY]["resolved"]["b"] == 1
    torch.save(checkpoint, tmp_path / "file.ckpt")
    sharded = tmp_path / "sharded.ckpt"  # an FSDP2 checkpoint directory: meta.pt
    sharded.mkdir()
    torch.save({RUN_CONFIG_KEY: checkpoint[RUN_CONFIG_KEY]}, sharded / "meta.pt")
    for path in (tmp_path / "file.ckpt", sharded):
        saved = saved_run_config(path)
        assert saved is not None and saved["overrides"] == ["a=1"]
        assert saved["resolved"] == {"a": 1, "b": 1, "paths": {"output_dir": str(tmp_path)}}
    torch.save({"state_dict": {}}, tmp_path / "old.ckpt")
    assert saved_run_config(tmp_path / "old.ckpt") is None
    assert saved_run_config(tmp_path / "missing.ckpt") is None


MISMATCH = RuntimeError(
    "Error(s) in loading state_dict for CausalLMModule:\n\tsize mismatch for "
    "model.lm_head.weight: copying a param with shape torch.Size([4096, 48]) from "
    "checkpoint, the shape in current model is torch.Size([4096, 64])."
)


def test_shape_conflict_names_the_model_key() -> None:
    saved = {"resolved": {"model": {"hidden_size": 48, "num_hidden_layers": 1}}}
    resolved = {"model": {"hidden_size": 64, "num_hidden_layers": 1}}
    message = str(shape_conflict("c.ckpt", saved, resolved, MISMATCH))
    assert "model.hidden_size=64 here, 48 in the checkpoint" in message
    assert "num_hidden_layers" not in message
    assert "size mismatch for model.lm_head.weight" in message


def test_shape_conflict_without_a_saved_config_says_to_repeat_the_overrides() -> None:
    message = str(shape_conflict("c.ckpt", None, {"model": {}}, MISMATCH))
    assert "holds no run config" in message and ".hydra/overrides.yaml" in message


@pytest.mark.parametrize("overrides", [["hydra.run.dir=/x"], []])
def test_hydra_overrides_set_no_config_key(overrides: list[str]) -> None:
    set_keys, deleted = command_line_keys(overrides, GROUPS, leaves(CURRENT), dict)
    assert set_keys == set() and deleted == set()


def test_config_for_resume_of_a_checkpoint_without_config_keeps_the_command_line(
    tmp_path: Path,
) -> None:
    torch.save({"state_dict": {}}, tmp_path / "old.ckpt")
    cfg = OmegaConf.create({"model": {"hidden_size": 64}})
    assert config_for_resume(cfg, str(tmp_path / "old.ckpt")) is cfg


def test_resume_at_its_own_max_steps_warns_that_nothing_is_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = {"config": {"trainer": {"max_steps": 3}}, "resolved": {}, "overrides": []}
    torch.save({RUN_CONFIG_KEY: entry, "global_step": 3}, tmp_path / "stopped.ckpt")
    cfg = OmegaConf.create({"trainer": {"max_steps": -1}, "ckpt_path": "x"})
    # An in-process Hydra run earlier in the session leaves its HydraConfig (the command
    # line of that run) and may have disabled existing loggers: this resume has neither.
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: False))
    logger = logging.getLogger("odb_lightning.app.run_config")
    monkeypatch.setattr(logger, "disabled", False)
    monkeypatch.setattr(logger, "propagate", True)
    with caplog.at_level("WARNING", logger=logger.name):
        resumed = config_for_resume(cfg, str(tmp_path / "stopped.ckpt"))
    assert resumed.trainer.max_steps == 3  # the checkpoint's: no command line sets it here
    assert "at step 3 and trainer.max_steps=3" in caplog.text
    assert "set trainer.max_steps (-1: no limit)" in caplog.text


def test_a_node_given_another_target_is_taken_whole() -> None:
    """A resume that switches the batching policy's type gets the new policy's node, not
    the checkpoint's keys under the new target."""
    saved = {"batching": {"token_budget": 64, "policy": {"_target_": "Online", "join": True}}}
    current = {"batching.token_budget": 64, "batching.policy._target_": "Oracle"}
    current["batching.policy.max_batch_size"] = 8
    set_keys = {"batching.policy._target_", "batching.policy.max_batch_size"}
    merged, changed = merge_resume_config(saved, current, set_keys, set())
    assert merged["batching"]["policy"] == {"_target_": "Oracle", "max_batch_size": 8}
    assert {"batching.policy._target_", "batching.policy.join"} <= set(changed)
    # Unchanged target: the checkpoint's other keys stay.
    same = {"batching.policy._target_": "Online", "batching.policy.join": False}
    merged, _ = merge_resume_config(saved, same, {"batching.policy.join"}, set())
    assert merged["batching"]["policy"] == {"_target_": "Online", "join": False}
