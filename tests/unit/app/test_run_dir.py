"""The run directory's name (``${odb.run_name:...}``) under every launcher it tells apart.

torchrun is played by an in-process ``TCPStore`` server standing in for the agent's store,
and the ranks by calls with their environments, one after the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import torch.distributed as dist
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from helpers.configs import CONF, ComposeConfig
from odb_lightning.app import run_dir
from odb_lightning.app.config_store import prepare_composition
from odb_lightning.app.run_dir import RunDirError, run_name
from odb_lightning.runtime.errors import MetadataChannelError

PATTERN = "%Y-%m-%d_%H-%M-%S.%f"  # microseconds: two clocks never format alike here
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "1", "SLURM_NTASKS": "16"}


@pytest.fixture
def agent_store() -> Iterator[dist.TCPStore]:
    """A store server like the one node 0's torchrun agent hosts before workers start."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield store
    del store


def torchrun_env(store: dist.TCPStore | None, rank: int, restart: int = 0) -> dict[str, str]:
    """What torchrun 2.13's agent puts into worker ``rank``'s environment (the part read);
    without a store, a port where nothing listens."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": str(store.port if store else 1),
        "TORCHELASTIC_RUN_ID": "none",  # the static rendezvous' default --rdzv-id
        "TORCHELASTIC_RESTART_COUNT": str(restart),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }


def is_timestamp(name: str) -> bool:
    return abs((datetime.strptime(name, PATTERN) - datetime.now()).total_seconds()) < 60


def test_one_process_uses_its_clock() -> None:
    assert is_timestamp(run_name(PATTERN, 1.0, {}))
    # Lightning's launcher before it starts its children: no external launcher variables.
    assert is_timestamp(run_name(PATTERN, 1.0, {"MASTER_ADDR": "127.0.0.1"}))


def test_torchrun_ranks_read_rank_zero_name(agent_store: dist.TCPStore) -> None:
    first = run_name(PATTERN, 5.0, torchrun_env(agent_store, 0))
    assert is_timestamp(first)
    assert run_name(PATTERN, 5.0, torchrun_env(agent_store, 1)) == first
    # A restarted worker group publishes and reads under a key of its own.
    again = run_name(PATTERN, 5.0, torchrun_env(agent_store, 0, restart=1))
    assert again != first
    assert run_name(PATTERN, 5.0, torchrun_env(agent_store, 1, restart=1)) == again
    assert agent_store.get("odb_lightning/run_name/none/0").decode() == first


def test_torchrun_rank_fails_when_rank_zero_publishes_nothing(
    agent_store: dist.TCPStore,
) -> None:
    with pytest.raises(RunDirError) as raised:
        run_name(PATTERN, 1.0, torchrun_env(agent_store, 1, restart=3))
    message = str(raised.value)
    # The store's own account of its wait: the 1 s given, not its 300 s default.
    assert "wait timeout after 1000ms" in message
    assert "rank 1 waited 1.0s for global rank 0" in message
    assert "'odb_lightning/run_name/none/3'" in message and "hydra.run.dir" in message
    assert f"MASTER_ADDR:MASTER_PORT (127.0.0.1:{agent_store.port})" in message


def test_torchrun_store_that_is_not_there_names_master_addr() -> None:
    env = torchrun_env(None, 1)
    with pytest.raises(RunDirError, match=r"could not reach torchrun's agent store at MASTER_AD"):
        run_name(PATTERN, 1.0, env)
    env["MASTER_ADDR"] = "trainer-7f9c4d-0.invalid"
    with pytest.raises(MetadataChannelError, match=r"MASTER_ADDR 'trainer-7f9c4d-0.invalid'"):
        run_name(PATTERN, 1.0, env)


def test_srun_tasks_agree_on_the_job_and_step() -> None:
    for procid in ("0", "15"):
        assert run_name(PATTERN, 1.0, {**SLURM, "SLURM_PROCID": procid}) == "slurm-4242.1"
    # One task (an sbatch script running python, or an salloc shell): this process's clock,
    # so that successive runs in one allocation do not share a directory.
    assert is_timestamp(run_name(PATTERN, 1.0, {**SLURM, "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}))
    assert is_timestamp(run_name(PATTERN, 1.0, SLURM))  # no SLURM_PROCID: not started by srun


def test_torchrun_under_srun_uses_the_agent_store(agent_store: dist.TCPStore) -> None:
    # srun starts one torchrun per node: the ranks are torchrun's, the name rank 0's clock.
    env = {**SLURM, "SLURM_PROCID": "0", "SLURM_NTASKS": "2", **torchrun_env(agent_store, 0)}
    assert is_timestamp(run_name(PATTERN, 5.0, env))


def test_torchrun_without_the_agent_store(agent_store: dist.TCPStore) -> None:
    env = {**torchrun_env(agent_store, 1), "TORCHELASTIC_USE_AGENT_STORE": "False"}
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    with pytest.raises(RunDirError, match=r"TORCH_DISABLE_SHARE_RDZV_TCP_STORE='1'.*hydra.run.dir"):
        run_name(PATTERN, 1.0, env)
    assert run_name(PATTERN, 1.0, {**env, "SLURM_PROCID": "1", **SLURM}) == "slurm-4242.1"
    assert is_timestamp(run_name(PATTERN, 1.0, {**env, "WORLD_SIZE": "1"}))


def test_train_yaml_resolves_one_run_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    run_dir._run_name_once.cache_clear()
    prepare_composition()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("train", return_hydra_config=True)
    first = OmegaConf.select(cfg, "hydra.run.dir")
    assert OmegaConf.select(cfg, "hydra.run.dir") == first
    assert OmegaConf.select(cfg, "hydra.sweep.dir") == f"{first}/multirun"
    # Decided once per process: every later resolution (the sweep dir, Lightning's launcher
    # reading HydraConfig) returns the same name, even in a later second.
    assert run_dir._run_name_once.cache_info().misses == 1
    assert first.startswith("outputs/train/")
    datetime.strptime(first.removeprefix("outputs/train/"), "%Y-%m-%d_%H-%M-%S")


def test_ranks_above_zero_of_external_launchers_tag_their_hydra_files() -> None:
    from odb_lightning.app.run_dir import process_tag

    assert process_tag({}) == ""  # one process, or a child of Lightning's launcher
    assert process_tag({"RANK": "0", "WORLD_SIZE": "2"}) == ""
    assert process_tag({"RANK": "3", "WORLD_SIZE": "4"}) == "_rank3"  # torchrun
    assert process_tag({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}) == "_rank1"  # srun
    assert process_tag({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == ""  # a batch script


def test_a_resume_continues_in_the_directory_of_its_checkpoint(tmp_path: Path) -> None:
    from odb_lightning.app.run_dir import resume_dir

    run = tmp_path / "outputs" / "train" / "first"
    (run / "checkpoints" / "epoch=0-step=10.ckpt").mkdir(parents=True)  # a sharded one
    assert resume_dir(str(run / "checkpoints" / "last.ckpt"), "new") == str(run)
    assert resume_dir(str(run / "checkpoints" / "epoch=0-step=10.ckpt"), "new") == str(run)
    assert resume_dir(str(tmp_path / "elsewhere.ckpt"), "new") == "new"
    assert resume_dir(None, "new") == "new"


def test_train_yaml_puts_a_resume_into_its_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    run_dir.resume_tag.cache_clear()
    prepare_composition()
    (tmp_path / "checkpoints").mkdir()
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("train", overrides=[f"ckpt_path={ckpt}"], return_hydra_config=True)
        fresh = compose("train", return_hydra_config=True)
        evaluation = compose("eval", overrides=[f"ckpt_path={ckpt}"], return_hydra_config=True)
    assert OmegaConf.select(cfg, "hydra.run.dir") == str(tmp_path)
    # Its Hydra files go beside the first run's .hydra/, not over them.
    subdir = OmegaConf.select(cfg, "hydra.output_subdir")
    assert subdir.startswith(".hydra_resumed-")
    datetime.strptime(subdir.removeprefix(".hydra_resumed-"), "%Y-%m-%d_%H-%M-%S")
    assert OmegaConf.select(fresh, "hydra.output_subdir") == ".hydra"
    assert OmegaConf.select(fresh, "hydra.run.dir").startswith("outputs/train/")
    # eval.py reads a checkpoint without resuming its run: a directory of its own.
    assert OmegaConf.select(evaluation, "hydra.run.dir").startswith("outputs/eval/")
    assert OmegaConf.select(evaluation, "hydra.output_subdir") == ".hydra"


def test_wandb_run_name_is_the_experiment_and_the_overrides(compose_cfg: ComposeConfig) -> None:
    prepare_composition()
    overrides = ["experiment=sharegpt_standard", "batching.token_budget=8192", "ckpt_path=c"]
    cfg = compose_cfg(overrides)
    # experiment= is in the name already, ckpt_path is no part of what the run is.
    assert cfg.logger.wandb.name == "sharegpt_standard batching.token_budget=8192"
    assert compose_cfg([]).logger.wandb.name == "sharegpt_odb"
