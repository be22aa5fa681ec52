"""What the memory warm-up found and what it says: each shape's peak against the
capacity (:class:`WarmupReport`), the error that stops a budget that does not fit, naming
one that would (:func:`check_fits`, :func:`fitting_budget`), and why
``batching.token_budget=auto`` cannot be resolved where it is refused
(:func:`auto_refusal`). The callback that measures is :mod:`odb_lightning.lit.memory.warmup`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from odb_lightning.core.budget import BUDGET_QUANTUM
from odb_lightning.lit.memory.probe import GIB, StepShape


def format_bytes(size: float) -> str:
    """``1.25 GiB``, or MiB below a GiB."""
    if size >= GIB:
        return f"{size / GIB:.2f} GiB"
    return f"{size / 1024**2:.1f} MiB"


class MemoryBudgetError(RuntimeError):
    """The settings' worst-case step does not fit the device's memory."""


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
            "Even a small budget would not fit: lower data.sizes.max_seq_len, set "
            "model.runtime.activation_checkpointing=true, or shard the model (trainer=gpu8_fsdp)."
        )
    return (
        f"batching.token_budget={fitting} would fit (or "
        "model.runtime.activation_checkpointing=true, or batching.token_budget=auto on CUDA)."
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


def auto_refusal(device: torch.device, enabled: bool | str) -> str:
    """Why ``batching.token_budget=auto`` cannot be resolved on ``device``."""
    if device.type == "cuda":
        return (
            f"batching.token_budget=auto measures the GPU's memory at fit start, which "
            f"callbacks.memory_warmup.enabled={enabled} turns off: set it to auto or true, "
            "or set an integer batching.token_budget"
        )
    return (
        f"batching.token_budget=auto is refused on {device.type}: it extrapolates the "
        "largest budget from measured step peaks, and only a CUDA allocator reports one. The "
        "CPU check (callbacks.memory_warmup.capacity_gib) counts weights, gradients and the "
        "tensors autograd saves, a lower bound that leaves out the step's temporaries, so a "
        "budget resolved from it need not fit. Set an integer batching.token_budget (odb-plan "
        "--budget compares budgets on your data)"
    )
