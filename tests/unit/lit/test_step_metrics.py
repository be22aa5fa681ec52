"""Step metrics: model FLOPs of a step from its samples' own lengths, the device peak
table, the cross-rank reduction, and the callback in a one-process fit."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from helpers.metered import CONFIG, MeteredModule, metered_batches
from helpers.tiny_lm import hand_over, quiet_trainer
from odb_lightning.lit.callbacks.step_metrics import StepMetricsCallback, Window, reduce_windows
from odb_lightning.lit.model.flops import ModelFlops, peak_bf16_flops

# Lengths of a few steps (None: IDLE) and their hand counts under CONFIG.
STEPS = [[3, 5], None, [7], [2, 2, 2]]


def hand_step_flops(lengths: list[int], loss_tokens: int) -> int:
    """CONFIG by hand: 3 layers x 576 weights x 6 = 10,368 FLOPs per token; attention
    3 layers x 12 x 8 (query width) = 288 per (query, key) pair, L (L + 1) / 2 pairs for a
    causal sample of length L; the head 6 x 1000 x 8 = 48,000 per supervised token."""
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    return 10368 * sum(lengths) + 288 * pairs + 48000 * loss_tokens


def test_step_flops_against_a_hand_count() -> None:
    flops = ModelFlops.of(CONFIG)
    assert (flops.per_token, flops.per_attended_key, flops.per_supervised_token) == (
        10368,
        288,
        48000,
    )
    # [3, 5]: 8 tokens, 6 + 15 = 21 pairs, 4 supervised.
    assert flops.step([3, 5], 4) == 10368 * 8 + 288 * 21 + 48000 * 4 == 280992
    # The attention term follows each sample's length: one sample of 8 has 36 pairs.
    assert flops.step([8], 4) - flops.step([3, 5], 4) == 288 * (36 - 21)


@pytest.mark.parametrize(
    ("device_name", "peak"),
    [
        # Names as torch.cuda.get_device_name reports them.
        ("NVIDIA H200", 989.4e12),
        ("NVIDIA H100 80GB HBM3", 989.4e12),
        ("NVIDIA H100 PCIe", 756.0e12),  # not the SXM part's
        ("NVIDIA H100 NVL", 835.5e12),
        ("NVIDIA GH200 480GB", 989.4e12),
        ("NVIDIA H800", 989.4e12),
        ("NVIDIA H800 PCIe", 756.0e12),
        ("NVIDIA H20", 148.0e12),  # a whole word: not the H200's
        ("NVIDIA A100-SXM4-80GB", 312.0e12),
        ("NVIDIA A800-SXM4-80GB", 312.0e12),
        ("NVIDIA B200", 2250.0e12),
        ("NVIDIA GB200", 2500.0e12),  # not the B200's
        ("NVIDIA B100", 1750.0e12),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 500.0e12),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 500.0e12),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 438.9e12),
        ("NVIDIA L40S", 362.05e12),
        ("NVIDIA L20", 119.5e12),
        ("NVIDIA L4", None),  # not listed: no MFU rather than a wrong one
        ("NVIDIA H2000", None),  # no prefix of a listed name matches
        ("x86_64", None),
    ],
)
def test_peak_table_by_device_name(device_name: str, peak: float | None) -> None:
    assert peak_bf16_flops(device_name) == peak


def test_reduce_windows_sums_ranks_and_takes_step_time_max_and_mean() -> None:
    fast = Window(wall_s=2.0, real_tokens=600, samples=6, model_flops=4e12, step_s=1.0, steps=4)
    slow = Window(wall_s=2.5, real_tokens=400, samples=2, model_flops=1e12, step_s=2.0, steps=4)
    out = reduce_windows([fast, slow], peak_flops=10e12)
    assert out["tokens_per_s_per_device"] == pytest.approx(1000 / 2.5 / 2)
    assert out["samples_per_s_per_device"] == pytest.approx(8 / 2.5 / 2)
    assert out["model_tflops_per_s_per_device"] == pytest.approx(5 / 2.5 / 2)
    assert out["mfu"] == pytest.approx(1.0 / 10)
    assert out["step_time_max_s"] == 0.5 and out["step_time_mean_s"] == 0.375
    assert "mfu" not in reduce_windows([fast], peak_flops=None)


def fit_metered(callback: StepMetricsCallback) -> tuple[dict, dict]:
    """Fit on STEPS in this process; the callback's summary entries and the logged metrics."""
    module = MeteredModule(step_sleep_s=0.002)
    trainer = quiet_trainer(
        accelerator="cpu", devices=1, limit_val_batches=0, max_epochs=1, callbacks=[callback]
    )
    trainer.fit(module, DataLoader(metered_batches(STEPS), batch_size=None, collate_fn=hand_over))
    return callback.summary_entries(trainer, module), dict(trainer.callback_metrics)


@pytest.mark.parametrize("peak_tflops", [None, 0.5])
def test_callback_counts_the_steps_model_flops(peak_tflops: float | None) -> None:
    callback = StepMetricsCallback(log_every_n_steps=2, peak_tflops=peak_tflops)
    entries, logged = fit_metered(callback)
    expected = sum(hand_step_flops(s, sum(n // 2 for n in s)) for s in STEPS if s)
    assert entries["model_flops"] == expected
    tflops = entries["model_tflops_per_s_per_device"]
    assert entries["tokens_per_s_per_device"] > 0 and tflops > 0
    assert entries["step_time_max_s"] == entries["step_time_mean_s"] >= 0.002
    assert entries["step_time_s_per_rank"] == [entries["step_time_mean_s"]]
    assert float(logged["perf/step_time_max_s"]) > 0
    if peak_tflops is None:  # a CPU: no known peak, no MFU
        assert entries["mfu"] is None and "perf/mfu" not in logged
    else:
        assert entries["mfu"] == pytest.approx(tflops / peak_tflops)
        assert float(logged["perf/mfu"]) > 0


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="peak_tflops"):
        StepMetricsCallback(peak_tflops=0)
    with pytest.raises(ValueError, match="log_every_n_steps"):
        StepMetricsCallback(log_every_n_steps=0)
