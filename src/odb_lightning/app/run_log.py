"""The run's log and its failures: every message of the run in ``<run dir>/train.log``,
the run directory announced, and a failed run marked with ``failed.json``.

Hydra configures logging (a console handler and ``<run dir>/<job name>.log``) only when
the job starts, after ``train.py`` has imported Lightning. ``lightning.pytorch`` and
``lightning.fabric`` look at the root logger when they are imported: with no handler
there yet, each adds a console handler of its own and stops propagating, so none of
Lightning's messages, and nothing of an error, ever reached the log file (``lightning``
adds a console handler too, and ``transformers`` one that does not propagate).
:func:`route_library_logs` hands them back to the root logger's handlers.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import traceback
import warnings
from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from odb_lightning.app.validation import ConfigError, DataCheckError
from odb_lightning.data.conversation import BadRecordError
from odb_lightning.lit.run_files import RunFileLinkError, write_run_file
from odb_lightning.sample import BadSampleError

log = logging.getLogger("odb_lightning.run")
# Only the log file (conf/train.yaml): the traceback of a failure, the summary table.
_file_log = logging.getLogger("odb_lightning.run.file_only")

LIBRARY_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "transformers")


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors whose message says what to change: reported without a traceback (it still
    goes to ``train.log``; ``HYDRA_FULL_ERROR=1`` raises them as they are). Imported here
    when asked: their modules load torch and Lightning, which the checks before the run
    (:mod:`odb_lightning.app.check`) do not."""
    from odb_lightning.app.checkpoints import NoValidCheckpointError
    from odb_lightning.app.run_config import ResumeConfigError
    from odb_lightning.app.run_dir import RunDirError
    from odb_lightning.core.handshake import SettingsMismatchError
    from odb_lightning.data.record_table import RecordTableError
    from odb_lightning.data.stream import StreamError
    from odb_lightning.lit.callbacks.run_report import NoSupervisedTokensError
    from odb_lightning.lit.memory.report import MemoryBudgetError
    from odb_lightning.runtime.errors import MetadataChannelError

    return (
        ConfigError,
        DataCheckError,
        RunDirError,
        MetadataChannelError,
        NoValidCheckpointError,
        ResumeConfigError,
        NoSupervisedTokensError,
        SettingsMismatchError,
        BadRecordError,
        BadSampleError,
        MemoryBudgetError,
        RunFileLinkError,
        RecordTableError,
        StreamError,
        OmegaConfBaseException,
        HydraException,
    )


FAILED_MARKER = "failed.json"
"""Written into the run directory of a run that raised (``failed_rank<r>.json`` by the
processes of ranks > 0)."""


UNACTIONABLE_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (
        Warning,
        r"The `srun` command is available on your system but is not used",
        "Lightning, on any machine with SLURM's tools: a run outside a SLURM job is meant so "
        "(docs/multinode.md says how to launch under srun)",
    ),
    (
        Warning,
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        "torch's deprecation of a call inside Lightning's own code",
    ),
    (
        FutureWarning,
        r"`is_gradient_checkpointing` is deprecated",
        "transformers' deprecation of an attribute peft reads",
    ),
    (
        UserWarning,
        r"DTensor random operators may not have complete support on cpu device mesh",
        "torch, for FSDP2 on CPU: the model is built from a seed before it is sharded",
    ),
    (
        Warning,
        r"Total length of `list` across ranks is zero",
        "Lightning, for a run without validation (data.sizes.val_samples=0): its empty list",
    ),
    (
        Warning,
        r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint",
        "Lightning, in eval.py: the training callbacks' state is not needed to evaluate",
    ),
)
"""Library warnings a user of ``train.py`` and ``eval.py`` cannot act on: ``(category,
message pattern, where it comes from and why it is not theirs)``, filtered by
:func:`quiet_console` (``tests/unit/app/test_quiet_console.py`` emits each)."""

LIGHTNING_TIPS = "💡 Tip:"
"""How Lightning's advertisements start (litlogger, litmodels): logged as information on
every run, about products this project does not use."""


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(LIGHTNING_TIPS)


def quiet_console() -> None:
    """Filter :data:`UNACTIONABLE_WARNINGS` and Lightning's tips where they are emitted
    (this process and the processes it starts after this call)."""
    for category, pattern, _ in UNACTIONABLE_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropTips) for f in rank_zero.filters):
        rank_zero.addFilter(_DropTips())


