"""Token-target optimizer steps: step once the step's global supervised tokens reach N.

With ``tokens_per_step=N`` micro-batches are accumulated until the *global* supervised-token
count since the last optimizer step reaches ``N``; the step then closes on the micro-batch
:func:`odb_lightning.core.loss_weights.token_target_boundaries` predicts (a trailing
partial step is closed by the epoch's last micro-batch). The decision is taken from
counts every rank knows alike, so every rank steps at the same micro-batch. How this
rides on Lightning's automatic optimization: ``docs/design.md``, "How the loss rides on
Lightning's hooks".
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

import lightning.pytorch as pl
import torch

from odb_lightning.core.budget import BUDGET_QUANTUM
from odb_lightning.core.config import TOKEN_BUDGET_AUTO, BatchingConfig
from odb_lightning.core.online_policy import EmissionOrder, OnlinePolicy
from odb_lightning.runtime.batch import ODBBatch

HOLD_ACCUMULATE_GRAD_BATCHES = 2**40
"""``accumulate_grad_batches`` of a micro-batch that does not close a step: larger than any
batch count of an epoch, so Lightning only steps on it at the epoch's end."""


FEW_GROUPS_BUDGET_RATIO = 2
"""A token budget above this many times ``tokens_per_step`` makes a token-target step of
about one ODB group; the ratio sits between the two budgets measured in
``experiments/quality/README.md``."""

STEP_BATCHING_KEYS = ("batching.token_budget", "batching.policy.emission_order")
"""The batching knobs token-target steps resolve unless the command line names them."""


