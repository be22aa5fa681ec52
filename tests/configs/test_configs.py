"""Every experiment, sweep and preset composes, and its groups instantiate."""

from __future__ import annotations

from pathlib import Path

import hydra
import lightning.pytorch as pl
import pytest
from omegaconf import DictConfig

from helpers.configs import CONF, SWEEPS, ComposeConfig
from odb_lightning.app.validation import ConfigError, instantiate_checked, validate_config
from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.modes import MODES
from odb_lightning.lit.model.loss import GRADIENTS_ON_EVERY_RANK

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
TRAINERS = sorted(p.stem for p in (CONF / "trainer").glob("*.yaml"))


def model_objects(cfg: DictConfig) -> dict[str, object]:
    """What the app hands a model beside its config: a vision module gets the vision
    family with the tokenizer's ids."""
    if not cfg.model._target_.endswith("VisionLanguageModule"):
        return {}
    from odb_lightning.data.vision_family import Qwen2VLFamily

    return {"family": Qwen2VLFamily.of_tokenizer(hydra.utils.instantiate(cfg.tokenizer))}


def test_every_config_group_is_covered() -> None:
    assert {"sharegpt_odb", "sharegpt_standard", "chitchat_odb", "ultrachat_odb"} <= set(
        EXPERIMENTS
    )
    assert {"cpu", "ddp_cpu", "gpu8"} <= set(TRAINERS)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_composes_and_instantiates(experiment: str, compose_cfg: ComposeConfig) -> None:
    overrides = [f"experiment={experiment}"]
    if experiment.startswith("ultrachat"):
        overrides.append("data.source.path=/nonexistent/ultrachat")
    cfg = compose_cfg(overrides)
    validate_config(cfg)
    batching = instantiate_checked(cfg.batching, "batching")
    assert isinstance(batching, BatchingConfig)
    assert batching.mode in MODES
    assert cfg.experiment_name == experiment
    model = instantiate_checked(cfg.model, "model", objects=model_objects(cfg))
    model.configure_model()
    assert sum(p.numel() for p in model.parameters()) > 0
    for logger in cfg.logger.values():
        assert hydra.utils.instantiate(logger) is not None


@pytest.mark.parametrize("trainer", TRAINERS)
def test_trainer_preset_composes(trainer: str, compose_cfg: ComposeConfig) -> None:
    cfg = compose_cfg([f"trainer={trainer}"])
    assert cfg.trainer._target_ == "lightning.pytorch.Trainer"
    strategies = {
        "ddp_cpu": "DDPStrategy",
        "gpu8": "DDPStrategy",
        "fsdp_cpu": "FSDP2Strategy",
        "gpu8_fsdp": "FSDP2Strategy",
    }
    if trainer in strategies:
        assert cfg.trainer.strategy._target_.endswith(strategies[trainer])
        strategy = hydra.utils.instantiate(cfg.trainer.strategy)
        assert type(strategy).__name__ == strategies[trainer]


@pytest.mark.parametrize("sweep", SWEEPS)
def test_sweep_composes(sweep: str, compose_cfg: ComposeConfig) -> None:
    cfg = compose_cfg([f"sweep={sweep}"])
    params = cfg.hydra.sweeper.params
    assert len(params) == 1 and "," in next(iter(params.values()))


def test_default_run_is_sharegpt_odb_on_cpu(compose_cfg: ComposeConfig) -> None:
    cfg = compose_cfg([])
    assert cfg.experiment_name == "sharegpt_odb"
    batching = instantiate_checked(cfg.batching, "batching")
    assert batching.mode == "odb" and cfg.trainer.accelerator == "cpu"
    assert cfg.logger.wandb.offline is True


def startup_checks(cfg: DictConfig) -> None:
    """What ``app.train.run`` checks before anything starts, in its order."""
    validate_config(cfg)
    instantiate_checked(cfg.batching, "batching")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("batching.policy.shard_dealing=fastest", "batching.policy.shard_dealing"),
        ("batching.token_budget=-5", "batching.token_budget"),
        ("batching.policy.outstanding_depth=0", "batching.policy.outstanding_depth"),
        ("batching.policy.max_steps_per_round=0", "batching.policy.max_steps_per_round"),
        ("batching.loader.timeout_s=0", "batching.loader.timeout_s"),
        ("batching.loader.timeout_s=-1", "batching.loader.timeout_s"),
        ("batching.loader.timeout_s=true", "batching.loader.timeout_s"),
        ("batching.loader.alignment_timeout_s=inf", "batching.loader.alignment_timeout_s"),
        ("batching.loader.alignment_timeout_s=nan", "batching.loader.alignment_timeout_s"),
        ("batching.loader.on_bad_sample=ignore", "batching.loader.on_bad_sample"),
        (
            "batching.loader.multiprocessing_context=threads",
            "batching.loader.multiprocessing_context",
        ),
        ("data.sizes.max_seq_len=0", "data.sizes.max_seq_len"),
        ("batching.loader.num_workers=-1", "batching.loader.num_workers"),
        ("data.sizes.val_samples=-1", "data.sizes.val_samples"),
        ("data.sizes.max_samples=0", "data.sizes.max_samples"),
    ],
)
def test_out_of_range_value_names_the_hydra_key(
    override: str, key: str, compose_cfg: ComposeConfig
) -> None:
    cfg = compose_cfg([override])
    field = key.split(".")[-1]
    with pytest.raises(ConfigError) as info:
        startup_checks(cfg)
    message = str(info.value)
    assert key in message and field in message.removeprefix(f"invalid config '{key}': ")