def route_library_logs() -> None:
    """Let Lightning's loggers and Python warnings reach the handlers Hydra configured
    (console and ``train.log``), less what the user cannot act on
    (:func:`quiet_console`). Routing is a no-op when the root logger has no handler."""
    quiet_console()
    if not logging.getLogger().handlers:
        return
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler:  # the one added at import
                logger.removeHandler(handler)
        logger.propagate = True
    logging.captureWarnings(True)


def failed_marker(output_dir: Path, rank: int) -> Path:
    """Where the process of ``rank`` marks its run as failed."""
    return output_dir / (FAILED_MARKER if rank == 0 else f"failed_rank{rank}.json")


def full_error_requested() -> bool:
    """``HYDRA_FULL_ERROR=1``: errors are raised as they are, with every frame."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def record_failure(error: BaseException, output_dir: Path, rank: int | None = None) -> Path:
    """Log ``error`` (its message, with the presets that set the keys it names, to every
    handler; its traceback to the log file only) and write the failed marker of ``rank``
    (``None``: Lightning's rank of this process); returns the marker's path."""
    if rank is None:
        from lightning.fabric.utilities.rank_zero import rank_zero_only

        rank = rank_zero_only.rank
    marker = failed_marker(output_dir, rank)
    log.error("run failed: %s: %s", type(error).__name__, explained(error))
    _file_log.error("".join(traceback.format_exception(error)).rstrip())
    log.error("log: %s; run directory marked failed: %s", output_dir / "train.log", marker)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_run_file(
        marker,
        json.dumps({"error": type(error).__name__, "message": str(error), "rank": rank}, indent=2)
        + "\n",
    )
    return marker


def log_summary_table(summary: dict[str, Any]) -> None:
    """The end-of-run table (printed on the console) into the log file too."""
    from rich.console import Console

    from odb_lightning.lit.callbacks.summary_table import print_summary

    console = Console(record=True, file=io.StringIO(), width=100)
    print_summary(summary, console)
    _file_log.info("run summary\n%s", console.export_text().rstrip())


def is_user_error(error: BaseException) -> bool:
    """Whether ``error``'s message alone tells the user what to change."""
    return isinstance(error, user_errors())


PRESET_GROUPS = {"debug": "", "experiment": "", "debug_batching": "batching."}
"""The config groups whose options set keys of other groups (``@package _global_``
presets), with the package each option is placed in."""

_KEY = re.compile(r"\b((?:data|batching|model|trainer|stop|callbacks)(?:\.[A-Za-z_][\w]*)+)")
"""A config key as messages spell it (``data.sizes.max_seq_len``)."""


def preset_origins(message: str) -> list[str]:
    """For each key ``message`` names whose value a preset chose (the command line did
    not set it): ``key=value is set by group=option``. Empty outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    hydra_cfg = HydraConfig.get()
    given = {o.split("=", 1)[0].lstrip("+~") for o in hydra_cfg.overrides.task}
    sources = {s.provider: s.path for s in hydra_cfg.runtime.config_sources}
    conf_dir = Path(str(sources.get("main", "")).removeprefix("file://"))
    origins: list[str] = []
    for key in dict.fromkeys(_KEY.findall(message)):
        if key in given:
            continue
        origin = _preset_setting(key, hydra_cfg.runtime.choices, conf_dir)
        if origin is not None:
            origins.append(origin)
    return origins


def _preset_setting(key: str, choices: Any, conf_dir: Path) -> str | None:
    for group, package in PRESET_GROUPS.items():
        option = choices.get(group)
        preset = conf_dir / group / f"{option}.yaml"
        if not option or not key.startswith(package) or not preset.is_file():
            continue
        value = OmegaConf.select(OmegaConf.load(preset), key.removeprefix(package))
        if value is not None and not OmegaConf.is_config(value):
            return f"{key}={value} is set by {group}={option}"
    return None


def explained(error: BaseException) -> str:
    """``error``'s message, followed by the presets that set the keys it names, so the
    user knows which value to override (``debug=smoke``'s ``data.sizes.max_seq_len``)."""
    origins = preset_origins(str(error))
    if not origins:
        return str(error)
    return f"{error} ({'; '.join(origins)}: override it on the command line)"
