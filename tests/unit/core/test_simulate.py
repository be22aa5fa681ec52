"""Guarantees of the DGAP protocol, checked on the simulator (which runs the production
window and alignment code) over random rank counts, skewed shards, windows and budgets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.order import make_rng
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.simulate import simulate, simulate_dealt_epoch, simulate_epoch
from odb_lightning.core.sync import group_cost


@st.composite
def jobs(draw: st.DrawFn) -> dict:
    """Per-rank length lists with skew: ranks differ in size and in length scale."""
    num_ranks = draw(st.integers(1, 64))
    seed = draw(st.integers(0, 2**16))
    rng = make_rng(seed, "job")
    rank_lengths = []
    for _ in range(num_ranks):
        size = rng.choice([0, 1, rng.randint(2, 12), rng.randint(10, 60)])
        scale = rng.choice([8, 64, 512])
        rank_lengths.append([rng.randint(1, scale) for _ in range(size)])
    return {
        "rank_lengths": rank_lengths,
        "loss_tokens": [[rng.randint(0, n) for n in lengths] for lengths in rank_lengths],
        "token_budget": draw(st.sampled_from([16, 100, 512, 2048])),
        "window": draw(st.integers(1, 40)),
        "window_budgets": draw(st.one_of(st.none(), st.integers(1, 6))),
        "ramp_budgets": draw(st.one_of(st.none(), st.integers(1, 3))),
        # A byte cap of a few samples' worth (each 1-64 KiB) or none.
        "window_max_mib": draw(st.sampled_from([None, 1 / 64, 1 / 8, 1.0])),
        "sample_bytes": [[rng.randint(1, 64) * 1024 for _ in lengths] for lengths in rank_lengths],
        "max_steps_per_round": draw(st.integers(1, 8)),
        "emission_order": draw(st.sampled_from(["shuffled", "paired"])),
        "seed": seed,
    }


def job_settings(job: dict, *, join: bool, **extra: object) -> BatchingConfig:
    """The batching settings a drawn job describes (``extra``: further knobs)."""
    return BatchingConfig.of(
        token_budget=job["token_budget"],
        outstanding_depth=job["window"],
        window_budgets=job.get("window_budgets"),
        ramp_budgets=job.get("ramp_budgets"),
        window_max_mib=job.get("window_max_mib"),
        max_steps_per_round=job["max_steps_per_round"],
        emission_order=job.get("emission_order", "shuffled"),
        join=join,
        seed=job["seed"],
        **extra,
    )


def run(job: dict, *, join: bool):
    settings_ = job_settings(job, join=join)
    return simulate_epoch(
        job["rank_lengths"],
        settings_,
        loss_tokens=job["loss_tokens"],
        sample_bytes=job.get("sample_bytes"),
    )


def check_steps_aligned(result, job: dict) -> None:
    counts = {len(rank_steps) for rank_steps in result.steps}
    assert len(counts) == 1, f"unequal step counts {counts}"
    for position in range(counts.pop()):
        column = [rank_steps[position] for rank_steps in result.steps]
        sizes = [0 if s.group is None else s.group.size for s in column]
        losses = [0 if s.group is None else s.group.num_loss_tokens for s in column]
        assert all(s.global_samples == sum(sizes) for s in column)
        assert all(s.global_loss_tokens == sum(losses) for s in column)
        assert sum(sizes) > 0, "a step position where every rank is IDLE"
    for rank, rank_steps in enumerate(result.steps):
        for step in rank_steps:
            if step.group is not None and step.group.size > 1:
                longest = max(job["rank_lengths"][rank][s.sample_id] for s in step.group.samples)
                assert step.group.size * longest <= job["token_budget"]
    check_costs_paired(result, job["token_budget"])


def check_costs_paired(result, token_budget: int) -> None:
    """Within a round every rank's steps are in the same cost order: wherever one rank's
    step at one position costs more than at another, no rank's costs less there."""
    budget = BatchingConfig.of(token_budget=token_budget).budget
    rounds: dict[int, list[list[float]]] = {}
    for rank_steps in result.steps:
        for step in rank_steps:
            row = rounds.setdefault(step.round_index, [])
            if step.index_in_round == 0:
                row.append([])
            row[-1].append(group_cost(step.group, budget))
    for round_index, rows in rounds.items():
        for p in range(len(rows[0])):
            for q in range(len(rows[0])):
                if any(row[p] > row[q] for row in rows):
                    assert all(row[p] >= row[q] for row in rows), f"round {round_index}"


