"""Memory safety: run the worst-case step shapes the settings allow before training, so that
a token budget that does not fit fails at step 0 with a budget that would, not hours in on
the epoch's worst batch; and ``batching.token_budget=auto``, the largest budget that fits.

The worst cases of a budget ``B`` (:func:`worst_case_shapes`): one sample of ``max_seq_len``
tokens (the longest row and its attention), the largest group of the shortest samples
(most rows), and in ``odb_packed`` one full packed row of ``B`` tokens (its block mask is
``B x B`` under sdpa and eager). Each runs forward and backward with every target
supervised (the LM head's worst case); the gradients are then dropped, so training starts
from the same state as without the check.

Memory is read by a :class:`MemoryProbe`: on CUDA the caching allocator's peak
(``torch.cuda.max_memory_allocated``) against the device's total memory; on CPU, where no
allocator reports a peak, :class:`SavedTensorsProbe` counts the parameters, gradients and
the activations autograd saves for backward (what grows with the budget), against a
capacity the caller states. Optimizer state that does not exist yet (AdamW allocates its
two moments at the first step) is added as an estimate.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Protocol

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from typing_extensions import override

from odb_lightning.core.config import TOKEN_BUDGET_AUTO, BatchingConfig

log = logging.getLogger(__name__)

ALLOCATOR_ENV = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE_SEGMENTS = "expandable_segments:True"
GIB = 1024**3
BUDGET_QUANTUM = 256
"""``token_budget=auto`` and the suggested budgets are multiples of this many tokens."""


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


def format_bytes(size: float) -> str:
    """``1.25 GiB``, or MiB below a GiB."""
    if size >= GIB:
        return f"{size / GIB:.2f} GiB"
    return f"{size / 1024**2:.1f} MiB"


class MemoryBudgetError(RuntimeError):
    """The settings' worst-case step does not fit the device's memory."""


@dataclass(frozen=True, slots=True)
class StepShape:
    """One warm-up batch: ``rows`` right-padded rows of ``tokens`` tokens, or one packed row."""

    name: str
    rows: int
    tokens: int
    packed: bool = False

    @property
    def total_tokens(self) -> int:
        return self.rows * self.tokens


def worst_case_shapes(config: BatchingConfig, max_seq_len: int) -> list[StepShape]:
    """The largest steps ``config`` can emit (see the module docstring)."""
    budget = config.budget
    longest = budget.padded_length(max_seq_len)
    shortest = budget.padded_length(2)  # the shortest sample with a target
    if config.rows.packs:
        row = max(longest, budget.padded_length(config.token_budget))
        return [StepShape("one full packed row", 1, row, packed=True)]
    rows = budget.max_group_size(2)
    if config.policy.batch_cap is not None:
        rows = min(rows, config.policy.batch_cap)
    shapes = [StepShape(f"one sample of max_seq_len={max_seq_len}", 1, longest)]
    full = budget.max_group_size(max_seq_len)
    if full > 1:
        shapes.append(StepShape("a full group of max_seq_len samples", full, longest))
    shapes.append(StepShape("the largest group of the shortest samples", rows, shortest))
    return shapes


def warmup_batch(shape: StepShape, vocab_size: int, device: torch.device) -> dict[str, Any]:
    """Inputs of one warm-up step: random ids, every target supervised."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (shape.rows, shape.tokens), generator=generator)
    inputs: dict[str, Any] = {"input_ids": ids.to(device), "labels": ids.clone().to(device)}
    if shape.packed:
        inputs["position_ids"] = torch.arange(shape.tokens, device=device)[None]
        inputs["cu_seqlens"] = torch.tensor([0, shape.tokens], dtype=torch.int32, device=device)
        inputs["max_seqlen"] = shape.tokens
    return inputs


class MemoryProbe(Protocol):
    """Reads a step's peak memory and the memory there is."""

    def capacity_bytes(self) -> int: ...

    def measure(self) -> Any:
        """A context manager around one step; its result's ``peak_bytes`` after it."""
        ...


class CudaMemoryProbe:
    """The CUDA caching allocator's peak against the device's total memory."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def capacity_bytes(self) -> int:
        return int(torch.cuda.mem_get_info(self.device)[1])

    @contextmanager
    def measure(self) -> Iterator[_Peak]:
        peak = _Peak()
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        yield peak
        torch.cuda.synchronize(self.device)
        peak.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))


class SavedTensorsProbe:
    """CPU: parameters and gradients plus the tensors autograd saves for backward during
    the step's forward (each storage counted once), against ``capacity_bytes``."""

    def __init__(self, module: nn.Module, capacity_bytes: int) -> None:
        self.module, self._capacity = module, capacity_bytes

    def capacity_bytes(self) -> int:
        return self._capacity

    @contextmanager
    def measure(self) -> Iterator[_Peak]:
        peak, storages = _Peak(), {}

        def pack(tensor: Tensor) -> Tensor:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield peak
        params = [p for p in self.module.parameters()]
        weights = sum(p.numel() * p.element_size() for p in params)
        grads = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
        peak.peak_bytes = weights + grads + sum(storages.values())


