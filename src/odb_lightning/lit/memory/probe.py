"""Measuring one warm-up step: the worst-case step shapes of a batching config, their
inputs, and the probes that read a step's peak memory.

The worst cases of a budget ``B`` (:func:`worst_case_shapes`) are the row layout's
(:meth:`~odb_lightning.core.rows.RowLayout.worst_case_shapes`): one sample of
``max_seq_len`` tokens (the longest row and its attention), a full group of them, the
group with the most tokens, the largest group of the shortest samples (most rows), or,
where a group is one row, one full row of ``B`` tokens; at the run's shortest and
longest sample where a length pass measured them; and, in an image-text run, the
largest image's steps (:func:`image_shapes`). Each runs forward and backward with every
target supervised (the LM head's worst case); the gradients are then dropped, so
training starts from the same state as without the check.

Memory is read by a :class:`MemoryProbe`: on CUDA the caching allocator's peak
(``torch.cuda.max_memory_allocated``) against the device's total memory; on CPU, where no
allocator reports a peak, :class:`SavedTensorsProbe` counts the parameters, gradients and
the activations autograd saves for backward (what grows with the budget), against a
capacity the caller states. Optimizer state that does not exist yet (AdamW allocates its
two moments at the first step) is added as an estimate (:func:`optimizer_state_bytes`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.rows import ImageExtent, LengthRange, PackedRows, StepShape
from odb_lightning.lit.model.attention_inputs import warmup_batch

GIB = 1024**3


def image_shapes(config: BatchingConfig, max_seq_len: int, image: ImageExtent) -> list[StepShape]:
    """The largest image steps of an image-text run: one ``max_seq_len`` sample with the
    largest image, and the most largest images one step holds (the token budget, the
    patch budget ``rows.max_patches`` and the batch cap all bound it), each row as long
    as that many rows allow. Fixed-size modes: ``batch_size`` such samples. A packed row
    of images is not measured (its layout is text only here)."""
    if isinstance(config.rows, PackedRows):
        return []
    budget, policy = config.budget, config.policy
    length = image.tokens + 4  # <|vision_start|>, the image, <|vision_end|>, 2 text tokens
    if length > max_seq_len:
        return []  # no sample holds it whole
    longest = budget.padded_length(max_seq_len)
    name = f"of max_seq_len={max_seq_len} with the largest image {image.grid}"
    if policy.fixed_size:
        rows = policy.batch_size  # type: ignore[attr-defined]
        return [
            StepShape(f"batch_size={rows} samples {name}", rows, longest, image_grid=image.grid)
        ]
    rows = budget.max_group_size(length)
    if policy.batch_cap is not None:
        rows = min(rows, policy.batch_cap)
    patch_budget = config.rows.patch_budget
    if patch_budget is not None:
        per_image = patch_budget.sample_cost(image.patches, image.patches**2)
        rows = min(rows, max(1, int(patch_budget.max_patches // per_image)))
    widest = max(n for n in range(length, max_seq_len + 1) if budget.max_group_size(n) >= rows)
    shapes = [StepShape(f"one sample {name}", 1, longest, image_grid=image.grid)]
    shapes.append(
        StepShape(
            f"the most largest images one step holds ({rows}, {rows * image.patches} patches)",
            rows,
            budget.padded_length(widest),
            image_grid=image.grid,
        )
    )
    return shapes


def worst_case_shapes(
    config: BatchingConfig,
    max_seq_len: int,
    lengths: LengthRange | None = None,
    largest_image: ImageExtent | None = None,
) -> list[StepShape]:
    """The largest steps ``config`` can emit: its row layout's under the budget (see the
    module docstring), or, in a fixed-size mode, ``batch_size`` samples of
    ``max_seq_len`` tokens whatever the budget. ``lengths``: the run's shortest and
    longest training sample where a length pass measured them (``sorted``, ``bucketed``,
    ``oracle``), whose plans form no step beyond the same bound at those lengths.
    ``largest_image``: an image-text run's largest image, whose steps
    (:func:`image_shapes`) are checked too."""
    policy = config.policy
    if policy.fixed_size:
        batch_size = policy.batch_size  # type: ignore[attr-defined]
        text = config.rows.fixed_size_shapes(config.budget, max_seq_len, batch_size, lengths)
    else:
        text = config.rows.worst_case_shapes(config.budget, max_seq_len, policy.batch_cap, lengths)
    if largest_image is None:
        return text
    return text + image_shapes(config, max_seq_len, largest_image)


class MemoryProbe(Protocol):
    """Reads a step's peak memory and the memory there is.

    ``measures_peak``: whether the reading is the step's true peak (an allocator's), which
    ``token_budget=auto`` needs to extrapolate from, or a lower bound (the CPU estimate)."""

    measures_peak: bool

    def capacity_bytes(self) -> int: ...

    def measure(self) -> Any:
        """A context manager around one step; its result's ``peak_bytes`` after it."""
        ...


class CudaMemoryProbe:
    """The CUDA caching allocator's peak against the device's total memory."""

    measures_peak = True

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
    the step's forward (each storage counted once), against ``capacity_bytes``: a lower
    bound (the step's temporaries, the allocator's caching and the process itself are not
    counted), so it checks a budget but resolves none."""

    measures_peak = False

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
    backward: Callable[[Tensor], None] = Tensor.backward,
) -> int:
    """Forward and backward of one warm-up batch; its peak bytes. Gradients are dropped.

    ``backward``: how training runs backward (the trainer's precision plugin: a loss
    scaler), so the warm-up allocates what a training step does."""
    make_inputs = getattr(module, "warmup_inputs", None)  # a module's own (image rows)
    if make_inputs is not None:
        inputs = make_inputs(shape, vocab_size)
    else:
        inputs = warmup_batch(shape, vocab_size, module.device)
    try:
        with no_sync(), probe.measure() as peak:
            loss_sum, _ = module(inputs)
            backward(loss_sum)
    finally:
        for param in module.parameters():
            param.grad = None
    return peak.peak_bytes


class CappedProbe:
    """A CUDA probe measured against a stated capacity instead of the device's total."""

    measures_peak = True

    def __init__(self, inner: CudaMemoryProbe, capacity: int) -> None:
        self.inner, self._capacity = inner, capacity

    def capacity_bytes(self) -> int:
        return self._capacity

    def measure(self) -> Any:
        return self.inner.measure()
