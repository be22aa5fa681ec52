"""The throughput study's arms feed the one training loop the same samples.

``experiments/throughput`` drives our loaders and the reference package's loader with one
loop; its ratios are only meaningful if every arm trains on exactly the benchmark's
samples, under the same budget.
"""

from __future__ import annotations

import functools
import random

# The reference package (installed by the dev and bench extras): a missing install fails.
import odb  # noqa: F401
import pytest
import torch

from experiments.throughput import run
from experiments.throughput import throughput_arms as arms
from odb_lightning.data import LengthStats, TokenizedDataset
from odb_lightning.lit.model.config import Architecture
from odb_lightning.lit.model.lr_schedule import WarmupSchedule

BUDGET = 1024
NUM_SAMPLES = 32


@pytest.fixture(scope="module")
def bench() -> arms.BenchData:
    rng = random.Random(0)
    lengths = rng.sample(range(8, 480), NUM_SAMPLES)  # distinct: a row's length names it
    samples = []
    for n in lengths:
        ids = [rng.randrange(1, 2048) for _ in range(n)]
        labels = [-100] * (n // 3) + ids[n // 3 :]
        samples.append((ids, labels))
    loss_tokens = [sum(1 for t in labels[1:] if t != -100) for _, labels in samples]
    return arms.BenchData("synthetic", TokenizedDataset(samples), lengths, loss_tokens,
                          LengthStats.of(lengths))  # fmt: skip


SETTINGS = arms.ArmSettings(
    token_budget=BUDGET, outstanding_depth=16, num_workers=1, max_seq_len=512, pad_id=0, seed=0
)


@pytest.mark.parametrize("arm", ["reference", "odb", "odb_packed"])
def test_arm_emits_every_sample_once_within_the_budget(bench: arms.BenchData, arm: str) -> None:
    rows: list[int] = []
    for inputs in arms.make_arm(arm, bench, SETTINGS)():
        if "cu_seqlens" in inputs:
            rows += inputs["cu_seqlens"].diff().tolist()
            assert inputs["input_ids"].shape[1] <= BUDGET  # packed: real tokens
            continue
        group, longest = inputs["input_ids"].shape
        rows += inputs["attention_mask"].sum(dim=1).tolist()
        assert group * longest <= BUDGET, (arm, group, longest)
        assert set(inputs) == {"input_ids", "attention_mask", "labels"}  # metadata stripped
    assert sorted(rows) == sorted(bench.lengths)


def test_reference_trains_in_the_shared_loop(bench: arms.BenchData) -> None:
    architecture = Architecture(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, token_id_fold=2048,
    )  # fmt: skip
    # train_epoch steps its own AdamW; the module's factories only have to build.
    model = run.CausalLMModule(
        architecture=architecture,
        optimizer=functools.partial(torch.optim.AdamW),
        scheduler=functools.partial(
            WarmupSchedule, shape="constant", warmup_steps=0, min_lr_ratio=1.0, decay_steps=None
        ),
    )
    record = run.train_epoch(model, arms.make_arm("reference", bench, SETTINGS), lr=1e-3)
    run.check_coverage(bench, "reference", record)  # raises on any mismatch
    assert record.loss_tokens == sum(bench.loss_tokens)
    assert record.steps == len(record.shapes) == len(record.step_s)
    assert record.padded_tokens == sum(rows * n for rows, n, _ in record.shapes)
    assert 0 < record.real_tokens / record.padded_tokens <= 1
