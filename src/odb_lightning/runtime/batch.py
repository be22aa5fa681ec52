"""What the loader yields: model inputs and, beside them, the step's metadata.

Both are ``NamedTuple``s so that Lightning's ``transfer_batch_to_device`` moves the
tensors and passes the integers through (it refuses frozen dataclasses).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from odb_lightning.core.window import Step
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


class ODBBatch(NamedTuple):
    """One step: ``inputs`` for the model and ``meta`` beside them.

    ``inputs`` is what the collate function returned: with the default
    :func:`pad_collate`, ``input_ids``, ``attention_mask`` and ``labels``; with
    :func:`pack_collate` (``odb_packed``), one row of ``input_ids``, ``labels`` and
    ``position_ids`` plus ``cu_seqlens`` and the integer ``max_seqlen``.
    """

    inputs: dict[str, torch.Tensor | int]
    meta: StepMeta


def build_step_meta(
    sample_ids: Sequence[int],
    lengths: Sequence[int],
    num_loss_tokens: int,
    *,
    packed: bool,
    global_samples: int,
    global_loss_tokens: int | None,
    round_index: int,
    step: int,
    epoch: int,
) -> StepMeta:
    """The metadata of one step from its samples' ids, lengths and supervised tokens."""
    real = sum(lengths)
    return StepMeta(
        sample_ids=tuple(sample_ids),
        is_idle=not sample_ids,
        local_samples=len(sample_ids),
        local_real_tokens=real,
        local_padded_tokens=real if packed else len(lengths) * max(lengths, default=0),
        local_loss_tokens=num_loss_tokens,
        global_samples=global_samples,
        global_loss_tokens=global_loss_tokens,
        round_index=round_index,
        step=step,
        epoch=epoch,
        sample_lengths=tuple(lengths),
    )


def make_step_meta(step: Step, *, step_index: int, epoch: int, packed: bool) -> StepMeta:
    """The metadata of an aligned core :class:`~odb_lightning.core.window.Step`."""
    members = () if step.group is None else step.group.samples
    return build_step_meta(
        [s.sample_id for s in members],
        [s.length for s in members],
        sum(s.num_loss_tokens for s in members),
        packed=packed,
        global_samples=step.global_samples,
        global_loss_tokens=step.global_loss_tokens,
        round_index=step.round_index,
        step=step_index,
        epoch=epoch,
    )


def idle_sample(pad_id: int) -> dict[str, torch.Tensor]:
    """The one-token sample an IDLE batch is collated from: nothing is supervised."""
    return {
        "input_ids": torch.tensor([pad_id], dtype=torch.long),
        "labels": torch.tensor([IGNORE_INDEX], dtype=torch.long),
    }


def pad_collate(
    samples: Sequence[Mapping[str, torch.Tensor]], pad_id: int = 0
) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sample of the batch.

    Returns:
        ``input_ids`` (padded with ``pad_id``), ``attention_mask`` (1 on real tokens)
        and ``labels`` (``-100`` on padding; ``input_ids`` where a sample has none),
        each a long ``[batch, longest]``.
    """
    longest = max(s["input_ids"].numel() for s in samples)
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
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def pack_collate(samples: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor | int]:
    """Concatenate samples into one padding-free row, for block-diagonal attention.

    Args:
        samples: Non-empty list of samples (1-D ``input_ids``, optional ``labels``).

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
    return {
        "input_ids": input_ids.unsqueeze(0),
        "labels": labels.unsqueeze(0),
        "position_ids": position_ids.unsqueeze(0),
        "cu_seqlens": cu_seqlens,
        "max_seqlen": int(lengths.max()),
    }
