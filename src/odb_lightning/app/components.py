"""The run's parts, built from the composed config and wired together here: the one place
that knows which component needs which other one.

The app builds the model's architecture first, asks it for the vocabulary, and builds
the run context (:class:`~odb_lightning.lit.run_context.RunContext`) from it and the
config; the data
module, the callbacks and the summary builder then receive what they need, as objects.
No component finds another through the trainer.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import hydra
import lightning.pytorch as pl
from hydra.core.hydra_config import HydraConfig
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.accelerators import AcceleratorRegistry
from omegaconf import DictConfig

from odb_lightning.app.run_config import override_key
from odb_lightning.app.validation import ConfigError, instantiate_checked
from odb_lightning.core.config import BatchingConfig
from odb_lightning.data.config import DataSizes
from odb_lightning.data.vision_family import vision_family_of
from odb_lightning.lit.callbacks.counters import StepCounters
from odb_lightning.lit.callbacks.mixture_counts import MixtureCounts
from odb_lightning.lit.callbacks.run_report import (
    AddsToSummary,
    CountsParameters,
    ReportsCompile,
    ReportsRun,
)
from odb_lightning.lit.callbacks.summary import SummaryBuilder
from odb_lightning.lit.callbacks.supervision import SupervisionCheck
from odb_lightning.lit.model.idle_steps import check_weights_idle_steps
from odb_lightning.lit.model.token_target import STEP_BATCHING_KEYS, batching_for_steps
from odb_lightning.lit.model.vlm_module import VisionLanguageModule
from odb_lightning.lit.run_context import RunContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunParts:
    """What one run trains with, built from its config (:func:`build_parts`)."""

    tokenizer: Any
    batching: BatchingConfig
    model: pl.LightningModule
    run: RunContext
    datamodule: Any
    embedding_rows: int | None  # of the model's input embedding
    sizes: DataSizes  # the data's (``data.sizes``): max_seq_len among them
    auto_ceiling: int | None = None  # the most token_budget=auto becomes (token-target steps)


def launched_accelerator(trainer: DictConfig) -> str:
    """The accelerator ``trainer.accelerator`` names, ``auto`` and ``gpu`` resolved as
    Lightning resolves them (``cuda``, else ``mps``; ``auto`` falls back to ``cpu``)."""
    name = str(trainer.get("accelerator", "auto"))
    if name in ("auto", "gpu"):
        available = [n for n in ("cuda", "mps") if AcceleratorRegistry.get(n).is_available()]
        name = available[0] if available else ("cpu" if name == "auto" else "cuda")
    return name


def launched_world(trainer: DictConfig) -> tuple[int, str]:
    """The job's processes (``trainer.devices x trainer.num_nodes``) and their accelerator,
    counted as Lightning counts them (its accelerators' own device parsing)."""
    name = launched_accelerator(trainer)
    devices = trainer.get("devices", "auto")
    try:
        accelerator = AcceleratorRegistry.get(name)
        if devices == "auto":
            count = accelerator.auto_device_count()
        else:
            count = len(accelerator.get_parallel_devices(accelerator.parse_devices(devices)))
    except (MisconfigurationException, TypeError, ValueError) as error:  # as the Trainer would
        raise ConfigError(
            f"invalid config 'trainer': accelerator={name} devices={devices}: {error}"
        ) from error
    return count * int(trainer.get("num_nodes", 1)), name


def max_samples_from(cfg: DictConfig) -> str | None:
    """``debug=smoke`` when that preset chose ``data.sizes.max_samples`` (the command line does
    not set it), so the data module's warning of a file read in part names the preset;
    else ``None``."""
    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.runtime.choices.get("debug") != "smoke":
        return None
    keys = {o.split("=", 1)[0].lstrip("+~") for o in hydra_cfg.overrides.task}
    return None if "data.sizes.max_samples" in keys else "debug=smoke"


def named_on_command_line(keys: tuple[str, ...], resumed: Collection[str] = ()) -> frozenset[str]:
    """Those of ``keys`` the command line sets (none outside a Hydra run) or ``resumed``
    names (the keys a resumed run's own command line set): the values the user chose,
    which the run keeps where it would otherwise resolve its own."""
    named = set(resumed)
    if HydraConfig.initialized():
        named.update(override_key(o) for o in HydraConfig.get().overrides.task)
    return frozenset(named & set(keys))


@dataclass(frozen=True)
class DataParts:
    """What the training data is built from (:func:`build_data`)."""

    tokenizer: Any
    batching: BatchingConfig
    run: RunContext
    datamodule: Any
    architecture: Any  # the model's architecture config (no weights)
    auto_ceiling: int | None = None  # the most token_budget=auto becomes (token-target steps)


def build_data(
    cfg: DictConfig,
    world_size: int,
    device: str,
    output_dir: str | None = None,
    resumed_keys: Collection[str] = (),
) -> DataParts:
    """The tokenizer, batching config, run context and data module of a validated ``cfg``
    (no model), each built by :func:`instantiate_checked`, after seeding. The run context
    takes its vocabulary from the model's architecture config; ``output_dir`` is where
    the data module writes its files (``None``: nowhere); ``resumed_keys``: the keys the
    command line of the run this one resumes set (:func:`named_on_command_line`)."""
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    tokenizer = instantiate_checked(cfg.tokenizer, "tokenizer")
    batching = instantiate_checked(cfg.batching, "batching")
    # The vocabulary comes from the model's architecture (its random-init config or the
    # checkpoint's), so the run context exists before the module that receives it.
    architecture = instantiate_checked(cfg.model.architecture, "model.architecture")
    batching = with_model_cost(batching, architecture)
    # Token-target steps resolve the budget and the emission order the data is batched by.
    step = cfg.model.get("step")
    tokens_per_step = (
        None if step is None else instantiate_checked(step, "model.step").tokens_per_step
    )
    named = named_on_command_line(STEP_BATCHING_KEYS, resumed_keys)
    steps = batching_for_steps(batching, tokens_per_step, named)
    if steps.resolved is not None:
        log.info(steps.resolved)
    if steps.advice is not None:
        log.warning(steps.advice)
    batching = steps.batching
    run = RunContext(
        vocab_size=architecture.checked_vocab_size(),
        world_size=world_size,
        device=device,
        output_dir=output_dir,
    )
    objects: dict[str, Any] = {"tokenizer": tokenizer, "batching": batching, "run": run}
    origin = max_samples_from(cfg)
    if origin is not None:
        objects["max_samples_from"] = origin
    datamodule = instantiate_checked(cfg.data, "data", objects=objects)
    return DataParts(tokenizer, batching, run, datamodule, architecture, steps.auto_ceiling)


def with_model_cost(batching: BatchingConfig, architecture: Any) -> BatchingConfig:
    """``batching`` with its rows' attention weight from the model's shape where
    ``batching.rows.attention_weight`` is ``None`` (the default; a number overrides it),
    said in one log line: a row then costs its training FLOPs in token units."""
    if batching.rows.attention_weight is not None:
        return batching
    weight = architecture.attention_weight()
    rows = batching.rows.with_model_cost(weight, architecture.attn_implementation)
    log.info(
        "batching.rows.attention_weight=%.3g from the model's shape (layers x width / "
        "matmul parameters): attention adds %.1f%% to a row of %s tokens "
        "(batching.rows.attention_weight=0 counts tokens only)",
        weight,
        100 * weight * batching.token_budget,
        f"{batching.token_budget:,}",
    )
    return dataclasses.replace(batching, rows=rows)


def build_parts(
    cfg: DictConfig, world_size: int, device: str, resumed_keys: Collection[str] = ()
) -> RunParts:
    """The tokenizer, batching config, model, run context and data module of a validated
    ``cfg`` (:func:`build_data`, writing into ``paths.output_dir``, and the model), each
    built by :func:`instantiate_checked` (errors name their group). ``world_size`` and
    ``device`` are the job's (:func:`launched_world`); ``resumed_keys``: the keys the
    resumed run's command line set (:func:`~odb_lightning.app.run_config.saved_override_keys`)."""
    output_dir = str(cfg.paths.output_dir)
    data = build_data(cfg, world_size, device, output_dir=output_dir, resumed_keys=resumed_keys)
    tokenizer, batching, run, datamodule = data.tokenizer, data.batching, data.run, data.datamodule
    architecture = data.architecture
    model_objects: dict[str, Any] = {"run": run}
    if issubclass(hydra.utils.get_class(cfg.model._target_), VisionLanguageModule):
        model_objects["family"] = vision_family_of(tokenizer)  # the tokenizer's ids
    # Plain Python arguments: the module's hyperparameters go into every checkpoint, which
    # torch.load(weights_only=True) then reads without OmegaConf types.
    model = instantiate_checked(cfg.model, "model", objects=model_objects, _convert_="all")
    if world_size > 1:  # ranks whose work runs out get IDLE batches: the module weights them 0
        check_weights_idle_steps(model)
    embedding_rows = architecture.embedding_rows()
    return RunParts(
        tokenizer,
        batching,
        model,
        run,
        datamodule,
        embedding_rows,
        datamodule.sizes,
        data.auto_ceiling,
    )


def _wiring(parts: RunParts, counters: StepCounters) -> dict[str, dict[str, Any]]:
    """The objects each configured callback (``callbacks.<name>``) receives."""
    datamodule = parts.datamodule
    return {
        "id_audit": {"record_ids": datamodule.record_ids},
        "step_metrics": {"counters": counters},
        "progress_bar": {"train_samples": parts.run.train_samples},
        "memory_warmup": {
            "batching": parts.batching,
            "max_seq_len": parts.sizes.max_seq_len,
            "vocab_size": parts.embedding_rows,
            "apply_token_budget": datamodule.apply_token_budget,
            "length_range": datamodule.length_range,
            "largest_image": datamodule.largest_image,
            "auto_ceiling": parts.auto_ceiling,
        },
    }


@dataclass(frozen=True)
class RunCallbacks:
    """The run's callbacks, in the order the trainer runs them, and the summary builder
    among them (the app writes what it builds)."""

    callbacks: list[pl.Callback]
    summary: SummaryBuilder


def build_callbacks(cfg: DictConfig | None, parts: RunParts) -> RunCallbacks:
    """The step counters and the supervision check, the ``callbacks`` group (each entry
    given its objects, :func:`_wiring`), and the summary builder, which collects from the
    counters, the data module, the module and every callback with summary entries.

    The counters come first: the step metrics log their rates, and the progress bar shows
    them, after the counters have counted the step.
    """
    counters = StepCounters()
    wiring = _wiring(parts, counters)
    configured = []
    for name, entry in (cfg or {}).items():
        if "_target_" not in entry:
            continue
        objects = wiring.get(str(name))
        key = f"callbacks.{name}"
        configured.append(
            hydra.utils.instantiate(entry)
            if objects is None
            else instantiate_checked(entry, key, objects=objects)
        )
    mixture = []
    if getattr(parts.datamodule, "mixture", None):  # what each part of data.mixture trained
        mixture = [MixtureCounts(parts.datamodule.mixed_records)]
    model = parts.model
    summary = SummaryBuilder(
        counters,
        run_report=parts.datamodule if isinstance(parts.datamodule, ReportsRun) else None,
        parameters=model if isinstance(model, CountsParameters) else None,
        compiled=model if isinstance(model, ReportsCompile) else None,
        extras=[c for c in [*mixture, *configured] if isinstance(c, AddsToSummary)],
    )
    check = SupervisionCheck(counters, parts.sizes.max_seq_len)
    return RunCallbacks([counters, check, *mixture, *configured, summary], summary)


def check_world(trainer: pl.Trainer, run: RunContext) -> None:
    """The trainer must count the job's processes as the run context does."""
    if trainer.world_size != run.world_size:
        raise ConfigError(
            f"trainer: the trainer runs {trainer.world_size} processes, the run context was "
            f"built for {run.world_size} (trainer.devices x trainer.num_nodes)"
        )
