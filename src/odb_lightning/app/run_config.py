"""The run's configuration inside its checkpoints, and the configuration of a resume.

Every checkpoint holds the config of the run that wrote it under :data:`RUN_CONFIG_KEY`:
the composed config as written (interpolations kept, so that paths follow the resumed
run's directory), the same resolved (the record), and the command line's overrides.

A resume (``ckpt_path=...``) starts from the checkpoint's config, and what its own command
line sets wins (:func:`merge_resume_config`): the keys its ``key=value`` overrides name,
every key a group override (``experiment=...``, ``model=...``) changes from the config
composed without overrides, and the whole node of an overridden group that has one
(``trainer=cpu`` resumes a DDP run in one process, though ``cpu`` is the default).
``paths`` are always this run's, and keys the checkpoint's config lacks come from this
run. So ``python train.py ckpt_path=<run>/checkpoints/last.ckpt`` resumes the run as it
was started, and ``trainer.max_epochs=3`` on that line still trains longer. A command
line that changes the model's shapes fails at load naming the key (:func:`shape_conflict`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from typing_extensions import override

from odb_lightning.app.checkpoints import DISTRIBUTED_METADATA_FILENAME

log = logging.getLogger(__name__)

RUN_CONFIG_KEY = "odb_run_config"
"""Checkpoint entry: ``{"config", "resolved", "overrides"}``."""

ALWAYS_THIS_RUN = ("paths",)
"""Config groups a resume never takes from the checkpoint (where this run writes)."""

ENTRIES_OF_THE_RUN = ("logger", "callbacks")
"""Groups of instantiated entries: an entry the checkpoint's config lacks is not added
from this run's defaults (a CSV-only run resumes without a W&B logger), unless the
command line sets it."""


class ResumeConfigError(ValueError):
    """The resume's command line conflicts with the checkpoint; the message names the key."""


class RunConfigCheckpoint(pl.Callback):
    """Puts the run's config into every checkpoint it saves.

    Args:
        cfg: The run's config (the job config: no ``hydra`` node).
        overrides: The command line's overrides (Hydra's ``overrides.task``).
    """

    def __init__(self, cfg: DictConfig, overrides: Iterable[str] = ()) -> None:
        self.entry = {
            "config": OmegaConf.to_container(cfg, resolve=False),
            "resolved": OmegaConf.to_container(cfg, resolve=True),
            "overrides": list(overrides),
        }

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint[RUN_CONFIG_KEY] = self.entry


def _checkpoint_entries(ckpt_path: str | Path) -> dict[str, Any]:
    """The checkpoint's dict (a sharded directory's ``meta.pt``: all but the tensors),
    memory-mapped; empty when there is no such file (Lightning reports that)."""
    path = Path(ckpt_path)
    source = path / DISTRIBUTED_METADATA_FILENAME if path.is_dir() else path
    if not source.is_file():
        return {}
    checkpoint = torch.load(source, map_location="cpu", weights_only=True, mmap=True)
    return checkpoint if isinstance(checkpoint, dict) else {}


def saved_run_config(ckpt_path: str | Path) -> dict[str, Any] | None:
    """The run config stored in a checkpoint file or sharded checkpoint directory, or
    ``None`` when the checkpoint has none (written before configs were stored) or does
    not exist (Lightning reports that)."""
    return _checkpoint_entries(ckpt_path).get(RUN_CONFIG_KEY)


