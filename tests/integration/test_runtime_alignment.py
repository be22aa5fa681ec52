"""Multi-rank alignment through real processes and a real Gloo channel.

Every test checks the DGAP guarantees with numbers: equal step counts, exactly-once
coverage (join) or exact dropped accounting (non-join), per-step global counts equal to
the sum of the ranks' local counts, and the emitted groups equal to ``core.simulate`` on
the same per-rank inputs (determinism).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.simulate import simulate
from testing.harness.datasets import SyntheticChatDataset, SyntheticPatchDataset
from testing.harness.ranks import RankJob, expected_dealt_steps, expected_steps, run_ranks

N_SAMPLES = 240
# Ranks are forked from a forkserver, whose children default to forkserver too: name the
# start method so that only the spawn tests pay for importing torch in every child.
# Dealt by need, the steps are compared with the simulator's, which deals by work: the
# fetch-aware shares (on by default with by_need) follow measured fetch times, which a
# loaded machine makes differ between ranks, so these runs deal by work; the test of
# fetch-aware dealing names it.
LOADER = {
    "token_budget": 600,
    "outstanding_depth": 32,
    "max_steps_per_round": 4,
    "multiprocessing_context": "fork",
    "fetch_aware_dealing": False,
}


def _job(**overrides: Any) -> RankJob:
    kwargs = {**LOADER, "num_workers": 2, **overrides.pop("loader", {})}
    fields = {"weights": (1, 3), "epochs": 2, **overrides}
    return RankJob(SyntheticChatDataset.seeded(N_SAMPLES), kwargs, **fields)


def _check_epoch(job: RankJob, ok: dict[int, list[dict[str, Any]]], epoch: int) -> None:
    world_size = len(ok)
    runs = [ok[rank][epoch] for rank in range(world_size)]
    steps = [[s["meta"] for s in run["steps"]] for run in runs]
    assert len({len(s) for s in steps}) == 1, "every rank runs the same number of steps"
    for position in range(len(steps[0])):
        metas = [rank_steps[position] for rank_steps in steps]
        assert {m.global_samples for m in metas} == {sum(m.local_samples for m in metas)}
        assert {m.global_loss_tokens for m in metas} == {sum(m.local_loss_tokens for m in metas)}
        assert len({(m.round_index, m.step, m.epoch) for m in metas}) == 1
    for run in runs:
        for record in run["steps"]:
            meta = record["meta"]
            assert record["loss_tokens"] == meta.local_loss_tokens
            if not meta.is_idle:
                assert record["shape"][0] * record["shape"][1] == meta.local_padded_tokens
                assert record["real_tokens"] == meta.local_real_tokens
    emitted = [[list(m.sample_ids) for m in rank_steps] for rank_steps in steps]
    assert emitted == expected_steps(job, world_size, epoch)
    for run, rank_steps in zip(runs, steps, strict=True):
        stats = run["stats"]
        assert stats.steps == len(rank_steps)
        assert stats.idle_steps == sum(m.is_idle for m in rank_steps)
        assert stats.emitted_samples == sum(m.local_samples for m in rank_steps)
        assert stats.emitted_samples + stats.dropped == len(run["shard"])
        assert stats.rounds == len(stats.round_latency_s) >= 2


def _check_join_coverage(ok: dict[int, list[dict[str, Any]]], epoch: int) -> None:
    emitted = Counter(
        i for rank in ok for s in ok[rank][epoch]["steps"] for i in s["meta"].sample_ids
    )
    assert sorted(emitted) == list(range(N_SAMPLES))
    assert set(emitted.values()) == {1}, "every sample exactly once across ranks"


def test_two_ranks_fork_join_matches_simulation_over_two_epochs() -> None:
    job = _job()
    outcome = run_ranks(job, world_size=2)
    assert outcome.errors == {}
    for epoch in range(2):
        _check_epoch(job, outcome.ok, epoch)
        _check_join_coverage(outcome.ok, epoch)
    assert any(s["meta"].is_idle for s in outcome.ok[0][0]["steps"]), "skew forces IDLE steps"


def test_patch_budget_two_ranks_matches_simulation() -> None:
    """Images' ViT patches travel with the observed lengths: at 2 ranks over Gloo the steps
    equal the simulator's with the same patch budget, every multi-sample step stays within
    both budgets, and the patch budget binds (more steps than tokens alone give)."""
    dataset = SyntheticPatchDataset.seeded(N_SAMPLES)
    job = RankJob(
        dataset, {**LOADER, "num_workers": 1, "max_patches": 700}, weights=(1, 3), epochs=1
    )
    outcome = run_ranks(job, world_size=2)
    assert outcome.errors == {}
    _check_epoch(job, outcome.ok, 0)
    _check_join_coverage(outcome.ok, 0)
    steps = [[s["meta"].sample_ids for s in outcome.ok[r][0]["steps"]] for r in range(2)]
    for ids in (ids for rank in steps for ids in rank if len(ids) > 1):
        assert sum(dataset.patches[i] for i in ids) <= 700
        assert len(ids) * max(dataset.lengths[i] for i in ids) <= LOADER["token_budget"]
    tokens_only = BatchingConfig.of(**{k: v for k, v in LOADER.items()})
    lengths = [[dataset.lengths[i] for i in range(N_SAMPLES)]]
    assert len(steps[0]) > 0
    assert len(simulate(lengths, tokens_only)[0]) < len(
        simulate(lengths, tokens_only, patches=[dataset.patches], max_patches=700)[0]
    )


def test_two_ranks_spawn_align() -> None:
    # The reference package's collate process never joins the group under spawn.
    job = _job(loader={"multiprocessing_context": "spawn", "num_workers": 1}, epochs=1)
    outcome = run_ranks(job, world_size=2)
    assert outcome.errors == {}
    _check_epoch(job, outcome.ok, 0)
    _check_join_coverage(outcome.ok, 0)


def test_two_ranks_non_join_counts_dropped_exactly() -> None:
    job = _job(loader={"join": False})
    outcome = run_ranks(job, world_size=2)
    assert outcome.errors == {}
    for epoch in range(2):
        _check_epoch(job, outcome.ok, epoch)
        assert sum(outcome.ok[r][epoch]["stats"].dropped for r in range(2)) > 0


def test_two_ranks_in_process_channel() -> None:
    job = _job(loader={"num_workers": 0})
    outcome = run_ranks(job, world_size=2)
    assert outcome.errors == {}
    for epoch in range(2):
        _check_epoch(job, outcome.ok, epoch)
        _check_join_coverage(outcome.ok, epoch)


def test_persistent_workers_keep_processes_over_three_epochs() -> None:
    job = _job(loader={"persistent_workers": True}, epochs=3)
    outcome = run_ranks(job, world_size=2)
    assert outcome.errors == {}
    for rank in range(2):
        pids = [run["pids"] for run in outcome.ok[rank]]
        assert len(pids[0]) == 3 and pids[0] == pids[1] == pids[2]
    for epoch in range(3):
        _check_epoch(job, outcome.ok, epoch)
        _check_join_coverage(outcome.ok, epoch)


@pytest.mark.parametrize("join", [True, False])
def test_four_ranks_skewed(join: bool) -> None:
    job = _job(loader={"join": join, "num_workers": 1}, weights=(1, 2, 3, 6))
    outcome = run_ranks(job, world_size=4)
    assert outcome.errors == {}
    for epoch in range(2):
        _check_epoch(job, outcome.ok, epoch)
        if join:
            _check_join_coverage(outcome.ok, epoch)


@pytest.mark.parametrize("world_size", [2, 4])
def test_window_sized_in_work_matches_simulation(world_size: int) -> None:
    # A window of 5 budgets' worth of work, asked for in several requests a round.
    loader = {"window_budgets": 5, "outstanding_depth": 96, "num_workers": 1}
    job = _job(loader=loader, weights=(1, 2, 3, 6)[:world_size], epochs=1)
    outcome = run_ranks(job, world_size=world_size)
    assert outcome.errors == {}
    _check_epoch(job, outcome.ok, 0)
    _check_join_coverage(outcome.ok, 0)


@pytest.mark.parametrize("emission_order", ["shuffled", "paired"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_dealt_by_need_matches_simulation(world_size: int, emission_order: str) -> None:
    # One global order dealt to windows of 4 budgets' worth of work: several deals a
    # round, rounds that only deal, and ranks topped up by need; each rank groups only
    # its own samples (test_cross_rank_grouping_moves_samples_and_matches_simulation
    # covers the default, which groups the tail across ranks).
    loader = {
        "window_budgets": 4,
        "shard_dealing": "by_need",
        "cross_rank_grouping": False,
        "num_workers": 1,
        "emission_order": emission_order,
    }
    for runs in _dealt_epochs_match_simulation(
        _job(loader=loader, weights=None, epochs=2), world_size
    ):
        assert all(run["stats"].moved_samples == 0 for run in runs)


def _dealt_epochs_match_simulation(job: RankJob, world_size: int) -> list[list[dict]]:
    """Run ``job`` dealt by need; every epoch's steps are the simulator's, every sample
    runs once, each rank's stats count what it emitted. Returns each epoch's runs."""
    outcome = run_ranks(job, world_size=world_size)
    assert outcome.errors == {}
    epochs = []
    for epoch in range(job.epochs):
        runs = [outcome.ok[rank][epoch] for rank in range(world_size)]
        emitted = [[list(s["meta"].sample_ids) for s in run["steps"]] for run in runs]
        assert emitted == expected_dealt_steps(job, world_size, epoch)
        assert len({len(steps) for steps in emitted}) == 1
        _check_join_coverage(outcome.ok, epoch)
        for run, steps in zip(runs, emitted, strict=True):
            assert run["stats"].emitted_samples == sum(map(len, steps))
        epochs.append(runs)
    return epochs


@pytest.mark.parametrize(("world_size", "max_steps"), [(2, 16), (4, 16), (2, 2)])
def test_cross_rank_grouping_moves_samples_and_matches_simulation(
    world_size: int, max_steps: int
) -> None:
    # The defaults group across ranks. Windows of 4 budgets' worth and up to 16 steps a
    # round: the epoch's last round pools the windows, and the samples it hands to other
    # ranks travel between them. Up to 2 steps a round: the tail's windows hold more than
    # 2 groups, so it pools in capped rounds.
    loader = {
        "window_budgets": 4,
        "shard_dealing": "by_need",
        "num_workers": 1,
        "max_steps_per_round": max_steps,
    }
    for runs in _dealt_epochs_match_simulation(
        _job(loader=loader, weights=None, epochs=2), world_size
    ):
        moved = [run["stats"].moved_samples for run in runs]
        assert sum(moved) > 0, "the pooled round moved no sample"
        assert all(run["stats"].moved_bytes > 0 for run, m in zip(runs, moved, strict=True) if m)


@pytest.mark.parametrize("dealing", ["fixed", "by_need"])
def test_ramped_windows_match_simulation(dealing: str) -> None:
    # The ramp on (1 then 4 budgets, then 16), workers fetching: the steps equal the
    # simulator's, and the first round emits fewer steps than the full windows do. Dealt
    # by need the rounds pool, and the ramp's last round emits the steps that train while
    # the full window refills and its first pooled round is planned: ceil((16 - 4) / 3).
    loader = {"window_budgets": 16, "ramp_budgets": 1, "shard_dealing": dealing}
    weights = (1, 3) if dealing == "fixed" else None
    job = _job(loader={**loader, "max_steps_per_round": 64}, weights=weights, epochs=1)
    outcome = run_ranks(job, world_size=2)
    assert outcome.errors == {}
    if dealing == "fixed":
        _check_epoch(job, outcome.ok, 0)
    else:
        emitted = [[list(s["meta"].sample_ids) for s in outcome.ok[r][0]["steps"]] for r in (0, 1)]
        assert emitted == expected_dealt_steps(job, 2, 0)
    _check_join_coverage(outcome.ok, 0)
    rounds = Counter(s["meta"].round_index for s in outcome.ok[0][0]["steps"])
    per_round = [rounds[r] for r in sorted(rounds)]
    assert per_round[0] <= 2 < 8 <= max(per_round), per_round
    assert per_round[:2] == ([1, 4] if dealing == "by_need" else [1, 1]), per_round


@pytest.mark.slow
def test_four_ranks_spawn_persistent() -> None:
    job = _job(
        loader={"multiprocessing_context": "spawn", "num_workers": 1, "persistent_workers": True},
        weights=(3, 1, 2, 1),
    )
    outcome = run_ranks(job, world_size=4)
    assert outcome.errors == {}
    for epoch in range(2):
        _check_epoch(job, outcome.ok, epoch)
        _check_join_coverage(outcome.ok, epoch)


def test_dealing_that_sees_fetch_time_hands_a_slow_ranks_share_to_the_fast_one() -> None:
    # Rank 1's samples take 0.1 s each, rank 0's none: dealt by fetch time, rank 0 runs
    # more of the epoch; every sample still runs once, on equal step counts.
    loader = {"shard_dealing": "by_need", "num_workers": 1, "fetch_aware_dealing": True}
    job = RankJob(
        SyntheticChatDataset.seeded(N_SAMPLES),
        {**LOADER, **loader},
        rank_delays={1: 0.1},
    )
    outcome = run_ranks(job, world_size=2)
    assert outcome.errors == {}
    _check_join_coverage(outcome.ok, 0)
    runs = [outcome.ok[rank][0] for rank in range(2)]
    assert len({len(run["steps"]) for run in runs}) == 1
    ran = [run["stats"].emitted_samples for run in runs]
    assert sum(ran) == N_SAMPLES and ran[0] > ran[1], ran
