"""Memory safety: run the worst-case step shapes the settings allow before training, so that
a token budget that does not fit fails at step 0 with a budget that would, not hours in on
the epoch's worst batch; and ``batching.token_budget=auto``, the largest budget that fits.

What is run and how its memory is read is :mod:`odb_lightning.lit.memory.probe`; what
the peaks say against the capacity, and the errors, :mod:`odb_lightning.lit.memory.report`;
this module runs the check at fit start, extrapolates a budget that fits, and hands a
resolved ``auto`` budget to whoever applies it (the data module, wired by the app).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

from odb_lightning.core.budget import BUDGET_QUANTUM
from odb_lightning.core.config import TOKEN_BUDGET_AUTO, BatchingConfig
from odb_lightning.core.rows import ImageExtent, LengthRange
from odb_lightning.lit.memory.probe import (
    GIB,
    CappedProbe,
    CudaMemoryProbe,
    MemoryProbe,
    SavedTensorsProbe,
    optimizer_state_bytes,
    run_shape,
    worst_case_shapes,
)
from odb_lightning.lit.memory.report import (
    MemoryBudgetError,
    ShapeMeasurement,
    WarmupReport,
    auto_refusal,
    check_fits,
    fitting_budget,
    format_bytes,
)

log = logging.getLogger(__name__)

ALLOCATOR_ENV = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE_SEGMENTS = "expandable_segments:True"


def enable_expandable_segments(environ: dict[str, str] | None = None) -> bool:
    """Turn on the CUDA caching allocator's expandable segments unless the user configured
    the allocator (``PYTORCH_CUDA_ALLOC_CONF``). Batch shapes change every step under ODB,
    and fixed-size segments fragment: memory is reserved but unusable for the next shape.
    Must run before the first CUDA allocation. Returns whether it set the variable."""
    env = os.environ if environ is None else environ
    if ALLOCATOR_ENV in env:
        return False
    env[ALLOCATOR_ENV] = EXPANDABLE_SEGMENTS
    return True


class MemoryWarmup(pl.Callback):
    """Runs the worst-case shapes at fit start (every rank alike) and fails at step 0 when
    they do not fit; resolves ``batching.token_budget=auto`` and hands the budget to
    ``apply_token_budget``.

    Args:
        enabled: ``auto``: on CUDA only (on CPU nothing is measured unless
            ``capacity_gib`` is given); ``true``; ``false``. ``token_budget=auto`` is
            resolved on CUDA only and refused elsewhere (:func:`auto_refusal`).
        margin: Fraction of the device's memory kept free (fragmentation, the allocator's
            rounding, memory the measured step does not show).
        capacity_gib: The memory to fit into, instead of the device's total (a smaller
            share of a GPU, or the CPU check).
        batching: The run's batching config, whose steps are measured (the app hands it).
        max_seq_len: The run's ``data.sizes.max_seq_len``.
        vocab_size: Rows of the model's input embedding: the warm-up draws ids below it.
        apply_token_budget: Takes the budget ``auto`` resolved to (the data module's
            :meth:`~odb_lightning.lit.data.datamodule.ODBDataModule.apply_token_budget`);
            required with ``token_budget=auto``.
        length_range: The shortest and longest training sample where the data module's
            length pass measured them (its
            :meth:`~odb_lightning.lit.data.datamodule.ODBDataModule.length_range`, read at fit
            start): the planned modes' steps are checked at the lengths the run has.
        largest_image: The largest image of an image-text run (the data module's
            :meth:`~odb_lightning.lit.data.vlm_datamodule.VisionDataModule.largest_image`):
            its steps are checked too (:func:`~odb_lightning.lit.memory.probe.image_shapes`).
        auto_ceiling: The most ``auto`` may resolve to (token-target steps' group cap,
            :func:`~odb_lightning.lit.model.token_target.batching_for_steps`); ``None``:
            what fits.
    """

    def __init__(
        self,
        enabled: bool | str = "auto",
        margin: float = 0.1,
        capacity_gib: float | None = None,
        *,
        batching: BatchingConfig,
        max_seq_len: int,
        vocab_size: int | None = None,
        apply_token_budget: Callable[[int], None] | None = None,
        length_range: Callable[[], LengthRange | None] | None = None,
        largest_image: Callable[[], ImageExtent | None] | None = None,
        auto_ceiling: int | None = None,
    ) -> None:
        if enabled not in (True, False, "auto"):
            raise ValueError(f"memory_warmup.enabled must be true, false or auto, got {enabled!r}")
        if not (isinstance(margin, int | float) and 0 <= margin < 1):
            raise ValueError(f"memory_warmup.margin must be in [0, 1), got {margin!r}")
        if capacity_gib is not None and not (
            isinstance(capacity_gib, int | float) and capacity_gib > 0
        ):
            raise ValueError(
                "memory_warmup.capacity_gib must be a positive number or null, "
                f"got {capacity_gib!r}"
            )
        if batching.token_budget == TOKEN_BUDGET_AUTO and apply_token_budget is None:
            raise ValueError(
                "memory_warmup resolves batching.token_budget=auto: it needs the data "
                "module's apply_token_budget to hand the budget on"
            )
        self.enabled, self.margin, self.capacity_gib = enabled, float(margin), capacity_gib
        self.batching, self.max_seq_len, self.vocab_size = batching, max_seq_len, vocab_size
        self.apply_token_budget, self.length_range = apply_token_budget, length_range
        self.largest_image, self.auto_ceiling = largest_image, auto_ceiling
        self.report: WarmupReport | None = None

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        config, max_seq_len = self.batching, self.max_seq_len
        auto = config.token_budget == TOKEN_BUDGET_AUTO
        probe = self._probe(pl_module)
        if auto and (probe is None or not probe.measures_peak):
            raise MemoryBudgetError(auto_refusal(pl_module.device, self.enabled))
        if probe is None:
            return
        vocab = self._vocab(pl_module)
        # The wrapper's own no_sync (DDP, FSDP): the warm-up backward reduces nothing.
        wrapped = trainer.strategy.model
        no_sync = getattr(wrapped, "no_sync", nullcontext)
        # Backward as training runs it: through the strategy's precision plugin (a mixed
        # precision loss scaler), not the callbacks' hooks.
        precision = trainer.strategy.precision_plugin

        def backward(loss: torch.Tensor) -> None:
            precision.backward(loss, pl_module, None)

        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        extra = optimizer_state_bytes(pl_module, optimizer)
        lengths = self.length_range() if self.length_range is not None else None
        image = self.largest_image() if self.largest_image is not None else None
        measure = partial(
            self._measure,
            pl_module,
            lengths=lengths,
            image=image,
            probe=probe,
            vocab=vocab,
            no_sync=no_sync,
            backward=backward,
            extra=extra,
        )
        was_training = pl_module.training
        pl_module.train()
        try:
            if auto:
                budget = self._resolve_auto(trainer, pl_module, config, max_seq_len, measure)
                config = replace(config, token_budget=budget)
                self.apply_token_budget(budget)  # type: ignore[misc]  # checked at init
            report = measure(config, max_seq_len)
        finally:
            pl_module.train(was_training)
        self.report = replace(report, resolved_auto=auto)
        log.info("memory warm-up: %s", self.report.as_dict())
        check_fits(self.report)

    def _vocab(self, module: pl.LightningModule) -> int:
        if not self.vocab_size:
            raise TypeError(
                f"{type(module).__name__} states no input vocabulary (vocab_size) to draw "
                "warm-up ids from"
            )
        return int(self.vocab_size)

    def summary_entries(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """``memory_warmup`` in ``summary.json``: the budget checked, peaks and capacity."""
        return {} if self.report is None else {"memory_warmup": self.report.as_dict()}

    def _probe(self, module: pl.LightningModule) -> MemoryProbe | None:
        if self.enabled is False:
            return None
        device = module.device
        if device.type == "cuda":
            probe = CudaMemoryProbe(device)
            if self.capacity_gib is None:
                return probe
            return CappedProbe(probe, int(self.capacity_gib * GIB))
        if self.capacity_gib is not None:
            return SavedTensorsProbe(module, int(self.capacity_gib * GIB))
        if self.enabled is True:
            raise ValueError(
                "memory_warmup.enabled=true on a CPU needs memory_warmup.capacity_gib "
                "(no allocator reports a peak there)"
            )
        return None

    def _measure(
        self,
        module: pl.LightningModule,
        config: BatchingConfig,
        max_seq_len: int,
        *,
        lengths: LengthRange | None,
        image: ImageExtent | None,
        probe: MemoryProbe,
        vocab: int,
        no_sync: Any,
        backward: Callable[[torch.Tensor], None],
        extra: int,
    ) -> WarmupReport:
        measurements = []
        for shape in worst_case_shapes(config, max_seq_len, lengths, image):
            try:
                peak = run_shape(module, shape, probe, vocab, no_sync, backward) + extra
            except torch.OutOfMemoryError as error:
                torch.cuda.empty_cache()
                raise MemoryBudgetError(
                    f"batching.token_budget={config.token_budget} does not fit: "
                    f"{shape.name} ({shape.rows} x {shape.tokens} tokens) ran out of memory "
                    f"at the warm-up step ({error}). Lower batching.token_budget (or use "
                    "batching.token_budget=auto on CUDA), set "
                    "model.runtime.activation_checkpointing=true, or shard the model "
                    "(trainer=gpu8_fsdp)"
                ) from error
            measurements.append(ShapeMeasurement(shape, peak))
        return WarmupReport(
            config.token_budget, tuple(measurements), probe.capacity_bytes(), self.margin
        )

    def _resolve_auto(
        self,
        trainer: pl.Trainer,
        module: pl.LightningModule,
        config: BatchingConfig,
        max_seq_len: int,
        measure: Callable[[BatchingConfig, int], WarmupReport],
    ) -> int:
        """The largest budget whose worst cases fit, agreed by every rank (their minimum).

        Two measured budgets give each shape's line; the extrapolated budget is checked and
        lowered by 10 % until it fits (at most five tries)."""
        probe_budget = max(2 * max_seq_len, 4 * BUDGET_QUANTUM)
        report = measure(replace(config, token_budget=probe_budget), max_seq_len)
        budget = fitting_budget(report)
        for _ in range(5):
            if budget is None or budget < max_seq_len:
                raise MemoryBudgetError(
                    f"batching.token_budget=auto: not even one sample of data.sizes.max_seq_len="
                    f"{max_seq_len} tokens fits with {self.margin:.0%} of "
                    f"{format_bytes(report.capacity_bytes)} kept free: lower "
                    "data.sizes.max_seq_len, set model.runtime.activation_checkpointing=true, or "
                    "shard the model (trainer=gpu8_fsdp)"
                )
            report = measure(replace(config, token_budget=budget), max_seq_len)
            usable = report.capacity_bytes * (1 - self.margin)
            if report.peak_bytes <= usable:
                break
            budget = int(budget * 0.9) // BUDGET_QUANTUM * BUDGET_QUANTUM
        agreed = int(
            trainer.strategy.reduce(torch.tensor(budget, device=module.device), reduce_op="min")
        )
        if self.auto_ceiling is not None and agreed > self.auto_ceiling:
            log.info(
                "batching.token_budget=auto resolved to %d tokens, the token-target steps' "
                "cap (%d fit)",
                self.auto_ceiling,
                agreed,
            )
            return self.auto_ceiling
        log.info("batching.token_budget=auto resolved to %d tokens", agreed)
        return agreed