@dataclass
class _Peak:
    peak_bytes: int = 0


@dataclass(frozen=True, slots=True)
class ShapeMeasurement:
    shape: StepShape
    peak_bytes: int


@dataclass(frozen=True, slots=True)
class WarmupReport:
    """What the warm-up measured: the budget checked, every shape's peak (optimizer state
    included), the capacity and the margin kept free."""

    token_budget: int
    measurements: tuple[ShapeMeasurement, ...]
    capacity_bytes: int
    margin: float
    resolved_auto: bool = False

    @property
    def peak_bytes(self) -> int:
        return max(m.peak_bytes for m in self.measurements)

    def as_dict(self) -> dict[str, Any]:
        return {
            "token_budget": self.token_budget,
            "token_budget_auto": self.resolved_auto,
            "peak_gib": round(self.peak_bytes / GIB, 3),
            "capacity_gib": round(self.capacity_bytes / GIB, 3),
            "margin": self.margin,
            "shapes": {m.shape.name: round(m.peak_bytes / GIB, 3) for m in self.measurements},
        }


def optimizer_state_bytes(module: nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """AdamW's two moments of every trainable parameter, where the optimizer has not
    allocated them yet (0 once it has)."""
    if optimizer is None or len(optimizer.state) > 0:
        return 0
    trainable = [p for p in module.parameters() if p.requires_grad]
    return 2 * sum(_local_numel(p) * p.element_size() for p in trainable)


def _local_numel(param: Tensor) -> int:
    """Elements this rank holds (a DTensor's local shard under FSDP2)."""
    local = getattr(param, "to_local", None)
    return local().numel() if callable(local) else param.numel()


def run_shape(
    module: pl.LightningModule,
    shape: StepShape,
    probe: MemoryProbe,
    vocab_size: int,
    no_sync: Any = nullcontext,
) -> int:
    """Forward and backward of one warm-up batch; its peak bytes. Gradients are dropped."""
    inputs = warmup_batch(shape, vocab_size, module.device)
    try:
        with no_sync(), probe.measure() as peak:
            loss_sum, _ = module(inputs)
            loss_sum.backward()
    finally:
        for param in module.parameters():
            param.grad = None
    return peak.peak_bytes


def check_fits(report: WarmupReport) -> None:
    """Raise naming the budget, the binding shape and a budget that would fit."""
    usable = report.capacity_bytes * (1 - report.margin)
    worst = max(report.measurements, key=lambda m: m.peak_bytes)
    if worst.peak_bytes <= usable:
        return
    raise MemoryBudgetError(
        f"batching.token_budget={report.token_budget} does not fit: {worst.shape.name} "
        f"({worst.shape.rows} x {worst.shape.tokens} tokens) peaks at "
        f"{format_bytes(worst.peak_bytes)} of {format_bytes(report.capacity_bytes)} "
        f"({report.margin:.0%} kept free). {suggestion(report)}"
    )


def suggestion(report: WarmupReport) -> str:
    """A budget that would fit, from the measured peaks (linear in the step's tokens)."""
    fitting = fitting_budget(report)
    if fitting is None:
        return (
            "Even a small budget would not fit: lower data.max_seq_len, set "
            "model.runtime.activation_checkpointing=true, or shard the model (trainer=gpu8_fsdp)."
        )
    return (
        f"batching.token_budget={fitting} would fit (or "
        "model.runtime.activation_checkpointing=true, or batching.token_budget=auto)."
    )


def fitting_budget(report: WarmupReport) -> int | None:
    """The largest budget (a multiple of :data:`BUDGET_QUANTUM`) at which every
    budget-sized shape's extrapolated peak fits, or ``None``.

    Each shape's peak is ``static + per_token x tokens``; ``static`` (weights, gradients,
    optimizer state) is the peak of the smallest shape measured less its share.
    """
    usable = report.capacity_bytes * (1 - report.margin)
    scaling = [m for m in report.measurements if m.shape.total_tokens > 0]
    smallest = min(scaling, key=lambda m: m.shape.total_tokens)
    worst = max(scaling, key=lambda m: m.peak_bytes)
    tokens = worst.shape.total_tokens
    if tokens == smallest.shape.total_tokens:
        static = 0.0
    else:
        slope = (worst.peak_bytes - smallest.peak_bytes) / (tokens - smallest.shape.total_tokens)
        static = max(0.0, smallest.peak_bytes - slope * smallest.shape.total_tokens)
    per_token = (worst.peak_bytes - static) / tokens
    if per_token <= 0:
        return None
    budget = math.floor((usable - static) / per_token * report.token_budget / tokens)
    budget = budget // BUDGET_QUANTUM * BUDGET_QUANTUM
    return budget if budget >= BUDGET_QUANTUM else None


class MemoryWarmup(pl.Callback):
    """Runs the worst-case shapes at fit start (every rank alike) and fails at step 0 when
    they do not fit; resolves ``batching.token_budget=auto``.

    Args:
        enabled: ``auto``: on CUDA only (on CPU nothing is measured unless
            ``capacity_gib`` is given); ``true``; ``false``.
        margin: Fraction of the device's memory kept free (fragmentation, the allocator's
            rounding, memory the measured step does not show).
        capacity_gib: The memory to fit into, instead of the device's total (a smaller
            share of a GPU, or the CPU check).
    """

    def __init__(
        self, enabled: bool | str = "auto", margin: float = 0.1, capacity_gib: float | None = None
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
        self.enabled, self.margin, self.capacity_gib = enabled, float(margin), capacity_gib
        self.report: WarmupReport | None = None

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        datamodule = trainer.datamodule
        config: BatchingConfig | None = getattr(datamodule, "batching", None)
        if config is None:
            return
        auto = config.token_budget == TOKEN_BUDGET_AUTO
        probe = self._probe(pl_module)
        if probe is None:
            if auto:
                raise MemoryBudgetError(
                    "batching.token_budget=auto measures the device's memory: it needs a "
                    "CUDA device (or callbacks.memory_warmup.capacity_gib); set an integer"
                )
            return
        max_seq_len = int(datamodule.max_seq_len)
        vocab = _vocab_size(pl_module)
        no_sync = getattr(trainer.strategy.model, "no_sync", nullcontext)
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        extra = optimizer_state_bytes(pl_module, optimizer)
        was_training = pl_module.training
        pl_module.train()
        try:
            if auto:
                config = self._resolve_auto(
                    trainer, pl_module, config, probe, vocab, no_sync, extra
                )
                datamodule.batching = config
            report = self._measure(pl_module, config, max_seq_len, probe, vocab, no_sync, extra)
        finally:
            pl_module.train(was_training)
        self.report = replace(report, resolved_auto=auto)
        log.info("memory warm-up: %s", self.report.as_dict())
        check_fits(self.report)

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
            return _CappedProbe(probe, int(self.capacity_gib * GIB))
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
        probe: MemoryProbe,
        vocab: int,
        no_sync: Any,
        extra: int,
    ) -> WarmupReport:
        measurements = []
        for shape in worst_case_shapes(config, max_seq_len):
            try:
                peak = run_shape(module, shape, probe, vocab, no_sync) + extra
            except torch.OutOfMemoryError as error:
                torch.cuda.empty_cache()
                raise MemoryBudgetError(
                    f"batching.token_budget={config.token_budget} does not fit: "
                    f"{shape.name} ({shape.rows} x {shape.tokens} tokens) ran out of memory "
                    f"at the warm-up step ({error}). Lower batching.token_budget (or use "
                    "batching.token_budget=auto), set "
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
        probe: MemoryProbe,
        vocab: int,
        no_sync: Any,
        extra: int,
    ) -> BatchingConfig:
        """The largest budget whose worst cases fit, agreed by every rank (their minimum).

        Two measured budgets give each shape's line; the extrapolated budget is checked and
        lowered by 10 % until it fits (at most five tries)."""
        max_seq_len = int(trainer.datamodule.max_seq_len)
        probe_budget = max(2 * max_seq_len, 4 * BUDGET_QUANTUM)
        candidate = replace(config, token_budget=probe_budget)
        report = self._measure(module, candidate, max_seq_len, probe, vocab, no_sync, extra)
        budget = fitting_budget(report)
        for _ in range(5):
            if budget is None or budget < max_seq_len:
                raise MemoryBudgetError(
                    f"batching.token_budget=auto: not even one sample of data.max_seq_len="
                    f"{max_seq_len} tokens fits with {self.margin:.0%} of "
                    f"{format_bytes(probe.capacity_bytes())} kept free: lower "
                    "data.max_seq_len, set model.runtime.activation_checkpointing=true, or "
                    "shard the model (trainer=gpu8_fsdp)"
                )
            candidate = replace(config, token_budget=budget)
            report = self._measure(module, candidate, max_seq_len, probe, vocab, no_sync, extra)
            usable = report.capacity_bytes * (1 - self.margin)
            if report.peak_bytes <= usable:
                break
            budget = int(budget * 0.9) // BUDGET_QUANTUM * BUDGET_QUANTUM
        agreed = int(
            trainer.strategy.reduce(torch.tensor(budget, device=module.device), reduce_op="min")
        )
        log.info("batching.token_budget=auto resolved to %d tokens", agreed)
        return replace(config, token_budget=agreed)


class _CappedProbe:
    """A CUDA probe measured against a stated capacity instead of the device's total."""

    def __init__(self, inner: CudaMemoryProbe, capacity: int) -> None:
        self.inner, self._capacity = inner, capacity

    def capacity_bytes(self) -> int:
        return self._capacity

    def measure(self) -> Any:
        return self.inner.measure()


def _vocab_size(module: nn.Module) -> int:
    config = getattr(getattr(module, "model", None), "config", None)
    vocab = getattr(config, "vocab_size", None)
    if not vocab:
        raise TypeError(f"{type(module).__name__} has no model.config.vocab_size to draw ids from")
    return int(vocab)
