"""What the summary builder (:mod:`odb_lightning.lit.callbacks.summary`) collects, and from
whom: the data module's report of the run (:class:`RunReport`), the LightningModule's parameter
counts (:class:`ParameterCounts`) and compile report, and callbacks' own entries. The app
hands the builder each provider; nothing is looked up through the trainer."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Protocol, runtime_checkable

from odb_lightning.core.config import BatchingConfig
from odb_lightning.runtime.stats import EpochStats


class NoSupervisedTokensError(ValueError):
    """The training data has no supervised token: training would change nothing."""


@dataclass(frozen=True)
class LoaderCounters:
    """One rank's loader counters over every finished epoch (summed over ranks by the
    summary builder; ``alignment_rounds`` is the same on every rank, so it takes the max)."""

    dropped_samples: int = 0
    over_budget_samples: int = 0
    skipped_bad_samples: int = 0
    alignment_rounds: int = 0
    image_tokens: int = 0  # tokens standing for images in the emitted samples
    image_patches: int = 0  # ViT patches of the emitted samples' images
    over_patch_budget_samples: int = 0  # emitted alone: their patches alone > max_patches
    moved_samples: int = 0  # run by a rank that did not fetch them (cross_rank_grouping)
    moved_bytes: int = 0  # their serialized bytes

    @classmethod
    def of(cls, stats: list[EpochStats]) -> LoaderCounters:
        return cls(
            dropped_samples=sum(s.dropped for s in stats),
            over_budget_samples=sum(s.over_budget for s in stats),
            skipped_bad_samples=sum(len(s.skipped_ids) for s in stats),
            alignment_rounds=sum(s.rounds for s in stats),
            image_tokens=sum(s.image_tokens for s in stats),
            image_patches=sum(s.image_patches for s in stats),
            over_patch_budget_samples=sum(s.over_patch_budget for s in stats),
            moved_samples=sum(s.moved_samples for s in stats),
            moved_bytes=sum(s.moved_bytes for s in stats),
        )


@dataclass(frozen=True)
class RunReport:
    """This rank's view of the run, for the summary.

    Attributes:
        facts: What the run was (source, regime, max_seq_len, train samples, length
            cache time, source record counts).
        skipped_sample_ids: Dataset indices this rank skipped as bad samples.
        round_latency_s: This rank's alignment round latencies.
        first_epoch_records: The loader's own counts of this rank's first finished
            epoch (every training record once): ``unsupervised_samples`` and
            ``truncated_samples``, each where the loader counts it (summed over ranks
            by the summary builder, used where ``facts`` has no exact count).
    """

    batching: BatchingConfig
    facts: dict[str, Any] = field(default_factory=dict)
    counters: LoaderCounters = LoaderCounters()
    skipped_sample_ids: tuple[int, ...] = ()
    round_latency_s: tuple[float, ...] = ()
    first_epoch_records: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, batching: BatchingConfig, facts: dict[str, Any], stats: list[EpochStats]):
        first: dict[str, int] = {}
        if stats:
            counted = {"unsupervised_samples": stats[0].unsupervised}
            counted["truncated_samples"] = stats[0].truncated
            first = {name: n for name, n in counted.items() if n is not None}
        return cls(
            batching=batching,
            facts=facts,
            counters=LoaderCounters.of(stats),
            skipped_sample_ids=tuple(sorted(i for s in stats for i in s.skipped_ids)),
            round_latency_s=tuple(t for s in stats for t in s.round_latency_s),
            first_epoch_records=first,
        )

    def summary_facts(self) -> dict[str, Any]:
        """The summary's description of the run, with this rank's round latency."""
        facts = {"mode": self.batching.mode, **self.facts}
        facts["batching"] = _plain_settings(self.batching)
        latency_ms = sorted(1000 * t for t in self.round_latency_s)
        if latency_ms:
            facts["alignment_round_ms_median"] = statistics.median(latency_ms)
            # Nearest-rank percentile.
            facts["alignment_round_ms_p99"] = latency_ms[math.ceil(0.99 * len(latency_ms)) - 1]
        return facts


def _plain_settings(settings: Any) -> Any:
    """A configuration dataclass as nested plain values, shaped like its Hydra node."""
    if is_dataclass(settings):
        return {f.name: _plain_settings(getattr(settings, f.name)) for f in fields(settings)}
    return getattr(settings, "value", settings)


@runtime_checkable
class ReportsRun(Protocol):
    """A data module that reports its run (``ODBDataModule`` does)."""

    def run_report(self) -> RunReport: ...


@runtime_checkable
class AddsToSummary(Protocol):
    """A callback with entries of its own for the run summary (``StepMetricsCallback``:
    MFU, per-device rates, step times). Every rank calls it at the end of training, so
    it may run a collective."""

    def summary_entries(self, trainer: Any, pl_module: Any) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ParameterCounts:
    """The model of the run, for the summary's ``model`` block.

    Attributes:
        finetuning: ``full`` or ``lora``.
        trainable_parameters: Parameters the optimizer updates (whole, not one shard).
        total_parameters: Every parameter of the model, tied ones once.
    """

    finetuning: str
    trainable_parameters: int
    total_parameters: int

    @classmethod
    def of(cls, counts: Mapping[str, Any]) -> ParameterCounts:
        return cls(
            finetuning=str(counts["finetuning"]),
            trainable_parameters=int(counts["trainable_parameters"]),
            total_parameters=int(counts["total_parameters"]),
        )


@runtime_checkable
class ReportsCompile(Protocol):
    """A LightningModule that reports its ``torch.compile`` work (``CausalLMModule`` does):
    ``compile_graphs``, ``compile_recompiles`` and ``compile_s``, or ``None`` uncompiled."""

    def compile_report(self) -> Mapping[str, float] | None: ...


@runtime_checkable
class CountsParameters(Protocol):
    """A LightningModule that counts its model's parameters (``CausalLMModule`` does):
    ``finetuning``, ``trainable_parameters`` and ``total_parameters``."""

    def parameter_counts(self) -> Mapping[str, Any]: ...