def override_key(override: str) -> str:
    """The config key a Hydra override sets (``a.b=1``, ``+a.b=1``, ``~a.b``: ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~")


def saved_override_keys(ckpt_path: str | Path) -> frozenset[str]:
    """The keys the checkpointed run's own command line set (empty without a stored
    config): what its user chose, which a resume keeps choosing where the run would
    otherwise resolve a value of its own."""
    saved = saved_run_config(ckpt_path)
    return frozenset(override_key(o) for o in (saved or {}).get("overrides", ()))


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": value}`` for every leaf of nested dicts (lists and empty dicts are leaves)."""
    if isinstance(node, dict) and node:
        found: dict[str, Any] = {}
        for key, value in node.items():
            found.update(leaves(value, f"{prefix}{key}."))
        return found
    return {prefix.removesuffix("."): node}


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`leaves`."""
    root: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, name = key.split(".")
        node = root
        for parent in parents:
            node = node.setdefault(parent, {})
        node[name] = value
    return root


def _under(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(f"{prefix}.")


def command_line_keys(
    overrides: Iterable[str],
    groups: Iterable[str],
    current: dict[str, Any],
    baseline: Callable[[], dict[str, Any]],
) -> tuple[set[str], set[str]]:
    """The leaf keys of ``current`` that the command line sets, and the keys it deletes.

    Args:
        overrides: The command line's overrides.
        groups: Names of the config groups (Hydra's ``runtime.choices``).
        current: Leaves of the config this command line composed.
        baseline: Leaves of the config composed without overrides (called only when a
            group is overridden).
    """
    groups = set(groups)
    set_keys: set[str] = set()
    deleted: set[str] = set()
    group_override = False
    for item in OverridesParser.create().parse_overrides(list(overrides)):
        key = item.key_or_group
        if key in groups or key == "hydra" or key.startswith(("hydra.", "hydra/")):
            group_override = group_override or key in groups
            continue
        if item.is_delete():
            deleted.add(key)
        else:
            set_keys.update(k for k in current if _under(k, key))
    if group_override:
        base = baseline()
        set_keys.update(k for k, v in current.items() if k not in base or base[k] != v)
    return set_keys, deleted


def replaced_groups(
    overrides: Iterable[str], groups: Iterable[str], current: dict[str, Any]
) -> set[str]:
    """The overridden groups whose node is in ``current`` (``trainer=cpu``: ``trainer``;
    ``experiment=...``, a global package, has none): the resume takes them whole."""
    groups = set(groups)
    named = {
        item.key_or_group
        for item in OverridesParser.create().parse_overrides(list(overrides))
        if item.key_or_group in groups
    }
    return {g for g in named if any(_under(k, g) for k in current)}


def merge_resume_config(
    saved: dict[str, Any],
    current: dict[str, Any],
    set_keys: set[str],
    deleted: set[str],
    replaced: Iterable[str] = (),
) -> tuple[dict[str, Any], list[str]]:
    """The resume's config: ``saved`` (the checkpoint's, unresolved), with ``current``'s
    value for every key in ``set_keys``, under :data:`ALWAYS_THIS_RUN`, under a group in
    ``replaced`` (whose saved keys are dropped first), or missing from ``saved`` (outside
    :data:`ENTRIES_OF_THE_RUN`); keys in ``deleted`` removed. A node whose ``_target_``
    this run sets to another class is taken whole from ``current`` (one policy's keys are
    no arguments of another's). Returns it nested, and the keys this run set that differ
    from the checkpoint's."""
    merged = leaves(saved)
    before = dict(merged)
    retargeted = {
        key.removesuffix("._target_")
        for key, value in current.items()
        if key.endswith("._target_") and key in set_keys and before.get(key, value) != value
    }
    replaced = set(replaced) | retargeted
    for key in [k for k in merged if any(_under(k, g) for g in replaced)]:
        del merged[key]
    set_keys = set_keys | {k for k in current if any(_under(k, g) for g in replaced)}
    changed = [k for k in before if k not in merged and k not in current]  # dropped
    for key, value in current.items():
        group = key.split(".")[0]
        missing = key not in merged and group not in ENTRIES_OF_THE_RUN
        if not (missing or key in set_keys or group in ALWAYS_THIS_RUN):
            continue
        if key in before and before[key] != value and group not in ALWAYS_THIS_RUN:
            changed.append(key)
        # A leaf replaces a subtree and the other way round (``callbacks.x: null``).
        for other in [k for k in merged if _under(k, key) or _under(key, k)]:
            del merged[other]
        merged[key] = value
    for key in deleted:
        for other in [k for k in merged if _under(k, key)]:
            del merged[other]
    return nest(merged), sorted(changed)


def shape_conflict(
    ckpt_path: str, saved: dict[str, Any] | None, resolved: dict[str, Any], error: Exception
) -> ResumeConfigError:
    """The error of a checkpoint whose weights do not fit the model this run built,
    naming the ``model`` keys in which this run's config differs from the checkpoint's."""
    detail = next(
        (line.strip() for line in str(error).splitlines() if "size mismatch" in line),
        str(error).splitlines()[0],
    )
    if saved is None:
        return ResumeConfigError(
            f"ckpt_path={ckpt_path}: the checkpoint's weights do not fit this run's model "
            f"({detail}), and the checkpoint holds no run config: repeat the original "
            "run's overrides (its .hydra/overrides.yaml) on the resume command line"
        )
    before, now = (
        leaves(saved["resolved"].get("model", {}), "model."),
        leaves(resolved.get("model", {}), "model."),
    )
    differ = [k for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
    keys = "; ".join(
        f"{k}={now.get(k)!r} here, {before.get(k)!r} in the checkpoint" for k in differ
    )
    return ResumeConfigError(
        f"ckpt_path={ckpt_path}: the checkpoint's weights do not fit this run's model "
        f"({detail}): {keys or 'no model key differs from the checkpoint config'}. Drop "
        "these overrides from the resume command line, or start a new run without ckpt_path"
    )


def _composed_without_overrides() -> dict[str, Any]:
    config_name = HydraConfig.get().job.config_name
    return leaves(OmegaConf.to_container(compose(config_name=config_name), resolve=False))


def config_for_resume(cfg: DictConfig, ckpt_path: str, purpose: str = "resuming") -> DictConfig:
    """The config a resume from ``ckpt_path`` runs with (see the module docstring);
    ``cfg`` itself when the checkpoint holds no config (a logged warning). ``purpose`` names
    what the config is for in the log ("resuming", or "evaluating" for ``eval.py``)."""
    entries = _checkpoint_entries(ckpt_path)
    saved = entries.get(RUN_CONFIG_KEY)
    if saved is None:
        log.warning(
            "%s holds no run config: %s with this command line's config only", ckpt_path, purpose
        )
        return cfg
    overrides: list[str] = []
    groups: list[str] = []
    if HydraConfig.initialized():
        overrides = list(HydraConfig.get().overrides.task)
        groups = list(HydraConfig.get().runtime.choices)
    current = leaves(OmegaConf.to_container(cfg, resolve=False))
    set_keys, deleted = command_line_keys(overrides, groups, current, _composed_without_overrides)
    replaced = replaced_groups(overrides, groups, current)
    merged, changed = merge_resume_config(saved["config"], current, set_keys, deleted, replaced)
    log.info(
        "%s with the config saved in %s (its overrides: %s); this command line changes %s",
        purpose,
        ckpt_path,
        " ".join(saved["overrides"]) or "none",
        ", ".join(k for k in changed if k != "ckpt_path") or "nothing else",
    )
    resumed = OmegaConf.create(merged)
    max_steps = OmegaConf.select(resumed, "trainer.max_steps", default=None)
    step = entries.get("global_step", 0)
    if purpose == "resuming" and isinstance(max_steps, int) and 0 < max_steps <= step:
        log.warning(
            "the checkpoint is at step %d and trainer.max_steps=%d (the run's own): nothing "
            "is left to train; set trainer.max_steps (-1: no limit) or trainer.max_epochs on "
            "the resume command line to train further",
            step,
            max_steps,
        )
    return resumed