def test_max_seq_len_over_budget_fails_at_startup(compose_cfg: ComposeConfig) -> None:
    cfg = compose_cfg(["data.sizes.max_seq_len=8192", "batching.token_budget=4096"])
    with pytest.raises(
        ConfigError, match=r"data.sizes.max_seq_len \(8192\).*batching.token_budget"
    ):
        validate_config(cfg)


@pytest.mark.parametrize("mode", list(MODES))
def test_generated_batching_option_is_the_dataclass_defaults(
    mode: str, compose_cfg: ComposeConfig
) -> None:
    assert not (CONF / "batching").exists()  # no YAML: the dataclasses are the defaults
    cfg = compose_cfg([f"batching={mode}", "experiment=sharegpt_odb"])
    batching = instantiate_checked(cfg.batching, "batching")
    expected = MODES[mode]
    assert batching.mode == mode
    assert batching.policy == expected.policy() and batching.rows == expected.rows()
    assert batching.seed == cfg.seed and batching.token_budget == 4096  # the experiment's
    assert cfg.batching.loader.persistent_workers is True


def test_switching_mode_gives_the_new_policy_whole(compose_cfg: ComposeConfig) -> None:
    cfg = compose_cfg(["experiment=sharegpt_standard"])
    assert set(cfg.batching.policy) == {"_target_", "batch_size"}


@pytest.mark.parametrize(
    "override",
    ["batching.policy.outstanding_dept=64", "batching.loader.num_worker=1", "batching.mode=odb"],
)
def test_a_typo_key_fails_at_composition(override: str, compose_cfg: ComposeConfig) -> None:
    with pytest.raises(Exception, match="outstanding_dept|num_worker|mode"):
        compose_cfg([override])


def test_an_unknown_mode_fails_naming_the_modes(compose_cfg: ComposeConfig) -> None:
    with pytest.raises(Exception, match="batching/fastest") as info:
        compose_cfg(["batching=fastest"])
    assert all(mode in str(info.value) for mode in MODES)


def test_packed_row_attention_must_match_the_backend(compose_cfg: ComposeConfig) -> None:
    packed = ["batching=odb_packed", "batching.rows.attention_weight=0.001"]
    cfg = compose_cfg([*packed, "model.architecture.attn_implementation=sdpa"])
    with pytest.raises(ConfigError, match=r"^batching\.rows\.packed_attention must be dense"):
        validate_config(cfg)
    dense = "batching.rows.packed_attention=dense"
    validate_config(compose_cfg([*packed, dense, "model.architecture.attn_implementation=sdpa"]))
    padded = ["batching=odb", "batching.rows.attention_weight=0.001"]
    validate_config(compose_cfg([*padded, "model.architecture.attn_implementation=sdpa"]))


MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
SMALL_MODELS = {"tiny_qwen2", "tiny_llama", "tiny_qwen2_vl", "cpu_bench"}


@pytest.mark.parametrize("preset", MODELS)
def test_model_preset_composes_and_instantiates(
    preset: str, tmp_path: Path, compose_cfg: ComposeConfig
) -> None:
    overrides = [f"model={preset}"]
    if preset == "pretrained":  # a mandatory key: any local directory composes
        overrides.append(f"model.architecture.pretrained_path={tmp_path}")
    cfg = compose_cfg(overrides)
    assert cfg.model.optimizer._partial_ and cfg.model.scheduler._partial_
    if preset == "pretrained":
        return  # the directory holds no checkpoint to build from
    model = instantiate_checked(cfg.model, "model", objects=model_objects(cfg), _convert_="all")
    assert model.random_init.model_type == cfg.model.architecture.model_type or "vl" in preset
    if preset in SMALL_MODELS:
        model.configure_model()
        assert sum(p.numel() for p in model.parameters()) > 0


