"""Token-target optimizer steps through a real ``pl.Trainer`` (one CPU process).

Steps must fire exactly where ``core.loss_weights.token_target_boundaries`` says, each
step's gradient must be the gradient of the per-token mean over its micro-batches, and
``global_step`` and the LR scheduler must count real optimizer steps only.
"""

from __future__ import annotations

import copy
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from helpers.tiny_lm import (
    fit_on_cpu,
    flat_grad,
    flat_params,
    make_sample,
    rel_err,
    step_batches,
    tiny_module,
    union_gradient,
)
from odb_lightning.core.loss_weights import token_target_boundaries
from odb_lightning.lit.model.module import CausalLMModule
from odb_lightning.runtime.batch import ODBBatch

TOKENS_PER_STEP = 12
# Micro-batches as (length, unsupervised prompt, seed) per sample; None is an IDLE step.
# Supervised tokens: 10, 7 | 17 | 0, 4, 5, 5 | 5 (a trailing partial step).
MICRO_BATCHES: list[list[tuple[int, int, int]] | None] = [
    [(9, 3, 1), (6, 2, 2)],
    [(11, 4, 3)],
    [(14, 2, 5), (8, 3, 6)],
    None,
    [(5, 1, 4)],
    [(7, 2, 7)],
    [(10, 5, 8)],
    [(6, 1, 9)],
]


def odb_batches(with_global_count: bool) -> list[ODBBatch]:
    """The micro-batches with their metadata; one process, so global = local counts.

    ``with_global_count=False`` leaves ``global_loss_tokens`` unset, as planned modes do.
    """
    micro_batches = [None if specs is None else samples_of(specs) for specs in MICRO_BATCHES]
    return step_batches([micro_batches], with_global_count=with_global_count)[0]


def samples_of(specs: list[tuple[int, int, int]] | None) -> list[tuple[Tensor, Tensor]]:
    return [] if specs is None else [make_sample(*spec) for spec in specs]


class StepRecorder(CausalLMModule):
    """Records, at every optimizer step, the closing micro-batch, the parameters the step's
    micro-batches ran with, the gradient the optimizer gets, and the logged values."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch_index = -1
        self.steps: list[dict[str, Any]] = []
        self.logged: dict[str, list[float]] = {}

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        self.batch_index = batch_idx
        return super().on_train_batch_start(batch, batch_idx)

    @override
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        super().on_before_optimizer_step(optimizer)  # scales the gradients by 1 / N
        params, grad = flat_params(self), flat_grad(self)
        self.steps.append({"batch": self.batch_index, "grad": grad, "params": params})

    @override
    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        self.logged.setdefault(name, []).append(float(value))
        super().log(name, value, *args, **kwargs)


def recorder(tokens_per_step: int | None = TOKENS_PER_STEP) -> StepRecorder:
    return tiny_module(
        StepRecorder,
        loss_chunk_tokens=5,
        lr=1e-2,
        scheduler="constant",
        warmup_steps=100,  # the LR then tells how often the scheduler stepped
        tokens_per_step=tokens_per_step,
    )


def fit(module: CausalLMModule, batches: list[Any], **trainer_kwargs: Any) -> pl.Trainer:
    # The cpu preset clips: token targets keep that working.
    return fit_on_cpu(module, batches, max_epochs=1, gradient_clip_val=1.0, **trainer_kwargs)


@pytest.mark.parametrize("with_global_count", [True, False], ids=["odb", "planned"])
def test_steps_close_at_the_predicted_micro_batches_with_the_union_gradient(
    with_global_count: bool,
) -> None:
    batches = odb_batches(with_global_count)
    counts = [batch.meta.local_loss_tokens for batch in batches]
    boundaries = token_target_boundaries(counts, TOKENS_PER_STEP)
    assert boundaries == [1, 2, 6, 7]  # 2, 1, 4 (one IDLE) and 1 trailing micro-batches
    module = recorder()
    base = copy.deepcopy(module)
    trainer = fit(module, batches)

    assert [step["batch"] for step in module.steps] == boundaries
    assert trainer.global_step == len(boundaries)
    # Warmup multiplies the LR by (steps + 1) / 100: one scheduler step per optimizer step.
    assert module.logged["lr"] == pytest.approx([1e-2 * (k + 1) / 100 for k in range(4)])
    starts = [0] + [b + 1 for b in boundaries[:-1]]
    for k, (start, end) in enumerate(zip(starts, boundaries, strict=True)):
        window = [s for specs in MICRO_BATCHES[start : end + 1] for s in samples_of(specs)]
        expected_grad, expected_loss = union_gradient(base, window, module.steps[k]["params"])
        assert rel_err(module.steps[k]["grad"], expected_grad) <= 1e-5
        assert module.logged["train/loss"][k] == pytest.approx(expected_loss, rel=1e-10)
        assert module.logged["train/tokens_per_optimizer_step"][k] == sum(counts[start : end + 1])
    # The steps really moved the weights (and every step saw the previous one's update).
    assert not torch.equal(module.steps[0]["params"], module.steps[1]["params"])
    assert trainer.accumulate_grad_batches == 1  # as configured, once training is over


def test_without_tokens_per_step_every_micro_batch_steps() -> None:
    module = recorder(tokens_per_step=None)
    trainer = fit(module, odb_batches(with_global_count=True))
    assert [step["batch"] for step in module.steps] == list(range(len(MICRO_BATCHES)))
    assert trainer.global_step == len(MICRO_BATCHES)
    assert "train/tokens_per_optimizer_step" not in module.logged


@pytest.mark.parametrize("value", [0, -4, 2.5, True, "8"])
def test_tokens_per_step_must_be_a_positive_int_or_null(value: object) -> None:
    with pytest.raises(
        ValueError, match=r"model\.step\.tokens_per_step must be a positive integer or null"
    ):
        recorder(tokens_per_step=value)  # type: ignore[arg-type]


def test_trainer_accumulation_is_refused() -> None:
    with pytest.raises(ValueError, match=r"trainer\.accumulate_grad_batches=1"):
        fit(recorder(), odb_batches(with_global_count=True), accumulate_grad_batches=2)


def test_plain_batches_are_refused() -> None:
    plain = [batch.inputs for batch in odb_batches(with_global_count=True)]
    with pytest.raises(ValueError, match=r"model\.step\.tokens_per_step needs step metadata"):
        fit(recorder(), plain)