@settings(max_examples=80, deadline=None)
@given(jobs())
def test_join_emits_every_sample_exactly_once_with_equal_steps(job: dict) -> None:
    result = run(job, join=True)
    check_steps_aligned(result, job)
    for rank, rank_steps in enumerate(result.steps):
        ids = sorted(s.sample_id for st_ in rank_steps if st_.group for s in st_.group.samples)
        assert ids == list(range(len(job["rank_lengths"][rank])))
    assert result.dropped == [0] * len(job["rank_lengths"])
    total = sum(len(lengths) for lengths in job["rank_lengths"])
    assert result.rounds <= total + 1


@settings(max_examples=80, deadline=None)
@given(jobs())
def test_non_join_accounts_for_every_sample(job: dict) -> None:
    result = run(job, join=False)
    check_steps_aligned(result, job)
    for rank, rank_steps in enumerate(result.steps):
        ids = [s.sample_id for st_ in rank_steps if st_.group for s in st_.group.samples]
        assert len(ids) == len(set(ids))
        assert len(ids) + result.dropped[rank] == len(job["rank_lengths"][rank])
    if any(not lengths for lengths in job["rank_lengths"]):
        assert all(not rank_steps for rank_steps in result.steps)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(jobs())
def test_same_seed_same_plan(job: dict) -> None:
    kwargs = {
        "token_budget": job["token_budget"],
        "outstanding_depth": job["window"],
        "seed": job["seed"],
        "max_steps_per_round": job["max_steps_per_round"],
    }
    assert simulate(job["rank_lengths"], **kwargs) == simulate(job["rank_lengths"], **kwargs)


def test_step_order_changes_with_the_seed() -> None:
    lengths = [[(i * 37) % 97 + 1 for i in range(200)]]
    a = simulate(lengths, token_budget=400, outstanding_depth=64, seed=1)
    b = simulate(lengths, token_budget=400, outstanding_depth=64, seed=2)
    assert sorted(map(sorted, a[0])) == sorted(map(sorted, b[0])) and a != b


def test_over_budget_sample_is_its_own_step_and_counted() -> None:
    result = simulate_epoch(
        [[5, 50, 4, 3]], BatchingConfig.of(token_budget=16, outstanding_depth=4)
    )
    groups = [sorted(s.sample_id for s in st_.group.samples) for st_ in result.steps[0]]
    assert [1] in groups
    assert result.over_budget == [1]


@pytest.mark.slow
def test_1024_ranks_align_and_cover_every_sample() -> None:
    # How long the plan takes per round at this scale: experiments/scale (no timed
    # assertion here: a loaded machine says nothing about the code).
    rng = make_rng(7, "scale")
    rank_lengths = [
        [max(1, min(4096, int(rng.lognormvariate(6.9, 0.5)))) for _ in range(200)]
        for _ in range(1024)
    ]
    result = simulate_epoch(
        rank_lengths, BatchingConfig.of(token_budget=16384, outstanding_depth=64)
    )
    job = {"rank_lengths": rank_lengths, "token_budget": 16384}
    check_steps_aligned(result, job)
    for rank_steps in result.steps:
        ids = sorted(s.sample_id for st_ in rank_steps if st_.group for s in st_.group.samples)
        assert ids == list(range(200))


@settings(max_examples=60, deadline=None)
@given(jobs())
def test_packed_groups_fit_a_real_token_budget_and_cover_every_sample(job: dict) -> None:
    settings_ = BatchingConfig.of(
        token_budget=job["token_budget"],
        outstanding_depth=job["window"],
        max_steps_per_round=job["max_steps_per_round"],
        seed=job["seed"],
        mode="odb_packed",
    )
    result = simulate_epoch(job["rank_lengths"], settings_, loss_tokens=job["loss_tokens"])
    assert len({len(rank_steps) for rank_steps in result.steps}) == 1
    for rank, rank_steps in enumerate(result.steps):
        lengths = job["rank_lengths"][rank]
        groups = [[s.sample_id for s in st_.group.samples] for st_ in rank_steps if st_.group]
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for group in groups:
            assert len(group) == 1 or sum(lengths[i] for i in group) <= job["token_budget"]


