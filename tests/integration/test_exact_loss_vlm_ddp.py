"""Exact token-weighted loss of an image-text model under real DDP: 2 gloo processes,
images on one rank only, an IDLE micro-batch, gradient accumulation.

The gradient of each optimizer step, vision tower and merger included, must equal the
gradient of the global per-token mean loss over the union of both ranks' micro-batches of
that step, computed in one process on one padded batch with the Hugging Face model's own
forward (full logits, positions from the batch) at the recorded weights: float64,
relative error <= 1e-5. Rank 1 never holds an image, so every one of its steps runs the
vision tower on the zero-weight dummy image, and its micro-batch 1 is IDLE; without the
dummy, DDP would wait forever for rank 1's vision-tower gradients (or fail on unused
parameters). How the ranks start (the session's one exact-loss job, ``exact_loss_job.py``)
and how gradients are captured: as in ``test_exact_loss_ddp.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import DDPStrategy
from torch import Tensor
from torch.nn.utils import vector_to_parameters
from torch.optim import Optimizer
from torch.utils.data import DataLoader
from typing_extensions import override

from helpers.tiny_lm import flat_grad, flat_params, hand_over, quiet_trainer, rel_err
from helpers.vlm import model_sample, tiny_vlm_arguments
from odb_lightning.lit.model.vlm_module import VisionLanguageModule
from odb_lightning.runtime.batch import ODBBatch, StepMeta, idle_samples, pad_collate

WORLD_SIZE = 2
ACCUMULATE = 2
OPTIMIZER_STEPS = 2

# SAMPLES[rank][micro_batch]: (image sizes, prompt tokens, answer tokens, seed) per sample.
# Rank 0 holds every image; rank 1 text only, and its micro-batch 1 is IDLE.
SAMPLES = [
    [
        [([(90, 60)], 4, 6, 1), ([], 5, 3, 2)],
        [([(60, 110), (56, 56)], 3, 7, 3)],
        [([(120, 80)], 2, 5, 4)],
        [([], 6, 6, 5), ([(70, 70)], 3, 4, 6)],
    ],
    [
        [([], 7, 5, 11)],
        None,
        [([], 4, 9, 12), ([], 6, 3, 13)],
        [([], 5, 5, 14)],
    ],
]


def _samples(rank: int, micro: int) -> list[dict[str, Tensor]]:
    specs = SAMPLES[rank][micro]
    return [] if specs is None else [model_sample(*spec) for spec in specs]


def _loss_tokens(batch: dict[str, Tensor]) -> int:
    return int((batch["labels"][:, 1:] != -100).sum())


def rank_batches(rank: int) -> list[ODBBatch]:
    """Rank ``rank``'s micro-batches with the metadata the ODB runtime would give them."""
    batches = []
    for micro in range(len(SAMPLES[0])):
        inputs = [pad_collate(_samples(r, micro) or idle_samples(0)) for r in range(WORLD_SIZE)]
        counts = [
            0 if SAMPLES[r][micro] is None else _loss_tokens(inputs[r]) for r in range(WORLD_SIZE)
        ]
        sizes = [len(SAMPLES[r][micro] or ()) for r in range(WORLD_SIZE)]
        meta = StepMeta(
            sample_ids=(),
            is_idle=SAMPLES[rank][micro] is None,
            local_samples=sizes[rank],
            local_real_tokens=int(inputs[rank]["attention_mask"].sum()),
            local_padded_tokens=inputs[rank]["input_ids"].numel(),
            local_loss_tokens=counts[rank],
            global_samples=sum(sizes),
            global_loss_tokens=sum(counts),
            round_index=0,
            step=micro,
            epoch=0,
        )
        batches.append(ODBBatch(inputs[rank], meta))
    return batches


