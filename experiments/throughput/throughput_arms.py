"""The benchmark's data and its arms: one loader per batching mode over the same samples.

Every arm yields the model inputs of one step at a time (a dict of tensors), so one
training loop (``run.py``) drives all of them: our ``PlannedLoader`` (standard, sorted,
bucketed, oracle), our ``ODBLoader`` (odb, odb_packed) and the reference package's
``ODBDataLoader`` (``online-dynamic-batching==0.1.2``, imported here only, as a
comparator).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset, Subset

from odb_lightning.core.config import BatchingConfig
from odb_lightning.data import ChatDataset, LengthStats, load_source, load_tokenizer
from odb_lightning.lit.data.planned_mode import epoch_plan
from odb_lightning.runtime import ODBLoader
from odb_lightning.runtime.batch import pad_collate
from odb_lightning.runtime.planned import PlannedLoader

ARMS = (
    "standard_bs8",
    "standard_p99",
    "sorted",
    "bucketed",
    "oracle",
    "odb",
    "odb_packed",
    "reference",
)
EXTRA_ARMS = ("odb_no_ramp",)  # on request (--arms): odb with the window ramp off
REGIMES = {  # name: (source, ShareGPT regime)
    "whole": ("sharegpt", "whole"),
    "first_exchange": ("sharegpt", "first_exchange"),
    "mix": ("sharegpt", "mix"),
    "chitchat": ("chitchat", "whole"),
}
IGNORE_INDEX = -100


@dataclass
class BenchData:
    """The samples of one regime and what the length-pass arms may know about them.

    Attributes:
        regime: Regime name.
        dataset: ChatML + Qwen2.5 tokenization per item (in the loader workers).
        lengths: Exact token length of every benchmark sample.
        loss_tokens: Supervised tokens (shifted ``labels != -100``) of every sample.
        population: Length statistics of the regime (the larger seeded draw the
            benchmark samples are the first part of); ``standard_p99`` is sized from it.
    """

    regime: str
    dataset: Dataset
    lengths: list[int]
    loss_tokens: list[int]
    population: LengthStats

    def head(self, num_samples: int) -> BenchData:
        """The first ``num_samples`` samples (a seeded random draw too)."""
        return BenchData(
            self.regime,
            Subset(self.dataset, range(num_samples)),
            self.lengths[:num_samples],
            self.loss_tokens[:num_samples],
            self.population,
        )


def load_bench_data(
    regime: str, num_samples: int | None, population: int | None, max_seq_len: int, seed: int
) -> BenchData:
    """A seeded random draw of the regime's conversations of at most ``max_seq_len`` tokens.

    Records are visited in a seeded random order and tokenized; longer ones are left out
    (the SPEC's profiles are measured that way). The first ``population`` kept records give
    the regime's length statistics; the first ``num_samples`` of them are the benchmark.
    ``None`` takes every record of the regime.
    """
    source, sharegpt_regime = REGIMES[regime]
    records = load_source(source, regime=sharegpt_regime, seed=seed).records
    tokenizer = load_tokenizer()
    everything = ChatDataset(records, tokenizer, max_seq_len=10 * max_seq_len)
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    kept: list[int] = []
    lengths: list[int] = []
    loss_tokens: list[int] = []
    wanted = None if None in (population, num_samples) else max(population, num_samples)
    for index in order:
        sample = everything[index]
        length = sample["input_ids"].numel()
        if length > max_seq_len:
            continue
        kept.append(index)
        lengths.append(length)
        loss_tokens.append(int((sample["labels"][1:] != IGNORE_INDEX).sum()))
        if len(kept) == wanted:
            break
    stats = LengthStats.of(lengths)
    chosen = [records[i] for i in kept[:num_samples]]
    return BenchData(
        regime=regime,
        dataset=ChatDataset(chosen, tokenizer, max_seq_len=max_seq_len),
        lengths=lengths[:num_samples],
        loss_tokens=loss_tokens[:num_samples],
        population=stats,
    )


@dataclass(frozen=True)
class ArmSettings:
    """What every arm shares."""

    token_budget: int
    outstanding_depth: int
    num_workers: int
    max_seq_len: int
    pad_id: int
    seed: int
    attention_weight: float | None = None
    """Our online loader's ``batching.rows.attention_weight``: ``None`` counts tokens, as
    a loader built without a model does; ``end_to_end.py`` passes the model's own weight,
    as ``train.py`` resolves it."""


def p99_batch_size(data: BenchData, token_budget: int) -> int:
    """The fixed batch size whose batches of p99-long samples fit the budget."""
    return max(1, token_budget // data.population.p99)


def _planned(data: BenchData, settings: ArmSettings, batching: BatchingConfig) -> PlannedLoader:
    plan = epoch_plan(data.lengths, batching, len(data.lengths))
    return PlannedLoader(
        data.dataset,
        plan,
        batching,
        pad_id=settings.pad_id,
        max_seq_len=settings.max_seq_len,
        loss_tokens=data.loss_tokens,
    )


def _ours(loader: Any) -> Iterator[dict[str, Any]]:
    """Model inputs of our loaders' batches (single process: never IDLE)."""
    try:
        for batch in loader:
            yield batch.inputs
    finally:
        loader.close()


def reference_batches(
    data: BenchData, settings: Any, sampler: Any = None
) -> Iterator[dict[str, Any]]:
    """The reference package's loader with our budget, depth, workers and pad collate
    (``settings``: anything with those fields and the seed; ``sampler``: a rank's sampler,
    which the package needs to shard; default a seeded shuffle).

    ``buffer_size`` is its grouping window and its outstanding-request cap (it requests
    ``max(prefetch_factor * num_workers, buffer_size)`` samples), i.e. our
    ``outstanding_depth``. ``no_warmup=True``: by default its window grows from 0 to
    ``buffer_size`` in steps of 5 % over the first 20 rounds; without it the two windows
    are the same size from the start.
    """
    import odb  # the comparator: imported only by this benchmark

    loader = odb.ODBDataLoader(
        data.dataset,
        token_budget=settings.token_budget,
        buffer_size=settings.outstanding_depth,
        no_warmup=True,
        num_workers=settings.num_workers,
        collate_fn=functools.partial(pad_collate, pad_id=settings.pad_id),
        **(
            {"sampler": sampler}
            if sampler is not None
            else {"shuffle": True, "generator": torch.Generator().manual_seed(settings.seed)}
        ),
    )
    for batch in loader:
        odb.pop_step_info(batch, loss_scaling="none")  # strips its metadata keys
        yield batch


def make_arm(
    arm: str, data: BenchData, settings: ArmSettings
) -> Callable[[], Iterator[dict[str, Any]]]:
    """``start()`` for one arm: builds its loader and yields one epoch of model inputs."""
    budget = settings.token_budget

    def batching(mode: str, **knobs: Any) -> BatchingConfig:
        return BatchingConfig.of(
            mode=mode,
            token_budget=budget,
            seed=settings.seed,
            num_workers=settings.num_workers,
            **knobs,
        )

    planned = {
        "standard_bs8": batching("standard", batch_size=8),
        "standard_p99": batching("standard", batch_size=p99_batch_size(data, budget)),
        "sorted": batching("sorted", batch_size=8),
        "bucketed": batching("bucketed", num_buckets=6, max_batch_size=64),
        "oracle": batching("oracle"),
    }
    if arm in planned:
        return lambda: _ours(_planned(data, settings, planned[arm]))
    if arm in ("odb", "odb_packed", "odb_no_ramp"):
        ramp = {"ramp_budgets": None} if arm == "odb_no_ramp" else {}
        config = batching(
            arm.removesuffix("_no_ramp"),
            outstanding_depth=settings.outstanding_depth,
            attention_weight=settings.attention_weight,
            **ramp,
        )

        def online() -> Iterator[dict[str, Any]]:
            loader = ODBLoader(
                data.dataset, config, max_seq_len=settings.max_seq_len, pad_id=settings.pad_id
            )
            return _ours(loader)

        return online
    if arm == "reference":
        return lambda: reference_batches(data, settings)
    raise ValueError(f"unknown arm {arm!r}; arms: {', '.join(ARMS + EXTRA_ARMS)}")