def run_dealt(job: dict, *, join: bool):
    """The job's samples as one global order dealt by need over its ranks."""
    settings_ = job_settings(job, join=join, shard_dealing="by_need")
    lengths = [n for rank in job["rank_lengths"] for n in rank]
    losses = [n for rank in job["loss_tokens"] for n in rank]
    sizes = [n for rank in job["sample_bytes"] for n in rank]
    world = len(job["rank_lengths"])
    result = simulate_dealt_epoch(lengths, world, settings_, loss_tokens=losses, sample_bytes=sizes)
    return result, lengths


@settings(max_examples=80, deadline=None)
@given(jobs())
def test_dealt_by_need_emits_every_sample_exactly_once_with_equal_steps(job: dict) -> None:
    result, lengths = run_dealt(job, join=True)
    dealt_job = {"rank_lengths": [lengths] * len(result.steps), "token_budget": job["token_budget"]}
    check_steps_aligned(result, dealt_job)
    ids = sorted(
        s.sample_id for rank in result.steps for st_ in rank if st_.group for s in st_.group.samples
    )
    assert ids == list(range(len(lengths)))
    assert result.dropped == [0] * len(result.steps)
    assert result.rounds <= 2 * len(lengths) + 2


@settings(max_examples=60, deadline=None)
@given(jobs())
def test_dealt_by_need_non_join_accounts_for_every_sample(job: dict) -> None:
    result, lengths = run_dealt(job, join=False)
    ids = [
        s.sample_id for rank in result.steps for st_ in rank if st_.group for s in st_.group.samples
    ]
    assert len(ids) == len(set(ids))
    assert len(ids) + sum(result.dropped) == len(lengths)
    assert len({len(rank) for rank in result.steps}) == 1


@settings(max_examples=30, deadline=None)
@given(jobs())
def test_dealt_by_need_same_seed_same_plan(job: dict) -> None:
    first, _ = run_dealt(job, join=True)
    again, _ = run_dealt(job, join=True)
    assert [[s.group for s in rank] for rank in first.steps] == [
        [s.group for s in rank] for rank in again.steps
    ]


def test_dealt_by_need_balances_heavy_shards() -> None:
    # Every 8th sample is 40x longer: fixed shards give one rank all of them.
    lengths = [400 if i % 8 == 0 else 10 for i in range(800)]
    fixed = simulate_epoch(
        [lengths[r::8] for r in range(8)], BatchingConfig.of(token_budget=800, window_budgets=4)
    )
    dealt = simulate_dealt_epoch(
        lengths, 8, BatchingConfig.of(token_budget=800, window_budgets=4, shard_dealing="by_need")
    )
    assert fixed.sync.idle_fraction > 0.5
    assert dealt.sync.idle_fraction < 0.1
    assert len(dealt.steps[0]) < 0.6 * len(fixed.steps[0])


@pytest.mark.parametrize("world", [2, 8, 64])
def test_dealt_by_need_ends_the_epoch_with_level_work(world: int) -> None:
    # One window holds a whole share of the epoch (no ramp), so every sample is dealt
    # before the first step: only the deal decides each rank's work. Heavy tail:
    # lognormal, CV 1.5.
    lengths = lognormal_lengths(40 * world, 600, 1.5, seed=world, max_len=4096)
    # The deal alone: the tail is not grouped across ranks (that hands its groups out
    # level in padded cost, not in real tokens).
    config = BatchingConfig.of(
        token_budget=8192,
        window_budgets=64,
        ramp_budgets=None,
        shard_dealing="by_need",
        cross_rank_grouping=False,
    )
    result = simulate_dealt_epoch(lengths, world, config)
    work = [
        sum(s.length for step in rank if step.group for s in step.group.samples)
        for rank in result.steps
    ]
    # The deals level the ranks' work to within about the costliest sample (the last
    # deals are single samples); equal counts (every W-th sample) leave them further apart.
    assert max(work) - min(work) <= 2 * max(lengths)
    counts = [sum(lengths[r::world]) for r in range(world)]
    if world >= 8:
        assert max(work) - min(work) < 0.5 * (max(counts) - min(counts))