def test_model_defaults_are_the_dataclasses_and_typos_fail(compose_cfg: ComposeConfig) -> None:
    from odb_lightning.lit.model.config import Architecture, ModelRuntime, StepPolicy

    cfg = compose_cfg(["model=tiny_qwen2"])
    assert cfg.model.architecture.hidden_size == Architecture.hidden_size
    assert cfg.model.runtime.dtype == ModelRuntime.dtype.value
    assert cfg.model.step.loss_chunk_tokens == StepPolicy.loss_chunk_tokens
    assert "hidden_size" not in (CONF / "model" / "tiny_qwen2.yaml").read_text()
    typo = compose_cfg(["+model.architecture.hiden_size=8"])
    with pytest.raises(ConfigError, match="hiden_size"):
        instantiate_checked(typo.model, "model", _convert_="all")
    scalar = compose_cfg(["model.finetuning=lora"])  # a value over a concern's node
    with pytest.raises(ConfigError, match=r"'model\.finetuning': model\.finetuning must be a"):
        instantiate_checked(scalar.model, "model", _convert_="all")
    wrong = compose_cfg(["model.architecture.hidden_size=30"])
    with pytest.raises(ConfigError, match=r"model\.architecture\.hidden_size \(30\) must be a"):
        instantiate_checked(wrong.model, "model", _convert_="all")


def test_casestudy_presets_carry_its_budget_edges_and_profile(compose_cfg: ComposeConfig) -> None:
    odb = compose_cfg(["experiment=casestudy_odb"])
    assert (odb.data.source.name, odb.data.source.regime) == ("synthetic", "casestudy")
    assert (odb.data.sizes.max_samples, odb.data.sizes.max_seq_len) == (902_087, 8192)
    assert instantiate_checked(odb.batching, "batching").token_budget == 49_152
    bucketed = compose_cfg(["experiment=casestudy_bucketed"])
    config = instantiate_checked(bucketed.batching, "batching")
    assert (config.mode, config.token_budget) == ("bucketed", 49_152)
    assert config.policy.boundaries == (0, 770, 1216, 1728, 2432, 3296, 8192)
    assert config.policy.max_batch_size == 64
    optimized = compose_cfg(["experiment=casestudy_bucketed", "batching.policy.boundaries=[]"])
    assert instantiate_checked(optimized.batching, "batching").policy.boundaries == ()
    own_file = compose_cfg(["experiment=casestudy_odb", "data=jsonl", "data.source.path=cs.jsonl"])
    assert (own_file.data.source.name, own_file.data.source.path) == ("jsonl", "cs.jsonl")


@pytest.mark.parametrize(
    ("override", "named", "instead"),
    [
        ("trainer.strategy=deepspeed", "DeepSpeed", "trainer=gpu8_fsdp"),
        ("trainer.strategy=deepspeed_stage_2_offload", "DeepSpeed", "trainer=gpu8_fsdp"),
        (
            "trainer.strategy._target_=lightning.pytorch.strategies.DeepSpeedStrategy",
            "DeepSpeed",
            "trainer=gpu8 \\(DDP\\)",
        ),
        ("trainer.strategy=fsdp", "FSDP1", "trainer=fsdp_cpu on CPU"),
        (
            "trainer.strategy._target_=lightning.pytorch.strategies.FSDPStrategy",
            "FSDP1",
            "trainer=gpu8_fsdp on GPUs",
        ),
    ],
)
def test_an_unvalidated_strategy_is_refused_naming_the_tested_ones(
    override: str, named: str, instead: str, compose_cfg: ComposeConfig
) -> None:
    # A string from Lightning's registry on the default trainer; a class in gpu8_fsdp's
    # strategy node.
    target = "_target_" in override
    cfg = compose_cfg(["trainer=gpu8_fsdp", override] if target else [f"++{override}"])
    with pytest.raises(ConfigError, match=rf"trainer.strategy=\S+: {named} .* is not validated"):
        validate_config(cfg)
    with pytest.raises(ConfigError, match=instead):
        validate_config(cfg)


@pytest.mark.parametrize("trainer", TRAINERS)
def test_the_trainer_presets_pass_the_strategy_check(
    trainer: str, compose_cfg: ComposeConfig
) -> None:
    """Each preset passes the start-up check, and what passed is a strategy the loss mixin
    accepts: one that holds every gradient in param.grad on every rank."""
    cfg = compose_cfg([f"trainer={trainer}"])
    validate_config(cfg)
    node = cfg.trainer.get("strategy")
    if node is None:  # Lightning picks it: one CPU device here
        assert (cfg.trainer.accelerator, cfg.trainer.devices) == ("cpu", 1)
        strategy = pl.Trainer(accelerator="cpu", devices=1, logger=False).strategy
    else:
        strategy = hydra.utils.instantiate(node)
    assert isinstance(strategy, GRADIENTS_ON_EVERY_RANK), type(strategy).__name__
