"""IDLE steps: a rank with nothing to emit runs a one-token dummy batch so that every
gradient collective stays aligned across ranks, and its loss counts zero."""

from __future__ import annotations

from typing import Any

import torch


def zero_weight(output: Any) -> Any:
    """A training-step output with its loss multiplied by 0: the graph, and so every
    gradient collective of the backward, is kept; the gradient it adds is zero."""
    if isinstance(output, torch.Tensor):
        return output * 0.0
    if isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
        return {**output, "loss": output["loss"] * 0.0}
    raise TypeError(
        "training_step must return a loss tensor or a dict with 'loss' for IDLE steps to be "
        f"run as zero-weight steps, got {type(output).__name__}"
    )