def group_budget_cap(tokens_per_step: int) -> int:
    """The largest token budget token-target steps of ``tokens_per_step`` get by default:
    ``tokens_per_step`` rounded down to :data:`BUDGET_QUANTUM` (at least one quantum), so
    a step closes only after several groups."""
    return max(BUDGET_QUANTUM, tokens_per_step // BUDGET_QUANTUM * BUDGET_QUANTUM)


@dataclass(frozen=True)
class StepBatching:
    """The batching token-target steps run under (:func:`batching_for_steps`)."""

    batching: BatchingConfig
    """The batching config every layer receives."""
    resolved: str | None = None
    """The log line saying what was resolved and why (``None``: nothing changed)."""
    advice: str | None = None
    """A warning's text when the kept budget makes steps of about one group."""
    auto_ceiling: int | None = None
    """With ``token_budget=auto`` resolved by the memory warm-up: the most it may become."""


def batching_for_steps(
    batching: BatchingConfig, tokens_per_step: int | None, named: Collection[str] = ()
) -> StepBatching:
    """``batching`` as token-target steps of ``tokens_per_step`` run it by default: each
    optimizer step built from several groups of different lengths.

    With ``tokens_per_step`` set and an online mode, a ``token_budget`` above
    :func:`group_budget_cap` is lowered to it (``auto``: the warm-up's result is capped
    there) and a ``shuffled`` ``emission_order`` becomes ``paired``, except for the keys
    of :data:`STEP_BATCHING_KEYS` in ``named`` (those the user chose: the app passes the
    ones the command line names), which are kept; a kept budget over
    :data:`FEW_GROUPS_BUDGET_RATIO` times ``tokens_per_step`` gets the warning of
    :func:`few_groups_advice`. Without token-target steps, or in a fixed-size mode,
    ``batching`` is returned unchanged.
    """
    if tokens_per_step is None or not isinstance(batching.policy, OnlinePolicy):
        return StepBatching(batching)
    budget_key, order_key = STEP_BATCHING_KEYS
    cap = group_budget_cap(tokens_per_step)
    budget, changes = batching.token_budget, []
    auto_ceiling = None
    if budget_key not in named:
        if budget == TOKEN_BUDGET_AUTO:
            auto_ceiling = cap
            changes.append(f"{budget_key}=auto at most {cap}")
        elif budget > cap:  # type: ignore[operator]  # an int unless auto
            changes.append(f"{budget_key}={cap} (from {budget})")
            budget = cap
    policy = batching.policy
    if order_key not in named and policy.emission_order is not EmissionOrder.PAIRED:
        policy = replace(policy, emission_order=EmissionOrder.PAIRED)
        changes.append(f"{order_key}=paired")
    resolved = replace(batching, token_budget=budget, policy=policy)
    line = None
    if changes:
        line = (
            f"{' and '.join(changes)} for model.step.tokens_per_step={tokens_per_step}: each "
            "optimizer step then holds several groups of different lengths, the longest "
            "next to the shortest; steps of about one group (samples of nearly one length) "
            "cost validation loss as sorted batches do (experiments/quality/README.md). "
            "Name the key on the command line to keep your value"
        )
    return StepBatching(resolved, line, few_groups_advice(tokens_per_step, resolved), auto_ceiling)


def few_groups_advice(tokens_per_step: int | None, batching: BatchingConfig) -> str | None:
    """A warning's text when token-target steps under ``batching`` would each hold about
    one ODB group (samples of nearly one length, the sorted-batching regression), else
    ``None``. Only ODB modes with a fixed budget are judged."""
    budget = batching.token_budget
    if tokens_per_step is None or not isinstance(batching.policy, OnlinePolicy):
        return None
    if not isinstance(budget, int) or budget <= FEW_GROUPS_BUDGET_RATIO * tokens_per_step:
        return None
    return (
        f"batching.token_budget={budget} is over {FEW_GROUPS_BUDGET_RATIO}x "
        f"model.step.tokens_per_step={tokens_per_step}: each optimizer step will hold about "
        "one group of samples of nearly one length, which cost validation loss against "
        "fixed batches in experiments/quality/. Leave batching.token_budget to the run "
        f"(it then takes {group_budget_cap(tokens_per_step)}), or set it at or below the "
        "step's supervised tokens"
    )


def check_token_target_trainer(trainer: pl.Trainer) -> None:
    """Refuse trainer settings that would fight over when the optimizer steps.

    Raises:
        ValueError: If ``trainer.accumulate_grad_batches`` is not 1.
    """
    if trainer.accumulate_grad_batches != 1:
        raise ValueError(
            "model.step.tokens_per_step decides when the optimizer steps; set "
            f"trainer.accumulate_grad_batches=1 (got {trainer.accumulate_grad_batches})"
        )


def global_loss_tokens_of(batch: Any, trainer: pl.Trainer, device: torch.device) -> int:
    """Supervised tokens of this micro-batch over all ranks, known before its forward.

    ODB batches carry the count in ``meta.global_loss_tokens`` (from the alignment
    exchange: no collective). Planned modes (``standard``, ``sorted``, ...) carry only
    ``meta.local_loss_tokens``: it is summed over ranks with one all-reduce per
    micro-batch, which every rank takes alike (all ranks get the same kind of batches).

    Raises:
        ValueError: For a batch without step metadata (a plain dict): its count would need
            the labels' layout, which the loss mixin does not know.
    """
    if not isinstance(batch, ODBBatch):
        raise ValueError(
            "model.step.tokens_per_step needs step metadata beside the inputs (an ODBBatch, as "
            "every batching mode of ODBDataModule yields) to count supervised tokens before "
            f"the forward; got a {type(batch).__name__} batch"
        )
    meta = batch.meta
    if meta.global_loss_tokens is not None:
        return int(meta.global_loss_tokens)
    return sum_over_ranks(trainer, meta.local_loss_tokens, device)


def sum_over_ranks(trainer: pl.Trainer, count: int, device: torch.device) -> int:
    """``count`` summed over ranks: one all-reduce, which every rank must take alike."""
    if trainer.world_size == 1:
        return count
    total = torch.tensor(count, device=device)
    return int(trainer.strategy.reduce(total, reduce_op="sum").item())
