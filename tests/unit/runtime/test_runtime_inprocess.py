"""``ODBLoader`` with ``num_workers=0``: the whole pipeline in the calling process."""

from __future__ import annotations

import pytest
import torch

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.order import epoch_permutation, shard_indices
from odb_lightning.core.simulate import simulate, simulate_dealt_epoch
from odb_lightning.runtime import BadSampleError, ODBLoader, SampleFetchError
from odb_lightning.runtime.messages import FetchRequest
from odb_lightning.runtime.worker import fetch_sample


class LengthDataset:
    """Sample ``i`` has ``lengths[i]`` tokens; the first half is an unsupervised prompt."""

    def __init__(self, lengths: list[int], bad: frozenset[int] = frozenset()) -> None:
        self.lengths = lengths
        self.bad = bad

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index in self.bad:
            return {"input_ids": torch.ones(self.lengths[index])}  # float: a bad sample
        if self.lengths[index] == 0:
            raise KeyError(f"no sample {index}")
        input_ids = torch.arange(self.lengths[index])
        labels = input_ids.clone()
        labels[: self.lengths[index] // 2] = -100
        return {"input_ids": input_ids, "labels": labels}

    def num_loss_tokens(self, index: int) -> int:
        return self.lengths[index] - max(1, self.lengths[index] // 2)


def _lengths(n: int, seed: int = 0) -> list[int]:
    return torch.randint(1, 400, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("epoch", [0, 3])
def test_single_rank_matches_simulation(epoch: int) -> None:
    dataset = LengthDataset(_lengths(300))
    with ODBLoader(
        dataset,
        token_budget=800,
        outstanding_depth=48,
        num_workers=0,
        seed=5,
        shard_dealing="fixed",
    ) as loader:
        loader.set_epoch(epoch)
        batches = list(loader)
    order = shard_indices(300, 1, 0, 5, epoch)
    expected = simulate(
        [[dataset.lengths[i] for i in order]],
        token_budget=800,
        outstanding_depth=48,
        seed=5,
        loss_tokens=[[dataset.num_loss_tokens(i) for i in order]],
        epoch=epoch,
    )[0]
    assert [list(b.meta.sample_ids) for b in batches] == [[order[p] for p in s] for s in expected]
    assert [b.meta.step for b in batches] == list(range(len(batches)))
    for batch in batches:
        meta = batch.meta
        assert batch.inputs["input_ids"].numel() == meta.local_padded_tokens <= 800
        assert meta.global_loss_tokens == meta.local_loss_tokens
    stats = loader.last_epoch_stats
    assert stats is not None and stats.epoch == epoch
    assert (stats.emitted_samples, stats.steps, stats.idle_steps, stats.dropped) == (
        300,
        len(batches),
        0,
        0,
    )


def test_byte_capped_window_dealt_by_need_matches_simulation() -> None:
    # Samples of 1-400 tokens serialize to about 6 KiB at most: a 64 KiB cap holds a
    # few dozen, far fewer than 16 budgets of 800 tokens, so the cap sizes every window.
    dataset = LengthDataset(_lengths(300, seed=2))
    knobs = {"token_budget": 800, "window_budgets": 16, "window_max_mib": 1 / 16, "seed": 3}
    with ODBLoader(dataset, num_workers=0, **knobs) as loader:
        loader.set_epoch(1)
        batches = list(loader)
    order = epoch_permutation(300, 3, 1)
    sizes = [
        len(fetch_sample(dataset, FetchRequest(0, i, 1), "raise", None).payload) for i in order
    ]
    config = BatchingConfig.of(**knobs)
    capped = simulate_dealt_epoch(
        [dataset.lengths[i] for i in order],
        1,
        config,
        loss_tokens=[dataset.num_loss_tokens(i) for i in order],
        epoch=1,
        sample_bytes=sizes,
    )
    expected = [[order[s.sample_id] for s in step.group.samples] for step in capped.steps[0]]
    assert [list(b.meta.sample_ids) for b in batches] == expected
    uncapped = simulate_dealt_epoch([dataset.lengths[i] for i in order], 1, config, epoch=1)
    assert capped.rounds > uncapped.rounds, "the cap made the windows smaller"


def test_abandoned_epoch_restarts_cleanly() -> None:
    dataset = LengthDataset(_lengths(120))
    with ODBLoader(dataset, token_budget=800, outstanding_depth=16, num_workers=0) as loader:
        partial = iter(loader)
        next(partial)
        full = [i for batch in loader for i in batch.meta.sample_ids]
    assert sorted(full) == list(range(120))
    loader.close()  # a second close is harmless
    with pytest.raises(RuntimeError, match="this ODBLoader is closed"):
        iter(loader)


def test_bad_samples_skip_and_raise() -> None:
    dataset = LengthDataset(_lengths(80), bad=frozenset({4, 40}))
    with ODBLoader(dataset, token_budget=800, num_workers=0, on_bad_sample="skip") as loader:
        emitted = sorted(i for batch in loader for i in batch.meta.sample_ids)
    assert emitted == sorted(set(range(80)) - {4, 40})
    assert loader.last_epoch_stats is not None
    assert sorted(loader.last_epoch_stats.skipped_ids) == [4, 40]
    with (
        ODBLoader(dataset, token_budget=800, num_workers=0) as loader,
        pytest.raises(BadSampleError, match=r"sample (4|40): field 'input_ids' must have an int"),
    ):
        list(loader)


def test_dataset_error_names_index_and_original_exception() -> None:
    lengths = _lengths(50)
    lengths[17] = 0
    with (
        ODBLoader(LengthDataset(lengths), token_budget=800, num_workers=0) as loader,
        pytest.raises(SampleFetchError, match=r"dataset\[17\] raised KeyError: 'no sample 17'"),
    ):
        list(loader)


def test_non_join_single_rank_emits_everything_and_custom_collate() -> None:
    dataset = LengthDataset(_lengths(64))

    def count_rows(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {"rows": torch.tensor(len(samples))}

    with ODBLoader(
        dataset, token_budget=800, num_workers=0, join=False, collate_fn=count_rows
    ) as loader:
        batches = list(loader)
    assert sum(int(b.inputs["rows"]) for b in batches) == 64
    assert loader.last_epoch_stats is not None and loader.last_epoch_stats.dropped == 0


def test_dealt_by_need_the_refill_is_dealt_before_the_steps_are_collated(monkeypatch) -> None:
    from odb_lightning.runtime.engine import EpochRunner

    events: list[tuple[str, int]] = []
    align, collate = EpochRunner._align, EpochRunner._collate

    def logged_align(self, window, log):
        outcome = align(self, window, log)
        events.append(("round", len(outcome.steps)))
        return outcome

    def logged_collate(self, step, log):
        events.append(("collate", step.round_index))
        return collate(self, step, log)

    monkeypatch.setattr(EpochRunner, "_align", logged_align)
    monkeypatch.setattr(EpochRunner, "_collate", logged_collate)
    dataset = LengthDataset(_lengths(300, seed=4))
    with ODBLoader(dataset, token_budget=800, window_budgets=4, num_workers=0) as loader:
        assert sorted(i for b in loader for i in b.meta.sample_ids) == list(range(300))
    rounds = [i for i, (kind, _) in enumerate(events) if kind == "round"]
    emitting = [i for i in rounds if events[i][1] > 0]
    assert len(emitting) > 1, "several windows in the epoch"
    for i in emitting[:-1]:
        # The next event after an emitting round is the round that deals the refill.
        assert events[i + 1] == ("round", 0), events[i : i + 3]
