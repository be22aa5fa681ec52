"""IDLE steps: a rank with nothing to emit runs a one-token dummy batch so that every
gradient collective stays aligned across ranks, and its loss counts zero.

The LightningModule is the one place that weights them, because it is what every
strategy runs (DDP, FSDP2): the dummy goes through the whole model, so each all-reduce,
all-gather and reduce-scatter of the step is issued on every rank.
:class:`~odb_lightning.lit.model.loss.TokenWeightedLossMixin` does it; a module of one's own
returns :func:`zero_weight` of its loss when ``batch.meta.is_idle`` and sets
``weights_idle_steps = True``.
"""

from __future__ import annotations

from typing import Any

import torch

WEIGHTS_IDLE_STEPS = "weights_idle_steps"
"""Attribute by which a LightningModule declares that it weights IDLE batches 0."""


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


def check_weights_idle_steps(module: Any) -> None:
    """Refuse a LightningModule that would train on IDLE dummies as if they were data.

    Raises:
        TypeError: ``module`` does not declare ``weights_idle_steps = True``.
    """
    if not getattr(module, WEIGHTS_IDLE_STEPS, False):
        raise TypeError(
            f"{type(module).__name__} does not weight IDLE batches 0: with several ranks the "
            "ODB loader gives a rank whose shard is exhausted one-token dummy batches "
            "(batch.meta.is_idle). Subclass odb_lightning.lit.model.loss.TokenWeightedLossMixin, "
            "or return zero_weight(loss) for them and set weights_idle_steps = True"
        )
