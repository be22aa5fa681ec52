"""Evaluation of a checkpoint: the token-weighted loss and perplexity on a data split.

``python eval.py ckpt_path=<run>/checkpoints/last.ckpt`` rebuilds the training run from
the config saved in its checkpoint (the command line's overrides win, as on a resume:
:func:`~odb_lightning.app.run_config.config_for_resume`), loads the weights, and runs the
model's own validation step over ``split`` in one process. The loss is
``sum(token losses) / sum(supervised tokens)`` over the whole split (shifted
``labels != -100``), the figure training logs as ``val/loss``; perplexity is its
exponential. The result is printed and written to ``eval.json`` in the output directory.
A checkpoint is a ``.ckpt`` file or an FSDP2 checkpoint directory (its shards are read
into the one process on CPU); any other path is refused naming what it is.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table
from typing_extensions import override

from odb_lightning.app.checkpoints import load_sharded_weights, resolve_resume_checkpoint
from odb_lightning.app.components import build_parts, launched_accelerator
from odb_lightning.app.run_config import config_for_resume, saved_override_keys
from odb_lightning.app.run_log import full_error_requested, is_user_error, route_library_logs
from odb_lightning.app.validation import ConfigError, validate_config
from odb_lightning.lit.data.evaluation_split import check_split

log = logging.getLogger(__name__)


def main(cfg: DictConfig) -> dict[str, Any]:
    """``eval.py``'s job: :func:`evaluate`; an error whose message says what to change (a
    config error) is logged without a traceback and exits 1 (``HYDRA_FULL_ERROR=1`` raises)."""
    route_library_logs()
    try:
        return evaluate(cfg)
    except Exception as error:
        if is_user_error(error) and not full_error_requested():
            log.error("evaluation failed: %s: %s", type(error).__name__, error)
            raise SystemExit(1) from None
        raise


class SplitCounts(pl.Callback):
    """Samples and supervised tokens the evaluation saw (from each batch's metadata)."""

    def __init__(self) -> None:
        self.samples = self.loss_tokens = 0

    @override
    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int, dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        meta = batch.meta
        if not meta.is_idle:
            self.samples += meta.local_samples
            self.loss_tokens += meta.local_loss_tokens


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Evaluate ``cfg.ckpt_path`` on ``cfg.split``; return (and write) the result."""
    if cfg.get("ckpt_path") is None:
        raise ConfigError("ckpt_path: give the checkpoint to evaluate (ckpt_path=...)")
    split = cfg.get("split", "val")
    try:
        check_split(split)
    except ValueError as error:
        raise ConfigError(f"invalid config 'split': {error}") from None
    ckpt_path = resolve_resume_checkpoint(cfg.ckpt_path)
    output_dir = Path(cfg.paths.output_dir)
    cfg = config_for_resume(cfg, ckpt_path, purpose="evaluating")
    validate_config(cfg)
    # One process: the split is small next to training, and no launcher is needed.
    parts = build_parts(
        cfg,
        world_size=1,
        device=launched_accelerator(cfg.trainer),
        resumed_keys=saved_override_keys(ckpt_path),
    )
    datamodule, model = parts.datamodule, parts.model
    counts = SplitCounts()
    trainer: pl.Trainer = hydra.utils.instantiate(
        cfg.trainer, devices=1, num_nodes=1, strategy="auto", logger=False, callbacks=[counts]
    )
    sharded = Path(ckpt_path).is_dir()
    if sharded:
        # An FSDP2 checkpoint directory: every shard read into the one-process model here
        # (Lightning's single-device strategy reads single files only).
        model.configure_model()
        load_sharded_weights(model, Path(ckpt_path))
    datamodule.setup("validate")
    try:
        try:
            loader = datamodule.evaluation_loader(split)
        except ValueError as error:  # an empty split
            raise ConfigError(f"invalid config 'split': {error}") from None
        (metrics,) = trainer.validate(
            model, dataloaders=loader, ckpt_path=None if sharded else ckpt_path, verbose=False
        )
    finally:
        datamodule.teardown("validate")
    loss = float(metrics["val/loss"])
    result = {
        "ckpt_path": str(ckpt_path),
        "split": split,
        "samples": counts.samples,
        "loss_tokens": counts.loss_tokens,
        "loss": loss,
        "perplexity": math.exp(loss) if loss < 700 else math.inf,
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "eval.json").write_text(json.dumps(result, indent=2))
    print_result(result)
    print(f"eval.json: {output_dir / 'eval.json'}")
    return result


def print_result(result: dict[str, Any], console: Console | None = None) -> None:
    table = Table(title="odb_lightning evaluation", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("checkpoint", result["ckpt_path"])
    table.add_row("split", result["split"])
    table.add_row("samples", f"{result['samples']:,}")
    table.add_row("supervised tokens", f"{result['loss_tokens']:,}")
    table.add_row("loss (token-weighted)", f"{result['loss']:.4f}")
    table.add_row("perplexity", f"{result['perplexity']:.2f}")
    (console or Console()).print(table)
