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
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.optim import Optimizer
from torch.utils.data import DataLoader
from typing_extensions import override

from odb_lightning.core.loss_weights import token_target_boundaries
from odb_lightning.lit.module import CausalLMModule
from odb_lightning.runtime.batch import ODBBatch, StepMeta, idle_sample, pad_collate

VOCAB = 256
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


def make_sample(length: int, prompt: int, seed: int) -> tuple[Tensor, Tensor]:
    """Token ids and labels with the first ``prompt`` positions unsupervised."""
    ids = torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))
    labels = ids.clone()
    labels[:prompt] = -100
    return ids, labels


def pad(samples: list[tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
    """Right-padded batch: pad id 0, mask 0, label -100."""
    return pad_collate([{"input_ids": ids, "labels": labels} for ids, labels in samples])


def loss_tokens(batch: dict[str, Tensor]) -> int:
    return int((batch["labels"][:, 1:] != -100).sum())


def odb_batches(with_global_count: bool) -> list[ODBBatch]:
    """The micro-batches with their metadata; one process, so global = local counts.

    ``with_global_count=False`` leaves ``global_loss_tokens`` unset, as planned modes do.
    """
    batches = []
    for step, specs in enumerate(MICRO_BATCHES):
        inputs = pad_collate([idle_sample(0)]) if specs is None else pad(samples_of(specs))
        count = 0 if specs is None else loss_tokens(inputs)
        real = 0 if specs is None else int(inputs["attention_mask"].sum())
        size = 0 if specs is None else len(specs)
        global_count = count if with_global_count else None
        meta = StepMeta((), specs is None, size, real, real, count, size, global_count, 0, step, 0)
        batches.append(ODBBatch(inputs, meta))
    return batches


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
        grad = torch.cat([p.grad.reshape(-1) for p in self.parameters()])
        params = parameters_to_vector(self.parameters()).detach().clone()
        self.steps.append({"batch": self.batch_index, "grad": grad.clone(), "params": params})

    @override
    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        self.logged.setdefault(name, []).append(float(value))
        super().log(name, value, *args, **kwargs)


def recorder(tokens_per_step: int | None = TOKENS_PER_STEP) -> StepRecorder:
    torch.manual_seed(0)
    return StepRecorder(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        model_dtype="float64",
        loss_chunk_tokens=5,
        lr=1e-2,
        scheduler="constant",
        warmup_steps=100,  # the LR then tells how often the scheduler stepped
        tokens_per_step=tokens_per_step,
    )


def fit(module: CausalLMModule, batches: list[Any], **trainer_kwargs: Any) -> pl.Trainer:
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        gradient_clip_val=1.0,  # the cpu preset clips: token targets keep that working
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        **trainer_kwargs,
    )
    # batch_size=None with an identity collate hands each prepared batch over as it is.
    loader = DataLoader(batches, batch_size=None, collate_fn=lambda batch: batch)
    trainer.fit(module, train_dataloaders=loader)
    return trainer


def union_gradient(
    base: CausalLMModule, params: Tensor, samples: list[tuple[Tensor, Tensor]]
) -> tuple[Tensor, float]:
    """Gradient and value of the per-token mean loss over ``samples`` at ``params``,
    from full logits of one padded batch."""
    reference = copy.deepcopy(base)
    vector_to_parameters(params, reference.parameters())
    union = pad(samples)
    logits = reference.model(
        input_ids=union["input_ids"], attention_mask=union["attention_mask"]
    ).logits
    loss = F.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB),
        union["labels"][:, 1:].reshape(-1),
        ignore_index=-100,
        reduction="sum",
    ) / loss_tokens(union)
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in reference.parameters()]), loss.item()


def rel_err(actual: Tensor, expected: Tensor) -> float:
    return float((actual - expected).norm() / expected.norm())


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
        expected_grad, expected_loss = union_gradient(base, module.steps[k]["params"], window)
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
    with pytest.raises(ValueError, match=r"model\.tokens_per_step must be a positive int or null"):
        recorder(tokens_per_step=value)  # type: ignore[arg-type]


def test_trainer_accumulation_is_refused() -> None:
    with pytest.raises(ValueError, match=r"trainer\.accumulate_grad_batches=1"):
        fit(recorder(), odb_batches(with_global_count=True), accumulate_grad_batches=2)


def test_plain_batches_are_refused() -> None:
    plain = [batch.inputs for batch in odb_batches(with_global_count=True)]
    with pytest.raises(ValueError, match=r"model\.tokens_per_step needs step metadata"):
        fit(recorder(), plain)