class RecordingVLM(VisionLanguageModule):
    """A float64 tiny Qwen2-VL on SGD(lr=1) that records what each optimizer step used."""

    def __init__(self) -> None:
        super().__init__(**tiny_vlm_arguments(loss_chunk_tokens=4))
        self.steps: list[dict[str, Tensor]] = []
        self.final_params: Tensor | None = None
        self.wrapped_in_ddp = False

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        self.wrapped_in_ddp = isinstance(
            self.trainer.strategy.model, torch.nn.parallel.DistributedDataParallel
        )

    @override
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        params = flat_params(self)
        super().on_before_optimizer_step(optimizer)  # the mixin's 1/N scale happens here
        self.steps.append({"params": params, "grad": flat_grad(self)})

    @override
    def on_train_end(self) -> None:
        super().on_train_end()
        self.final_params = flat_params(self)

    @override
    def configure_optimizers(self) -> Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1.0)

    @override
    def train_dataloader(self) -> DataLoader:
        return DataLoader(rank_batches(self.global_rank), batch_size=None, collate_fn=hand_over)


def fit_on_both_ranks(out_dir: Path) -> None:
    torch.manual_seed(0)  # the same initial weights on both ranks
    module = RecordingVLM()
    trainer = quiet_trainer(
        accelerator="cpu",
        devices=WORLD_SIZE,
        strategy=DDPStrategy(process_group_backend="gloo"),
        accumulate_grad_batches=ACCUMULATE,
        max_steps=OPTIMIZER_STEPS,
        gradient_clip_val=None,
        use_distributed_sampler=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    trainer.fit(module)
    vision = [n for n, _ in module.named_parameters() if ".visual." in n]
    torch.save(
        {
            "world_size": trainer.world_size,
            "is_ddp": module.wrapped_in_ddp,
            "steps": module.steps,
            "final_params": module.final_params,
            "vision_mask": torch.cat(
                [torch.full((p.numel(),), ".visual." in n) for n, p in module.named_parameters()]
            ),
            "num_vision_tensors": len(vision),
        },
        out_dir / f"vlm_rank{trainer.global_rank}.pt",
    )


# -- the test (pytest process) ------------------------------------------------------------


def union_gradient(params: Tensor, step: int) -> Tensor:
    """Gradient of the global per-token mean loss of optimizer step ``step``: every real
    sample of both ranks' micro-batches of that step in one padded batch, full logits
    from the Hugging Face forward, at ``params``."""
    torch.manual_seed(0)
    reference = RecordingVLM()
    reference.configure_model()
    vector_to_parameters(params, reference.parameters())
    union = [
        sample
        for rank in range(WORLD_SIZE)
        for micro in range(step * ACCUMULATE, (step + 1) * ACCUMULATE)
        for sample in _samples(rank, micro)
    ]
    batch = pad_collate(union)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = reference.model(**inputs, use_cache=False).logits
    loss = F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]),
        batch["labels"][:, 1:].reshape(-1),
        ignore_index=-100,
        reduction="sum",
    ) / _loss_tokens(batch)
    loss.backward()
    return flat_grad(reference)


@pytest.fixture(scope="module")
def ddp_records(exact_loss_records: Path) -> list[dict]:
    """This module's records from the session's 2-rank job (``exact_loss_job.py``)."""
    return [
        torch.load(exact_loss_records / f"vlm_rank{r}.pt", weights_only=False)
        for r in range(WORLD_SIZE)
    ]


def test_vlm_gradient_with_images_on_one_rank_equals_the_union_gradient(
    ddp_records: list[dict],
) -> None:
    rank0, rank1 = ddp_records
    assert rank0["world_size"] == WORLD_SIZE and rank0["is_ddp"] and rank1["is_ddp"]
    assert len(rank0["steps"]) == len(rank1["steps"]) == OPTIMIZER_STEPS
    vision = rank0["vision_mask"]
    assert rank0["num_vision_tensors"] > 0 and bool(vision.any())
    for step in range(OPTIMIZER_STEPS):
        params, grad = rank0["steps"][step]["params"], rank0["steps"][step]["grad"]
        assert torch.equal(params, rank1["steps"][step]["params"])
        assert torch.equal(grad, rank1["steps"][step]["grad"])
        after = (
            rank0["steps"][step + 1]["params"]
            if step + 1 < OPTIMIZER_STEPS
            else rank0["final_params"]
        )
        expected = union_gradient(params, step)
        assert rel_err(grad, expected) <= 1e-5
        assert rel_err(params - after, expected) <= 1e-5
        # The vision tower's own gradient: real (rank 0's images) and exact.
        assert float(expected[vision].norm()) > 0
        assert rel_err(grad[vision], expected[vision]) <= 1e-5
