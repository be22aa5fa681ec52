"""``odb-check``: the config and the first records of each source, checked in seconds.

``odb-check [--records N] [train.py overrides ...]`` composes ``conf/train.yaml`` with the
overrides ``train.py`` takes, builds every configuration object (``batching``,
``data.source``, ``data.sizes``, ``data.caches``, ``stop``, the model's concerns) and the
relations between groups (:func:`~odb_lightning.app.validation.validate_config`), then
reads the first N records of each source (default :data:`DEFAULT_RECORDS`) through the
same reader training uses, which names a bad record by file, line and field. It prints
one line per check and the first record of each source, and exits 0, or 1 with the
message alone.

``train.py`` runs the same checks first (:func:`check_run`), so its config and data
errors also come in seconds. Everything before the model's own checks imports neither
torch, Lightning nor transformers: the model's concerns are checked last
(:func:`check_model_config`), ``model.architecture`` against the model types
``transformers`` knows, which loads torch. ``odb-preview`` shows the
samples after the chat template and truncation, which needs the tokenizer.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from odb_lightning.app.run_dir import lightning_rank
from odb_lightning.app.validation import (
    ConfigError,
    DataCheckError,
    instantiate_checked,
    validate_config,
)
from odb_lightning.data.config import check_streaming_settings, mixture_parts
from odb_lightning.data.conversation import BadRecordError
from odb_lightning.data.sources.table import SourceKind, SourceRequest

log = logging.getLogger("odb_lightning.run")

DEFAULT_RECORDS = 8
"""Records of each source read by the check (the first ones, in the file's order)."""


CHECK_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    DataCheckError,
    BadRecordError,
    OmegaConfBaseException,
    HydraException,
)
"""What the checks raise when the config or the data is wrong: the message says what to
change (reported without a traceback)."""


CONFIG_NODES = (
    ("batching", "batching"),
    ("data.source", "data.source"),
    ("data.sizes", "data.sizes"),
    ("data.caches", "data.caches"),
    ("data.images", "data.images"),
    ("stop", "stop"),
)
"""The configuration nodes built without torch: ``(key, what the errors call it)``."""

MODEL_NODES = ("architecture", "finetuning", "runtime", "step", "vision")
"""The model's concerns, checked last (``model.architecture`` asks ``transformers``)."""


def check_config(cfg: DictConfig) -> dict[str, Any]:
    """Build the configuration objects of ``cfg`` that need no torch (:data:`CONFIG_NODES`)
    and check the relations between groups
    (:func:`~odb_lightning.app.validation.validate_config`).

    Returns:
        The built objects by key (``batching``, ``data.source``, ...).

    Raises:
        ConfigError: The message names the key and what is wrong.
    """
    built: dict[str, Any] = {}
    for key, name in CONFIG_NODES:
        node = _select(cfg, key)
        if node is not None:
            built[key] = instantiate_checked(node, name)
    validate_config(cfg)
    if (cfg.get("data") or {}).get("streaming") is True and "data.source" in built:
        caches = built.get("data.caches")
        stream_dir = None if caches is None else caches.stream_dir
        try:  # the stream's own rules (its engine is the data module's to check)
            check_streaming_settings(
                built["data.source"], built["data.sizes"], built["batching"], stream_dir
            )
        except ValueError as error:
            raise ConfigError(f"invalid config 'data.streaming': {error}") from error
    return built


def check_model_config(cfg: DictConfig) -> dict[str, Any]:
    """Build the model's configuration objects (:data:`MODEL_NODES`); ``model.architecture``
    checks its model type against ``transformers``, which loads torch.

    Raises:
        ConfigError: The message names the key and what is wrong.
    """
    model = cfg.get("model") or {}
    return {
        f"model.{concern}": instantiate_checked(model[concern], f"model.{concern}")
        for concern in MODEL_NODES
        if model.get(concern) is not None and "_target_" in model[concern]
    }


