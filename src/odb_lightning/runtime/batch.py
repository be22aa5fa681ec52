"""What the loader yields: model inputs and, beside them, the step's metadata.

Both are ``NamedTuple``s so that Lightning's ``transfer_batch_to_device`` moves the
tensors and passes the integers through (it refuses frozen dataclasses).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from odb_lightning.core.window import Step
from odb_lightning.runtime.samples import IGNORE_INDEX

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


class ODBBatch(NamedTuple):
    """One step: ``inputs`` for the model and ``meta`` beside them.

    ``inputs`` is what the collate function returned: with the default
    :func:`pad_collate`, ``input_ids``, ``attention_mask`` and ``labels``.
    """

    inputs: dict[str, torch.Tensor]
    meta: StepMeta


def make_step_meta(step: Step, *, step_index: int, epoch: int, packed: bool) -> StepMeta:
    """The metadata of an aligned core :class:`~odb_lightning.core.window.Step`."""
    group = step.group
    local = (0, 0, 0, 0)
    if group is not None:
        padded = group.num_real_tokens if packed else group.num_padded_tokens
        local = (group.size, group.num_real_tokens, padded, group.num_loss_tokens)
    return StepMeta(
        sample_ids=() if group is None else tuple(s.sample_id for s in group.samples),
        is_idle=group is None,
        local_samples=local[0],
        local_real_tokens=local[1],
        local_padded_tokens=local[2],
        local_loss_tokens=local[3],
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
        each ``[batch, longest]``.
    """
    longest = max(s["input_ids"].numel() for s in samples)
    dtype = samples[0]["input_ids"].dtype
    input_ids = torch.full((len(samples), longest), pad_id, dtype=dtype)
    labels = torch.full((len(samples), longest), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(samples), longest), dtype=torch.long)
    for row, sample in enumerate(samples):
        tokens = sample["input_ids"]
        length = tokens.numel()
        input_ids[row, :length] = tokens
        labels[row, :length] = sample.get("labels", tokens)
        attention_mask[row, :length] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
