"""What the loader yields: model inputs and, beside them, the step's metadata.

Both are ``NamedTuple``s so that Lightning's ``transfer_batch_to_device`` moves the
tensors and passes the integers through (it refuses frozen dataclasses).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.rows import PackedRows, PaddedRows, RowLayout
from odb_lightning.core.window import Step
from odb_lightning.runtime.vlm_batch import (
    has_image_fields,
    image_inputs,
    padded_positions,
    position_rows,
    sample_positions,
)
from odb_lightning.sample import IGNORE_INDEX

CollateFn = Callable[[list[Any]], Any]
"""Turns the list of sample dicts of one step into model inputs."""


class StepMeta(NamedTuple):
    """Metadata of one step on this rank.

    Attributes:
        sample_ids: Dataset indices in the batch, longest first (``()`` for IDLE).
        is_idle: An IDLE step: a harmless dummy batch that keeps ranks in step.
        local_samples: Samples in this rank's batch.
        local_real_tokens: Their total length.
        local_padded_tokens: ``local_samples x longest`` (the budgeted cost); equal to
            the real tokens when groups are packed padding-free.
        local_loss_tokens: Supervised tokens (shifted ``labels != -100``) in the batch.
        global_samples: Samples at this step position over all ranks.
        global_loss_tokens: Supervised tokens at this step position over all ranks (the
            denominator of the token-weighted loss); ``None`` where no alignment exchange
            told it (planned modes), and the loss then sums local counts over ranks.
        round_index: Alignment round that emitted the step.
        step: Index of the step within the epoch (equal on every rank).
        epoch: Epoch number.
        sample_lengths: Each sample's length, in ``sample_ids`` order (the step's
            model FLOPs: attention grows with each sample's own length).
        step_max_cost: The step's cost on its slowest rank (the budget's cost model;
            ``None`` where no alignment exchange told it).
        step_cost_sum: The step's cost summed over the ranks (``None`` likewise).
        local_useful_cost: The cost of this rank's samples each on its own.
    """

    sample_ids: tuple[int, ...]
    is_idle: bool
    local_samples: int
    local_real_tokens: int
    local_padded_tokens: int
    local_loss_tokens: int
    global_samples: int
    global_loss_tokens: int | None
    round_index: int
    step: int
    epoch: int
    sample_lengths: tuple[int, ...] = ()
    step_max_cost: int | None = None
    step_cost_sum: int | None = None
    local_useful_cost: int | None = None


class ODBBatch(NamedTuple):
    """One step: ``inputs`` for the model and ``meta`` beside them.

    ``inputs`` is what the collate function returned: with the default
    :func:`pad_collate`, ``input_ids``, ``attention_mask`` and ``labels``; with
    :func:`pack_collate` (``odb_packed``), one row of ``input_ids``, ``labels`` and
    ``position_ids`` plus ``cu_seqlens`` and the integer ``max_seqlen``.
    """

    inputs: dict[str, torch.Tensor | int]
    meta: StepMeta


def pin_batch(inputs: dict[str, torch.Tensor | int]) -> dict[str, torch.Tensor | int]:
    """``inputs`` with every tensor in page-locked host memory, so that the transfer to the
    GPU (Lightning's, ``non_blocking``) runs asynchronously with the step before it."""
    return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def pins_memory(config: BatchingConfig) -> bool:
    """Batches are pinned: ``batching.loader.pin_memory`` is set and CUDA is available."""
    return config.loader.pin_memory and torch.cuda.is_available()


def round_up(length: int, multiple: int) -> int:
    """``length`` rounded up to a multiple of ``multiple``."""
    return -(-length // multiple) * multiple


def build_step_meta(
    sample_ids: Sequence[int],
    lengths: Sequence[int],
    num_loss_tokens: int,
    *,
    rows: RowLayout,
    global_samples: int,
    global_loss_tokens: int | None,
    round_index: int,
    step: int,
    epoch: int,
) -> StepMeta:
    """The metadata of one step from its samples' ids, lengths and supervised tokens
    (padded tokens as the collate of the layout ``rows`` pads them)."""
    real = sum(lengths)
    padded = rows.padded_tokens(lengths)
    return StepMeta(
        sample_ids=tuple(sample_ids),
        is_idle=not sample_ids,
        local_samples=len(sample_ids),
        local_real_tokens=real,
        local_padded_tokens=padded,
        local_loss_tokens=num_loss_tokens,
        global_samples=global_samples,
        global_loss_tokens=global_loss_tokens,
        round_index=round_index,
        step=step,
        epoch=epoch,
        sample_lengths=tuple(lengths),
    )


def make_step_meta(step: Step, *, step_index: int, epoch: int, rows: RowLayout) -> StepMeta:
    """The metadata of an aligned core :class:`~odb_lightning.core.window.Step`."""
    members = () if step.group is None else step.group.samples
    return build_step_meta(
        [s.sample_id for s in members],
        [s.length for s in members],
        sum(s.num_loss_tokens for s in members),
        rows=rows,
        global_samples=step.global_samples,
        global_loss_tokens=step.global_loss_tokens,
        round_index=step.round_index,
        step=step_index,
        epoch=epoch,
    )._replace(
        step_max_cost=step.max_cost,
        step_cost_sum=step.cost_sum,
        local_useful_cost=step.useful_cost,
    )


IDLE_ROWS = 2
IDLE_TOKENS = 2
"""Shape of an IDLE batch: ``IDLE_ROWS`` samples of ``IDLE_TOKENS`` pad tokens. Not 1 x 1:
``torch.compile`` specializes a dimension of size 1, and a dummy of that shape would cost
a recompile (and a graph) of its own."""


def idle_sample(pad_id: int, length: int = 1) -> dict[str, torch.Tensor]:
    """A sample of ``length`` pad tokens of which nothing is supervised."""
    return {
        "input_ids": torch.full((length,), pad_id, dtype=torch.long),
        "labels": torch.full((length,), IGNORE_INDEX, dtype=torch.long),
    }


def idle_samples(pad_id: int) -> list[dict[str, torch.Tensor]]:
    """The samples an IDLE batch is collated from (:data:`IDLE_ROWS` x :data:`IDLE_TOKENS`)."""
    return [idle_sample(pad_id, IDLE_TOKENS) for _ in range(IDLE_ROWS)]


def pad_collate(
    samples: Sequence[Mapping[str, torch.Tensor]], pad_id: int = 0, pad_to_multiple_of: int = 1
) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sample of the batch (rounded up to a multiple of
    ``pad_to_multiple_of``).

    Returns:
        ``input_ids`` (padded with ``pad_id``), ``attention_mask`` (1 on real tokens)
        and ``labels`` (``-100`` on padding; ``input_ids`` where a sample has none),
        each a long ``[batch, longest]``. Padding is on the right only, so a causal
        model computes the real tokens' states without the mask
        (:class:`~odb_lightning.lit.model.module.CausalLMModule` leaves it out).
    """
    longest = round_up(max(s["input_ids"].numel() for s in samples), pad_to_multiple_of)
    # int64 whatever the samples hold: a narrower first sample would wrap the others' ids.
    input_ids = torch.full((len(samples), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(samples), longest), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(samples), longest), dtype=torch.long)
    for row, sample in enumerate(samples):
        tokens = sample["input_ids"]
        length = tokens.numel()
        input_ids[row, :length] = tokens
        labels[row, :length] = sample.get("labels", tokens)
        attention_mask[row, :length] = 1
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    if has_image_fields(samples):  # images beside the tokens: runtime/vlm_batch.py
        batch |= image_inputs(samples) | {"position_ids": padded_positions(samples, longest)}
    return batch


def pack_collate(
    samples: Sequence[Mapping[str, torch.Tensor]], pad_to_multiple_of: int = 1, pad_id: int = 0
) -> dict[str, torch.Tensor | int]:
    """Concatenate samples into one padding-free row, for block-diagonal attention.

    Args:
        samples: Non-empty list of samples (1-D ``input_ids``, optional ``labels``).
        pad_to_multiple_of: Round the row up to a multiple of this many tokens with one
            trailing segment of ``pad_id`` tokens: its own sample to the attention (its
            positions restart at 0), supervised nowhere.
        pad_id: The id of that segment's tokens.

    Returns:
        ``input_ids``, ``labels``, ``position_ids``: long ``[1, N]``, ``N`` = the total
        tokens, positions restarting at 0 for every sample; ``cu_seqlens``: int32
        ``[B + 1]`` sample boundaries (``0, L0, L0 + L1, ..., N``) as varlen attention
        kernels take them; ``max_seqlen``: the longest sample, a Python ``int`` (the
        kernels want an int, and Lightning's device transfer leaves ints alone).
        There is no ``attention_mask``: the model builds it from ``cu_seqlens``.
    """
    if not samples:
        raise ValueError("pack_collate needs at least one sample")
    images = image_inputs(samples) if has_image_fields(samples) else {}
    total = sum(s["input_ids"].numel() for s in samples)
    if round_up(total, pad_to_multiple_of) > total:
        samples = [*samples, idle_sample(pad_id, round_up(total, pad_to_multiple_of) - total)]
    lengths = torch.tensor([s["input_ids"].numel() for s in samples])
    input_ids = torch.cat([s["input_ids"].long() for s in samples])
    labels = torch.cat([s.get("labels", s["input_ids"]).long() for s in samples])
    cu_seqlens = torch.zeros(len(samples) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.cumsum(lengths, dim=0)
    starts = cu_seqlens[:-1].long()
    # The loss is shifted: the hidden state at t is scored against labels[t + 1]. At the
    # last token of sample k, t + 1 is the first token of sample k + 1, an unrelated
    # target; masking every sample's first label removes exactly those cross-boundary
    # targets. Nothing else is lost: a first token is never a target in the padded path
    # either (position 0 of a row has no predecessor), so the supervised-token count,
    # sum(labels[1:] != -100) per sample, is the same padded or packed.
    labels[starts] = IGNORE_INDEX
    position_ids = torch.arange(input_ids.numel()) - torch.repeat_interleave(starts, lengths)
    rows = position_ids.unsqueeze(0)
    if images:  # the family's rotary positions, restarting per sample: runtime/vlm_batch.py
        # Each sample's own [R, L] positions, one after the other: [R, 1, N].
        num_rows = position_rows(samples)
        rows = torch.cat([sample_positions(s, num_rows) for s in samples], dim=1).unsqueeze(1)
    return images | {
        "input_ids": input_ids.unsqueeze(0),
        "labels": labels.unsqueeze(0),
        "position_ids": rows,
        "cu_seqlens": cu_seqlens,
        "max_seqlen": int(lengths.max()),
    }


ROW_COLLATES: dict[type[RowLayout], Callable[..., dict[str, Any]]] = {
    PaddedRows: pad_collate,
    PackedRows: pack_collate,
}
"""The collate of each row layout (its rows as tensors)."""


def collate_of(rows: RowLayout, pad_id: int) -> CollateFn:
    """The collate that builds ``rows``' layout, padding with ``pad_id`` to a multiple of
    ``rows.pad_to_multiple_of``."""
    collate = ROW_COLLATES[type(rows)]
    return functools.partial(collate, pad_id=pad_id, pad_to_multiple_of=rows.pad_to_multiple_of)