def _select(cfg: DictConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = node.get(part) if node is not None else None
    return node if node is not None and "_target_" in node else None


@dataclass(frozen=True)
class SourceCheck:
    """What the check read of one source.

    Attributes:
        key: The config key of the source (``data.source``).
        name: The source's name in the source table.
        path: The path it read (``None``: a bundled source).
        records: The first records read.
        layout: The record layout the reader found (``""``: the source has one layout).
        dropped: Records dropped as bad among those read (``on_bad_sample=skip``).
        note: Why no record was read (token samples, a set written at the first run).
    """

    key: str
    name: str
    path: str | None
    records: list[Any]
    layout: str = ""
    dropped: int = 0
    note: str = ""


def check_records(cfg: DictConfig, num_records: int = DEFAULT_RECORDS) -> list[SourceCheck]:
    """Read the first ``num_records`` records of each source of ``cfg`` (no record table,
    no tokenizer) through the reader training uses.

    Raises:
        BadRecordError: A record that fits no layout, named by file, line and field.
        DataCheckError: The source could not be read (a missing file, the hub
            unreachable); the message says which and why.
    """
    source = instantiate_checked(cfg.data.source, "data.source")
    loader = (cfg.get("batching") or {}).get("loader") or {}
    on_bad, seed = str(loader.get("on_bad_sample", "raise")), int(cfg.get("seed", 0))
    mixture = cfg.data.get("mixture")
    if not mixture:
        return [_read_first(source, "data.source", num_records, on_bad, seed)]
    try:  # each part of data.mixture read as its source alone would be
        entries = OmegaConf.to_container(mixture, resolve=True)
        _, sources = mixture_parts(entries, source, (SourceKind.CHAT,))  # type: ignore[arg-type]
    except ValueError as error:
        raise ConfigError(f"invalid config 'data.mixture': {error}") from None
    return [
        _read_first(part, f"data.mixture[{k}]", num_records, on_bad, seed)
        for k, part in enumerate(sources)
    ]


def _read_first(source: Any, key: str, num: int, on_bad: str, seed: int) -> SourceCheck:
    entry = source.entry
    if entry.kind is SourceKind.TOKENS:
        note = "token samples drawn from a length profile: no records to read"
        return SourceCheck(key, source.name, None, [], note=note)
    if entry.image_file is not None and source.path is None:
        note = "a bundled image-text set, written at the first run"
        return SourceCheck(key, source.name, None, [], note=note)
    mapping = None if source.mapping is None else source.mapping.as_json()
    request = SourceRequest(
        source.path, source.regime, num, seed, on_bad, None, source.format, mapping
    )
    try:
        read = entry.records(request, None)
    except (BadRecordError, DataCheckError):
        raise
    except (OSError, ValueError, ImportError) as error:
        message = str(error).replace("data.source.", f"{key}.")
        if not message.startswith(key):  # the reader's message names no key: name it
            where = f"{key}.path={source.path}" if source.path else f"{key}.name={source.name}"
            message = f"{where}: {message}"
        raise DataCheckError(message) from error
    records = list(read.records[:num])
    dropped = sum(n for k, n in read.counts.items() if k.startswith("dropped/"))
    return SourceCheck(key, source.name, source.path, records, read.detected, dropped)


def record_line(record: Any, width: int = 100) -> str:
    """One record in a line: its id and each turn as ``role: text``, cut to ``width``."""
    if isinstance(record, dict) and isinstance(record.get("messages"), list):
        turns = " | ".join(f"{m.get('role')}: {m.get('content')}" for m in record["messages"])
        text = f"{record.get('id')!r}  {turns}"
    else:
        text = repr(record)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def source_line(check: SourceCheck) -> str:
    """What the check says of one source."""
    where = f"{check.key} {check.name}" + (f" ({check.path})" if check.path else "")
    if check.note:
        return f"{where}: {check.note}"
    layout = f", layout {check.layout}" if check.layout else ""
    dropped = f", {check.dropped} dropped as bad (on_bad_sample=skip)" if check.dropped else ""
    return f"{where}: the first {len(check.records)} records read and valid{layout}{dropped}"


def check_run(cfg: DictConfig) -> None:
    """``train.py``'s first step: :func:`check_config` and :func:`check_records` before
    torch, Lightning and transformers load. A config or data error ends the run here as
    ``train.py`` ends a failed run (the message without a traceback, ``failed.json`` in
    the run directory, exit status 1; ``HYDRA_FULL_ERROR=1`` and a multirun raise it).
    A resume (``ckpt_path``) is checked by the run, which takes the checkpoint's config.
    """
    if cfg.get("ckpt_path") is not None:
        return
    try:
        check_config(cfg)
        check_records(cfg)
        check_model_config(cfg)
    except CHECK_ERRORS as error:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        from odb_lightning.app.run_log import full_error_requested, record_failure

        multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
        record_failure(error, Path(cfg.paths.output_dir), lightning_rank())
        if full_error_requested() or multirun:
            raise
        raise SystemExit(1) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="odb-check",
        description="Check the config and the first records of each source in seconds, "
        "before torch loads: the overrides are train.py's.",
        epilog="example: odb-check data=jsonl data.source.path=my_chats.jsonl debug=smoke",
    )
    parser.add_argument(
        "--records",
        type=int,
        default=DEFAULT_RECORDS,
        help=f"records of each source to read and check (default {DEFAULT_RECORDS})",
    )
    parser.add_argument("overrides", nargs="*", help="train.py overrides (key=value ...)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    args = build_parser().parse_args(argv)
    if args.records < 1:
        print("odb-check: --records must be >= 1", file=sys.stderr)
        return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from odb_lightning.app.preview import PreviewError, compose_train_config
    from odb_lightning.app.run_log import explained

    try:
        cfg = compose_train_config(args.overrides, stream_as_table=False)
        check_config(cfg)
        print(f"config: ok ({config_line(cfg)})")
        for check in check_records(cfg, args.records):
            print(source_line(check))
            if check.records:
                print(f"  first record: {record_line(check.records[0])}")
        model = check_model_config(cfg)
        print(f"model: ok ({', '.join(model)})")
    except (*CHECK_ERRORS, PreviewError) as error:
        print(f"odb-check: {type(error).__name__}: {explained(error)}", file=sys.stderr)
        return 1
    overrides = " ".join(args.overrides)
    print(
        f"checked in {time.perf_counter() - started:.1f} s. The samples as the model gets "
        f"them (template, truncation, supervised tokens): odb-preview {overrides}".rstrip()
    )
    return 0


def config_line(cfg: DictConfig) -> str:
    """The run's main choices in a line: the batching mode and its budget, the data
    source, ``max_seq_len`` and the model."""
    from hydra.core.hydra_config import HydraConfig

    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    parts = [
        f"batching={choices.get('batching', '?')}",
        f"token_budget={cfg.batching.get('token_budget')}",
        f"data={choices.get('data', '?')}",
        f"max_seq_len={cfg.data.sizes.max_seq_len}",
        f"model={choices.get('model', '?')}",
    ]
    if choices.get("debug"):
        parts.append(f"debug={choices['debug']}")
    return ", ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
