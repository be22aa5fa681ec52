"""The sample contract, and the check every sample passes before the grouping window.

A sample is a dict with a 1-D integer ``input_ids`` tensor and, optionally, a ``labels``
tensor of the same shape (``-100`` = no loss). Without ``labels`` every next token is a
target, as in plain language-model training.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

IGNORE_INDEX = -100

Sample = dict[str, torch.Tensor]
"""``{"input_ids": LongTensor[L], "labels": LongTensor[L]}``, what the datasets here return."""


class BadSampleError(ValueError):
    """A sample the pipeline cannot batch.

    Attributes:
        index: Dataset index of the sample (``None`` until known, e.g. inside the template).
        field: The offending field, e.g. ``"input_ids"`` or ``"messages[1].role"``.
        problem: What is wrong, without the location.
    """

    def __init__(self, index: int | None, field: str, problem: str) -> None:
        where = "sample" if index is None else f"sample at dataset index {index}"
        super().__init__(f"{where}: field {field!r}: {problem}")
        self.index = index
        self.field = field
        self.problem = problem

    def at_index(self, index: int) -> BadSampleError:
        """The same error, located at ``index``."""
        return BadSampleError(index, self.field, self.problem)


@dataclass(frozen=True, slots=True)
class SampleStats:
    """What batching needs to know about a valid sample.

    Attributes:
        length: Number of tokens.
        num_loss_tokens: Supervised positions after the causal shift
            (``t`` with ``labels[t + 1] != -100``).
    """

    length: int
    num_loss_tokens: int


def _check_ids(value: Any, index: int, field: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise BadSampleError(index, field, f"must be a torch.Tensor, got {type(value).__name__}")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise BadSampleError(index, field, f"must have an integer dtype, got {value.dtype}")
    if value.dim() != 1:
        raise BadSampleError(index, field, f"must be 1-D, got shape {tuple(value.shape)}")
    return value


def validate_sample(sample: Any, index: int, max_seq_len: int) -> SampleStats:
    """Check one sample and measure it.

    Args:
        sample: What ``dataset[index]`` returned.
        index: Its dataset index (named in errors).
        max_seq_len: Longest allowed ``input_ids``.

    Returns:
        The sample's :class:`SampleStats`.

    Raises:
        BadSampleError: Not a dict, ``input_ids`` missing, not an integer tensor, not 1-D,
            empty, negative ids, longer than ``max_seq_len``; ``labels`` not an integer
            tensor or a different shape.
    """
    if not isinstance(sample, Mapping):
        raise BadSampleError(index, "<sample>", f"must be a dict, got {type(sample).__name__}")
    if "input_ids" not in sample:
        raise BadSampleError(index, "input_ids", f"missing (keys: {sorted(sample)})")
    input_ids = _check_ids(sample["input_ids"], index, "input_ids")
    length = input_ids.numel()
    if length == 0:
        raise BadSampleError(index, "input_ids", "is empty")
    if length > max_seq_len:
        raise BadSampleError(index, "input_ids", f"length {length} > max_seq_len {max_seq_len}")
    if int(input_ids.min()) < 0:
        raise BadSampleError(index, "input_ids", "contains negative token ids")
    labels = sample.get("labels")
    if labels is None:
        return SampleStats(length, length - 1)
    labels = _check_ids(labels, index, "labels")
    if labels.shape != input_ids.shape:
        raise BadSampleError(
            index, "labels", f"shape {tuple(labels.shape)} != input_ids {tuple(input_ids.shape)}"
        )
    return SampleStats(length, int((labels[1:] != IGNORE_INDEX).sum()))
