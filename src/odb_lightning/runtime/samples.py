"""Validation of one sample as the data layer hands it over, and its token counts.

A sample is a mapping with ``input_ids`` (1-D integer tensor of ``L`` tokens) and
optionally ``labels`` (same shape; ``-100`` = not supervised). Labels follow the Hugging
Face convention: the model shifts them, so position 0 is never predicted and the
supervised-token count is ``sum(labels[1:] != -100)``. Without ``labels`` every token but
the first is supervised.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from odb_lightning.runtime.errors import BadSampleError

IGNORE_INDEX = -100


def _check_token_tensor(value: object, index: int, field: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise BadSampleError(
            f"sample {index}: field '{field}' must be a torch.Tensor of token ids, "
            f"got {type(value).__name__}"
        )
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise BadSampleError(
            f"sample {index}: field '{field}' must have an integer dtype, got {value.dtype}"
        )
    if value.dim() != 1:
        raise BadSampleError(
            f"sample {index}: field '{field}' must be 1-D, got shape {tuple(value.shape)}"
        )
    return value


def inspect_sample(sample: object, index: int, max_seq_len: int | None) -> tuple[int, int]:
    """Validate a sample and return ``(length, num_loss_tokens)``.

    Args:
        sample: What ``dataset[index]`` returned.
        index: Its dataset index (named in every error).
        max_seq_len: Longest allowed ``input_ids``; ``None`` for no limit.

    Raises:
        BadSampleError: Naming the index and the field at fault.
    """
    if not isinstance(sample, Mapping):
        raise BadSampleError(
            f"sample {index}: expected a mapping with 'input_ids', got {type(sample).__name__}"
        )
    if "input_ids" not in sample:
        raise BadSampleError(f"sample {index}: field 'input_ids' is missing")
    input_ids = _check_token_tensor(sample["input_ids"], index, "input_ids")
    length = input_ids.numel()
    if length == 0:
        raise BadSampleError(f"sample {index}: field 'input_ids' is empty")
    if max_seq_len is not None and length > max_seq_len:
        raise BadSampleError(
            f"sample {index}: field 'input_ids' has {length} tokens, more than "
            f"max_seq_len={max_seq_len}"
        )
    if "labels" not in sample:
        return length, length - 1
    labels = _check_token_tensor(sample["labels"], index, "labels")
    if labels.shape != input_ids.shape:
        raise BadSampleError(
            f"sample {index}: field 'labels' has shape {tuple(labels.shape)}, "
            f"'input_ids' has {tuple(input_ids.shape)}"
        )
    return length, int((labels[1:] != IGNORE_INDEX).sum())
