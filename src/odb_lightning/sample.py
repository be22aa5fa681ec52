"""The sample contract between the data layer and the runtime.

A sample is a mapping with ``input_ids`` (1-D integer tensor of ``L`` tokens) and
optionally ``labels`` (same shape; ``-100`` = not supervised). Labels follow the Hugging
Face convention: the model shifts them, so position ``t`` is scored against
``labels[t + 1]``, position 0 is never a target, and the supervised-token count is
``sum(labels[1:] != -100)``. Without ``labels`` every token but the first is supervised.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

IGNORE_INDEX = -100
"""Label of a position that has no loss."""

Sample = dict[str, torch.Tensor]
"""``{"input_ids": LongTensor[L], "labels": LongTensor[L]}``."""


class BadSampleError(ValueError):
    """A sample the pipeline cannot batch: missing key, wrong dtype or rank, empty, too
    long, or a record its preprocessing rejects. The message names the dataset index and
    the field.

    Attributes:
        index: Dataset index (``None`` while not yet known, e.g. inside the template).
        field: The offending field, e.g. ``"input_ids"`` or ``"messages[1].role"``.
        problem: What is wrong, without the location.
    """

    def __init__(self, index: int | None, field: str, problem: str) -> None:
        where = "sample" if index is None else f"sample {index}"
        super().__init__(f"{where}: field '{field}' {problem}")
        self.index, self.field, self.problem = index, field, problem

    def __reduce__(self) -> tuple[type, tuple[int | None, str, str]]:
        return (type(self), (self.index, self.field, self.problem))

    def at_index(self, index: int) -> BadSampleError:
        """The same error, located at dataset index ``index``."""
        return BadSampleError(index, self.field, self.problem)


class SampleStats(NamedTuple):
    """What batching needs to know about a valid sample."""

    length: int
    num_loss_tokens: int


def supervised_targets(labels: torch.Tensor) -> torch.Tensor:
    """Bool mask ``[..., L - 1]``: position ``t`` has a target (``labels[..., t + 1]``
    is not ``-100``)."""
    return labels[..., 1:] != IGNORE_INDEX


def count_loss_tokens(labels: torch.Tensor | Sequence[int]) -> int:
    """Supervised positions after the causal shift: the denominator of the loss."""
    return int(supervised_targets(torch.as_tensor(labels)).sum())


def _check_token_tensor(value: object, index: int, field: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        problem = f"must be a torch.Tensor of token ids, got {type(value).__name__}"
        raise BadSampleError(index, field, problem)
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise BadSampleError(index, field, f"must have an integer dtype, got {value.dtype}")
    if value.dim() != 1:
        raise BadSampleError(index, field, f"must be 1-D, got shape {tuple(value.shape)}")
    return value


def inspect_sample(sample: object, index: int, max_seq_len: int | None) -> SampleStats:
    """Validate a sample and measure it: the one check every sample passes.

    Args:
        sample: What ``dataset[index]`` returned.
        index: Its dataset index (named in every error).
        max_seq_len: Longest allowed ``input_ids``; ``None`` for no limit.

    Raises:
        BadSampleError: Naming the index and the field at fault.
    """
    if not isinstance(sample, Mapping):
        problem = f"must be a mapping with 'input_ids', got {type(sample).__name__}"
        raise BadSampleError(index, "<sample>", problem)
    if "input_ids" not in sample:
        raise BadSampleError(index, "input_ids", f"is missing (keys: {sorted(sample)})")
    input_ids = _check_token_tensor(sample["input_ids"], index, "input_ids")
    length = input_ids.numel()
    if length == 0:
        raise BadSampleError(index, "input_ids", "is empty")
    if max_seq_len is not None and length > max_seq_len:
        problem = f"has {length} tokens, more than max_seq_len={max_seq_len}"
        raise BadSampleError(index, "input_ids", problem)
    if int(input_ids.min()) < 0:
        raise BadSampleError(index, "input_ids", "contains negative token ids")
    if "labels" not in sample:
        return SampleStats(length, length - 1)
    labels = _check_token_tensor(sample["labels"], index, "labels")
    if labels.shape != input_ids.shape:
        problem = f"has shape {tuple(labels.shape)}, 'input_ids' has {tuple(input_ids.shape)}"
        raise BadSampleError(index, "labels", problem)
    # Anything below 0 but -100 would index the vocabulary from the end (or crash the loss).
    if bool(((labels < 0) & (labels != IGNORE_INDEX)).any()):
        problem = f"contains negative values other than {IGNORE_INDEX} (no loss)"
        raise BadSampleError(index, "labels", problem)
    return SampleStats(length, count_loss_tokens(labels))
