"""Memory safety: the worst-case warm-up shapes, a budget that does not fit failing at step 0
with a budget that does, ``token_budget=auto``, and the allocator setting."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.plugins.precision import Precision

from helpers.tiny_lm import tiny_module
from odb_lightning.core.config import BatchingConfig
from odb_lightning.lit.memory.probe import (
    GIB,
    SavedTensorsProbe,
    StepShape,
    run_shape,
    worst_case_shapes,
)
from odb_lightning.lit.memory.report import MemoryBudgetError, format_bytes
from odb_lightning.lit.memory.warmup import ALLOCATOR_ENV, MemoryWarmup, enable_expandable_segments

MAX_SEQ_LEN = 64


def test_worst_case_shapes_of_padded_and_packed_settings() -> None:
    padded = BatchingConfig.of(token_budget=1024, pad_to_multiple_of=8)
    shapes = {s.name: (s.rows, s.tokens) for s in worst_case_shapes(padded, MAX_SEQ_LEN)}
    assert shapes == {
        "one sample of max_seq_len=64": (1, 64),
        "a full group of max_seq_len samples": (16, 64),
        # The shortest sample with a target has 2 tokens, padded to 8: 1024 // 8 rows.
        "the largest group (128 rows) of the shortest samples": (128, 8),
    }
    capped = BatchingConfig.of(padded, mode="oracle", max_batch_size=32)  # a capped policy
    # The cap stops the most rows at 32, so the row length rises to what 32 rows allow.
    assert (
        worst_case_shapes(capped, MAX_SEQ_LEN)[-1].rows,
        worst_case_shapes(capped, MAX_SEQ_LEN)[-1].tokens,
    ) == (32, 32)
    packed = BatchingConfig.of(mode="odb_packed", token_budget=1000, pad_to_multiple_of=64)
    (row,) = worst_case_shapes(packed, MAX_SEQ_LEN)
    assert (row.rows, row.tokens, row.one_row) == (1, 1024, True)


def test_fixed_size_modes_check_a_whole_batch_of_max_seq_len_samples() -> None:
    """``standard`` and ``sorted`` ignore the budget: their worst step is ``batch_size``
    samples of ``max_seq_len`` (8 x 2,048 = 16,384 tokens under ``sharegpt_standard``,
    not the budget's 4,096)."""
    for mode in ("standard", "sorted"):
        config = BatchingConfig.of(mode=mode, batch_size=8, token_budget=4096)
        (shape,) = worst_case_shapes(config, 2048)
        assert (shape.rows, shape.tokens, shape.one_row) == (8, 2048, False)


class CountingPrecision(Precision):
    """Lightning's full-precision plugin, counting the backward passes it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.backward_calls = 0

    def backward(self, tensor, model, optimizer, *args, **kwargs) -> None:  # type: ignore[override]
        self.backward_calls += 1
        super().backward(tensor, model, optimizer, *args, **kwargs)


def fake_trainer(module: torch.nn.Module) -> SimpleNamespace:
    """What the callback reads from a trainer: the strategy (its wrapped model, reduce and
    precision plugin) and the optimizers."""
    strategy = SimpleNamespace(
        model=module, reduce=lambda tensor, reduce_op: tensor, precision_plugin=CountingPrecision()
    )
    return SimpleNamespace(strategy=strategy, optimizers=[])


def warmup_of(
    module: torch.nn.Module, config: BatchingConfig, applied: list[int] | None = None, **kwargs
) -> MemoryWarmup:
    """The callback as the app wires it: the run's batching, max_seq_len and vocabulary,
    and the data module's budget setter (here: ``applied`` records the budgets)."""
    return MemoryWarmup(
        **kwargs,
        batching=config,
        max_seq_len=MAX_SEQ_LEN,
        vocab_size=module.model.config.vocab_size,
        apply_token_budget=None if applied is None else applied.append,
    )


def peak_gib(module: torch.nn.Module, config: BatchingConfig) -> float:
    """The worst measured shape of ``config`` with the CPU probe (no capacity check)."""
    probe = SavedTensorsProbe(module, capacity_bytes=1 << 62)
    vocab = module.model.config.vocab_size
    peaks = [run_shape(module, s, probe, vocab) for s in worst_case_shapes(config, MAX_SEQ_LEN)]
    return max(peaks) / GIB


def test_a_budget_that_does_not_fit_fails_at_fit_start_naming_one_that_does() -> None:
    module = tiny_module(model_dtype="float32")
    config = BatchingConfig.of(token_budget=2048, num_workers=0)
    capacity = peak_gib(module, config) * 0.6  # 60 % of what the budget needs
    warmup = warmup_of(module, config, margin=0.1, capacity_gib=capacity)
    with pytest.raises(MemoryBudgetError) as raised:
        warmup.on_fit_start(fake_trainer(module), module)
    message = str(raised.value)
    assert "batching.token_budget=2048 does not fit" in message
    assert f"of {format_bytes(capacity * GIB)} (10% kept free)" in message
    suggested = int(message.split("batching.token_budget=")[2].split(" ")[0])
    assert 0 < suggested < 2048
    # The suggestion is honest: its own worst case fits the same capacity.
    fitting = replace(config, token_budget=suggested)
    assert peak_gib(module, fitting) <= capacity * 0.9
    warmup = warmup_of(module, fitting, margin=0.1, capacity_gib=capacity)
    trainer = fake_trainer(module)
    warmup.on_fit_start(trainer, module)
    assert warmup.report is not None and warmup.report.token_budget == suggested
    # Every shape's backward went through the strategy's precision plugin, as training's.
    shapes = len(worst_case_shapes(fitting, MAX_SEQ_LEN))
    assert trainer.strategy.precision_plugin.backward_calls == shapes
    assert all(p.grad is None for p in module.parameters())  # training starts unchanged


class PeakStandIn(SavedTensorsProbe):
    """The CPU reading standing in for an allocator's peak: ``auto``'s search, which on a
    real run needs CUDA, driven on the CPU with the reading it is compared against."""

    measures_peak = True


def test_token_budget_auto_finds_the_largest_budget_that_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = tiny_module(model_dtype="float32")
    capacity = peak_gib(module, BatchingConfig.of(token_budget=1024)) / 0.9
    auto = BatchingConfig.of(token_budget="auto", num_workers=0)
    applied: list[int] = []
    warmup = warmup_of(module, auto, applied, margin=0.1, capacity_gib=capacity)
    monkeypatch.setattr(warmup, "_probe", lambda m: PeakStandIn(m, int(capacity * GIB)))
    warmup.on_fit_start(fake_trainer(module), module)
    (resolved,) = applied  # the budget the data module is given
    assert isinstance(resolved, int) and resolved % 256 == 0
    assert peak_gib(module, replace(auto, token_budget=resolved)) <= capacity * 0.9
    # Within a quantum and the 10 % back-off of the largest: 1024 fits by construction.
    assert resolved >= 1024 * 0.9 - 256
    assert peak_gib(module, replace(auto, token_budget=resolved + 512)) > capacity * 0.9
    assert warmup.report.resolved_auto and warmup.report.token_budget == resolved


def test_token_budget_auto_stops_at_the_token_target_ceiling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Token-target steps cap ``auto`` (``batching_for_steps``): what fits above the cap
    is not taken, so a step still holds several groups."""
    module = tiny_module(model_dtype="float32")
    capacity = peak_gib(module, BatchingConfig.of(token_budget=1024)) / 0.9
    auto = BatchingConfig.of(token_budget="auto", num_workers=0)
    applied: list[int] = []
    warmup = warmup_of(module, auto, applied, margin=0.1, capacity_gib=capacity, auto_ceiling=256)
    monkeypatch.setattr(warmup, "_probe", lambda m: PeakStandIn(m, int(capacity * GIB)))
    warmup.on_fit_start(fake_trainer(module), module)
    assert applied == [256]


def test_auto_on_a_cpu_is_refused_with_or_without_a_capacity() -> None:
    """The CPU reading is a lower bound: a budget resolved from it need not fit (a
    2 GiB capacity once resolved 743,168 tokens whose first step grew past 10 GB), so
    ``auto`` is refused there, a capacity given or not, and nothing is applied."""
    module = tiny_module(model_dtype="float32")
    auto = BatchingConfig.of(token_budget="auto", num_workers=0)
    for kwargs in ({}, {"capacity_gib": 2.0}, {"capacity_gib": 2.0, "enabled": True}):
        applied: list[int] = []
        with pytest.raises(MemoryBudgetError, match="auto is refused on cpu") as raised:
            warmup_of(module, auto, applied, **kwargs).on_fit_start(fake_trainer(module), module)
        assert "Set an integer batching.token_budget" in str(raised.value)
        assert applied == []
    with pytest.raises(ValueError, match="resolved at fit start"):
        _ = BatchingConfig.of(token_budget="auto").budget
    with pytest.raises(ValueError, match="positive integer or auto"):
        BatchingConfig.of(token_budget="big")
    # Off on a CPU by default: nothing is measured.
    warmup = warmup_of(module, BatchingConfig.of(num_workers=0))
    warmup.on_fit_start(fake_trainer(module), module)
    assert warmup.report is None


def test_the_probe_grows_with_the_step() -> None:
    module = tiny_module(model_dtype="float32")
    probe = SavedTensorsProbe(module, capacity_bytes=1 << 62)
    vocab = module.model.config.vocab_size
    small = run_shape(module, StepShape("s", 2, 32), probe, vocab)
    large = run_shape(module, StepShape("l", 8, 32), probe, vocab)
    assert large > small > sum(p.numel() * 4 for p in module.parameters())


def test_expandable_segments_unless_the_allocator_is_configured() -> None:
    environ: dict[str, str] = {}
    assert enable_expandable_segments(environ)
    assert environ[ALLOCATOR_ENV] == "expandable_segments:True"
    mine = {ALLOCATOR_ENV: "max_split_size_mb:128"}
    assert not enable_expandable_segments(mine)
    assert mine[ALLOCATOR_ENV] == "max_split_size_mb:128"


def test_a_real_trainers_precision_plugin_runs_the_warm_up_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a real trainer (bf16 mixed precision on the CPU) the warm-up's backward is the
    plugin's, once per checked shape, and the check completes with gradients dropped."""
    import lightning.pytorch as pl

    module = tiny_module(model_dtype="float32")
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, precision="bf16-mixed", logger=False,
        enable_checkpointing=False, enable_progress_bar=False,
    )  # fmt: skip
    plugin = trainer.strategy.precision_plugin
    calls: list[type] = []
    real_backward = plugin.backward

    def counted(tensor, model, optimizer, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(type(plugin))
        real_backward(tensor, model, optimizer, *args, **kwargs)

    monkeypatch.setattr(plugin, "backward", counted)
    config = BatchingConfig.of(token_budget=512, num_workers=0)
    warmup = warmup_of(module, config, capacity_gib=64.0)
    warmup.on_fit_start(trainer, module)
    assert warmup.report is not None and warmup.report.token_budget == 512
    assert len(calls) == len(worst_case_shapes(config, MAX_SEQ_LEN))
    assert calls[0].__name__ == "MixedPrecision"
    assert all(p.grad is None for p in module.parameters())


@pytest.mark.parametrize("mode", ["bucketed", "oracle", "sorted"])
def test_planned_modes_are_checked_at_the_runs_lengths_and_every_planned_batch_fits_them(
    mode: str,
) -> None:
    """A length pass knows the shortest and longest training sample: the shapes are the
    bound at those lengths, and no batch of any epoch's plan exceeds it (rows, row length
    and padded tokens)."""
    import random

    from odb_lightning.lit.data.planned_mode import epoch_plan

    rng = random.Random(0)
    lengths = [min(900, max(12, int(rng.lognormvariate(5.0, 0.8)))) for _ in range(600)]
    config = BatchingConfig.of(mode=mode, token_budget=2048, num_workers=0)
    known = (min(lengths), max(lengths))
    shapes = worst_case_shapes(config, 1024, known)
    unknown = worst_case_shapes(config, 1024)
    assert max(s.tokens for s in shapes) == config.budget.padded_length(max(lengths)) < 1024
    assert max(s.tokens for s in unknown) == 1024  # without a length pass: max_seq_len
    plan = epoch_plan(lengths, config, len(lengths))
    for epoch in range(4):
        for batch in plan(epoch):
            rows, longest = len(batch), max(lengths[i] for i in batch)
            assert longest <= max(s.tokens for s in shapes)
            assert rows <= max(s.rows for s in shapes)
            assert rows * longest <= max(s.rows * s.tokens for s in shapes)


def test_the_warm_up_reads_the_length_range_at_fit_start() -> None:
    module = tiny_module(model_dtype="float32")
    config = BatchingConfig.of(mode="oracle", token_budget=512, num_workers=0)
    warmup = MemoryWarmup(
        capacity_gib=64.0,
        batching=config,
        max_seq_len=MAX_SEQ_LEN,
        vocab_size=module.model.config.vocab_size,
        length_range=lambda: (6, 40),
    )
    warmup.on_fit_start(fake_trainer(module), module)
    checked = {(m.shape.rows, m.shape.tokens) for m in warmup.report.measurements}
    # One sample, a full group of the longest, the group with the most tokens (16 x 32
    # fills the budget where 12 x 40 leaves 32 tokens), the most rows of the shortest.
    assert checked == {(1, 40), (512 // 40, 40), (16, 32), (512 // 6, 6)}


def test_image_text_runs_check_the_largest_image_batch_the_patch_budget_allows() -> None:
    """The largest image of the resize (``max_pixels``) in one max_seq_len sample, and as
    many of them as the token budget, the patch budget and the cap allow in one step; the
    warm-up runs them through the VLM's tower (the batch carries their patches)."""
    from helpers.vlm import tiny_vlm
    from odb_lightning.core.rows import ImageExtent
    from odb_lightning.data.vision import ImageSettings

    settings = ImageSettings(max_pixels=28 * 28 * 16, min_pixels=28 * 28)
    image = ImageExtent(settings.largest_grid, settings.merge_size)
    assert image.grid == (1, 8, 8) and (image.patches, image.tokens) == (64, 16)
    # 16 image tokens + 4 per sample: the token budget allows 512 // 20 = 25 rows, the
    # patch budget 200 // 64 = 3: three images of 64 patches, rows as long as 3 allow.
    config = BatchingConfig.of(token_budget=512, max_patches=200, num_workers=0)
    shapes = [s for s in worst_case_shapes(config, MAX_SEQ_LEN, None, image) if s.image_grid]
    assert [(s.rows, s.tokens) for s in shapes] == [(1, MAX_SEQ_LEN), (3, MAX_SEQ_LEN)]
    assert "3, 192 patches" in shapes[1].name
    module = tiny_vlm(model_dtype="float32")
    inputs = module.warmup_inputs(shapes[1], vocab_size=997)
    assert tuple(inputs["pixel_values"].shape) == (3 * 64, 3 * 2 * 14 * 14)
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8]] * 3
    assert int((inputs["input_ids"] == 997).sum()) == 3 * 16
    warmup = MemoryWarmup(
        capacity_gib=64.0,
        batching=config,
        max_seq_len=MAX_SEQ_LEN,
        vocab_size=997,
        largest_image=lambda: image,
    )
    warmup.on_fit_start(fake_trainer(module), module)
    checked = [m.shape for m in warmup.report.measurements]
    assert [s.rows for s in checked if s.image_grid] == [1, 3]
    assert all(p.grad is None for p in module.parameters())
