"""Throughput and per-step performance, logged in one place: the run's real tokens/s,
samples/s and padding efficiency (from the step counters), MFU from each step's own
shapes, tokens/s and samples/s per device, step and forward time mean/max over ranks;
logged every few steps and in ``summary.json``.

A step's model FLOPs come from its samples' own lengths (:class:`~odb_lightning.lit.model.flops.
ModelFlops`): ``6 N`` per real token, attention within each sample, the LM head on the
supervised tokens. Padding, attention across the samples of one row under a dense mask
and IDLE dummy batches are work the device does, not model FLOPs, so they lower the MFU.

Rates are over wall time (loader waits included) with every rank's counts summed, then
divided by the world size: ranks emit different batches here, so one rank's rate times the
world size (Lightning's ``ThroughputMonitor``) would be wrong. Lightning's ``Throughput``
meter is not used either: it requires every update to add samples, which an IDLE step
(no samples) does not.

Step time is a training batch's (a micro-batch under accumulation), from its start to its
end; under synchronous data parallelism every rank waits for the slowest in the gradient
reduction, so the ranks' step times come out nearly equal. The forward part (the batch's
start to its backward, before DDP reduces anything) is where ranks with more work differ:
``forward_time_max_s`` over ``forward_time_mean_s`` is the imbalance.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from odb_lightning.core.checks import check_positive, check_positive_int
from odb_lightning.lit.callbacks.counters import StepCounters
from odb_lightning.lit.callbacks.rank_gather import Counts
from odb_lightning.lit.callbacks.step_end import StepEndCallback
from odb_lightning.lit.model.flops import ModelFlops, peak_bf16_flops


class StepClock:
    """Training-step times and their forward parts (the batch's start to its backward):
    CUDA events on a GPU (no host sync per step; a window's events are read once, when it
    is taken), the host clock elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._marks: list[list[Any]] = []  # per step: start, forward end or None, end
        self._open: list[Any] | None = None

    def _now(self) -> Any:
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        self._open = [self._now(), None]

    def forward_done(self) -> None:
        if self._open is not None and self._open[1] is None:
            self._open[1] = self._now()

    def stop(self) -> None:
        if self._open is not None:
            self._marks.append([*self._open, self._now()])
            self._open = None

    def take(self) -> tuple[float, float, int]:
        """Seconds of the steps timed since the last take, seconds of their forward parts
        and the number of steps whose forward part was timed."""
        if self._cuda and self._marks:
            self._marks[-1][2].synchronize()

        def seconds(a: Any, b: Any) -> float:
            return a.elapsed_time(b) / 1000 if self._cuda else b - a

        step_s = sum(seconds(start, end) for start, _, end in self._marks)
        timed = [(start, forward) for start, forward, _ in self._marks if forward is not None]
        forward_s = sum(seconds(start, forward) for start, forward in timed)
        self._marks.clear()
        return step_s, forward_s, len(timed)


@dataclass
class Window(Counts):
    """One rank's counts over the steps since the last reduction (or over the run)."""

    wall_s: float = 0.0
    real_tokens: int = 0
    samples: int = 0
    model_flops: float = 0.0
    step_s: float = 0.0
    steps: int = 0
    forward_s: float = 0.0
    forward_steps: int = 0


def reduce_windows(windows: list[Window], peak_flops: float | None) -> dict[str, float]:
    """Per-device rates and step times of every rank's :class:`Window`.

    Tokens, samples and FLOPs are summed over ranks and divided by the slowest rank's wall
    time and the world size; ``step_time_mean_s``/``step_time_max_s`` are the mean and the
    max over ranks of each rank's mean step time (``forward_time_*`` likewise of the
    forward parts); ``mfu`` needs the device peak.
    """
    world = len(windows)
    wall_s = max(w.wall_s for w in windows)
    out: dict[str, float] = {}
    if wall_s > 0:
        out["tokens_per_s_per_device"] = sum(w.real_tokens for w in windows) / wall_s / world
        out["samples_per_s_per_device"] = sum(w.samples for w in windows) / wall_s / world
        flops_per_s = sum(w.model_flops for w in windows) / wall_s / world
        if flops_per_s > 0:
            out["model_tflops_per_s_per_device"] = flops_per_s / 1e12
            if peak_flops:
                out["mfu"] = flops_per_s / peak_flops
    for name, per_rank in (
        ("step", [w.step_s / w.steps for w in windows if w.steps]),
        ("forward", [w.forward_s / w.forward_steps for w in windows if w.forward_steps]),
    ):
        if per_rank:
            out[f"{name}_time_mean_s"] = statistics.fmean(per_rank)
            out[f"{name}_time_max_s"] = max(per_rank)
    return out


class StepMetricsCallback(StepEndCallback):
    """Logs ``perf/real_tokens_per_s``, ``perf/samples_per_s`` and
    ``odb/padding_efficiency`` of the run so far (from the first step, then every
    ``log_every_n_steps``), and ``perf/mfu``, ``perf/tokens_per_s_per_device``,
    ``perf/samples_per_s_per_device``, ``perf/model_tflops_per_s_per_device``,
    ``perf/step_time_{mean,max}_s`` and ``perf/forward_time_{mean,max}_s`` every
    ``log_every_n_steps`` training batches, and
    gives the whole run's figures to the summary (``summary.json`` and its table).

    Every rank counts its own steps and all ranks join one small all-gather at the same
    batch index (ranks run equal step counts), from ``on_train_batch_end``, which every
    rank reaches. The run's figures cover this process's training (since the resume, for a
    resumed run). On a device with no known peak (a CPU), MFU is left out.

    Args:
        log_every_n_steps: Training batches between logged windows (one all-gather each).
        peak_tflops: Dense bf16 peak of one device, TFLOP/s; ``None`` looks the device
            name up in :data:`~odb_lightning.lit.model.flops.PEAK_BF16_FLOPS`.
        counters: The run's step counters (the app hands them), whose whole-run rates are
            logged (one reduction each time); ``None`` logs the windows only. They must
            count a step before this callback sees it (the counters come first in the
            trainer's callbacks).
    """

    def __init__(
        self,
        log_every_n_steps: int = 10,
        peak_tflops: float | None = None,
        counters: StepCounters | None = None,
    ) -> None:
        check_positive_int("callbacks.step_metrics.log_every_n_steps", log_every_n_steps)
        check_positive("callbacks.step_metrics.peak_tflops", peak_tflops, "TFLOP/s", optional=True)
        self.log_every_n_steps = log_every_n_steps
        self.peak_tflops = peak_tflops
        self.counters = counters
        self._rates_logged = False
        self.peak_flops: float | None = None
        self.flops: ModelFlops | None = None
        self.window = Window()
        self.run = Window()
        self.last_logged: dict[str, float] = {}
        self._clock: StepClock | None = None
        self._span_start: float | None = None

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        device = pl_module.device
        self._clock = StepClock(device)
        self.flops = model_flops_of(pl_module)
        if self.peak_tflops is not None:
            self.peak_flops = self.peak_tflops * 1e12
        elif device.type == "cuda":
            self.peak_flops = peak_bf16_flops(torch.cuda.get_device_name(device))
            if self.peak_flops is None:
                rank_zero_warn(
                    f"no bf16 peak known for {torch.cuda.get_device_name(device)!r}: MFU is "
                    "not logged (set callbacks.step_metrics.peak_tflops)"
                )
        self._resume_span()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._resume_span()

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause_span()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause_span()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._resume_span()  # after a validation run mid-epoch
        if self._clock is not None:
            self._clock.start()

    @override
    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        if self._clock is not None:
            self._clock.forward_done()

    @override
    def on_step_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        if self._clock is not None:
            self._clock.stop()
        self.window.steps += 1
        meta = batch.meta
        if not meta.is_idle:
            self.window.samples += meta.local_samples
            self.window.real_tokens += meta.local_real_tokens
            if self.flops is not None:
                self.window.model_flops += self.flops.step(
                    step_lengths(meta), meta.local_loss_tokens
                )
        if (self.run.steps + self.window.steps) % self.log_every_n_steps == 0:
            self._log_window(trainer, pl_module)
        # From this process's first step on (the progress bar shows them), then every N
        # steps; every rank reaches the same step counts, so each one joins the reduction.
        counters = self.counters
        if counters is not None and (
            counters.totals.steps % self.log_every_n_steps == 0 or not self._rates_logged
        ):
            self._rates_logged = True
            self._log_run_rates(trainer, pl_module, counters)

    def _log_run_rates(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, counters: StepCounters
    ) -> None:
        totals, elapsed = counters.totals, counters.elapsed_s()
        local = torch.tensor(
            [totals.real_tokens, totals.padded_tokens, totals.samples],
            dtype=torch.float64,
            device=pl_module.device,
        )
        real, padded, samples = trainer.strategy.reduce(local, reduce_op="sum").tolist()
        pl_module.log("perf/real_tokens_per_s", real / elapsed, prog_bar=True, rank_zero_only=True)
        pl_module.log("perf/samples_per_s", samples / elapsed, prog_bar=True, rank_zero_only=True)
        efficiency = real / padded if padded else 0.0
        pl_module.log("odb/padding_efficiency", efficiency, rank_zero_only=True)

    def _log_window(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        windows = self._take_window().gather(trainer, pl_module)
        self.last_logged = reduce_windows(windows, self.peak_flops)
        bar = {"mfu", "tokens_per_s_per_device"}
        for name, value in self.last_logged.items():
            pl_module.log(f"perf/{name}", value, prog_bar=name in bar, rank_zero_only=True)

    def summary_entries(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """The run's figures (every rank calls it: one all-gather)."""
        self._take_window()
        windows = self.run.gather(trainer, pl_module)
        entries: dict[str, Any] = {"mfu": None, **reduce_windows(windows, self.peak_flops)}
        entries["peak_tflops_per_device"] = (
            None if self.peak_flops is None else self.peak_flops / 1e12
        )
        entries["step_time_s_per_rank"] = [w.step_s / w.steps if w.steps else None for w in windows]
        entries["model_flops"] = sum(w.model_flops for w in windows) or None
        return entries

    def _take_window(self) -> Window:
        """This rank's window so far (closing it); added to the run's counts."""
        now = time.perf_counter()
        if self._span_start is not None:
            self.window.wall_s += now - self._span_start
            self._span_start = now
        if self._clock is not None:
            step_s, forward_s, forward_steps = self._clock.take()
            self.window.step_s += step_s
            self.window.forward_s += forward_s
            self.window.forward_steps += forward_steps
        window, self.window = self.window, Window()
        self.run.add(window)
        return window

    def _resume_span(self) -> None:
        if self._span_start is None:
            self._span_start = time.perf_counter()

    def _pause_span(self) -> None:
        if self._span_start is not None:
            self.window.wall_s += time.perf_counter() - self._span_start
            self._span_start = None


def model_flops_of(pl_module: pl.LightningModule) -> ModelFlops | None:
    """The FLOPs model of ``pl_module.model``'s configuration, if it has a decoder's."""
    config = getattr(getattr(pl_module, "model", None), "config", None)
    needed = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    if config is None or not all(hasattr(config, name) for name in needed):
        rank_zero_warn("the model has no decoder configuration: model FLOPs and MFU not logged")
        return None
    return ModelFlops.of(config)


def step_lengths(meta: Any) -> tuple[int, ...]:
    """The step's sample lengths; the metadata must carry one per sample."""
    lengths = tuple(meta.sample_lengths)
    if len(lengths) != meta.local_samples:
        raise ValueError(
            f"step {meta.step} of epoch {meta.epoch}: StepMeta.sample_lengths has "
            f"{len(lengths)} lengths for {meta.local_samples} samples"
        )
    return lengths
