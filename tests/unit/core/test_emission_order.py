"""The order a round's aligned step positions are emitted in: a seeded permutation that
every rank draws alike, uniform (``shuffled``) or costliest-next-to-cheapest (``paired``);
either way the round's groups, and so the utilization, are those of the cost-ranked plan."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.order import emission_order, make_rng
from odb_lightning.core.profiles import lognormal_lengths
from odb_lightning.core.simulate import simulate_dealt_epoch
from odb_lightning.core.sync import sync_figures


@pytest.mark.parametrize("paired", [False, True])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 8, 17, 128])
def test_every_position_is_emitted_once_and_ranks_agree(n: int, paired: bool) -> None:
    order = emission_order(n, make_rng(3, "round", 0, 5), paired=paired)
    assert sorted(order) == list(range(n))
    assert order == emission_order(n, make_rng(3, "round", 0, 5), paired=paired)


def test_shuffled_is_the_seeded_shuffle_of_the_positions() -> None:
    expected = list(range(40))
    make_rng(9, "round", 1, 2).shuffle(expected)
    assert emission_order(40, make_rng(9, "round", 1, 2), paired=False) == expected


@pytest.mark.parametrize("n", [2, 7, 64, 129])
def test_paired_emits_the_costliest_next_to_the_cheapest(n: int) -> None:
    order = emission_order(n, make_rng(1, "round", 0, 0), paired=True)
    # Walk the order in units: a pair (i, n - 1 - i) back to back, or the odd median.
    units, k = [], 0
    while k < len(order):
        if n % 2 and order[k] == n // 2:
            units.append((order[k],))
            k += 1
        else:
            units.append(tuple(sorted(order[k : k + 2])))
            k += 2
    assert sorted(units) == sorted(
        [(i, n - 1 - i) for i in range(n // 2)] + ([(n // 2,)] if n % 2 else [])
    )
    # The pairs are not emitted in cost order: no curriculum runs through the round.
    firsts = [min(u) for u in units if len(u) == 2]
    assert len(firsts) < 3 or firsts != sorted(firsts)


def _dealt(world_size: int, emission: str, cross_rank: bool | None = None):
    lengths = lognormal_lengths(10000, mean=300, cv=0.9, seed=4, max_len=4096)
    config = BatchingConfig.of(
        token_budget=8192, emission_order=emission, seed=2, cross_rank_grouping=cross_rank
    )
    return simulate_dealt_epoch(lengths, world_size, config, epoch=1)


@pytest.mark.parametrize("world_size", [8, 64])
def test_paired_emission_keeps_the_groups_and_the_utilization(world_size: int) -> None:
    shuffled, paired = _dealt(world_size, "shuffled"), _dealt(world_size, "paired")

    def groups(result) -> list[Counter]:
        return [
            Counter(
                (s.round_index, tuple(sorted(m.sample_id for m in s.group.samples)))
                for s in steps
                if s.group is not None
            )
            for steps in result.steps
        ]

    assert groups(paired) == groups(shuffled)
    assert paired.steps != shuffled.steps  # the same steps, emitted in another order
    budget = BatchingConfig.of(token_budget=8192).budget
    figures = [
        sync_figures([[s.group for s in steps] for steps in r.steps], budget)
        for r in (paired, shuffled)
    ]
    assert figures[0].steps == figures[1].steps
    assert figures[0].utilization == pytest.approx(figures[1].utilization, abs=1e-12)
    assert figures[0].sync_efficiency == pytest.approx(figures[1].sync_efficiency, abs=1e-12)


@pytest.mark.parametrize(("cross_rank", "rounds"), [(False, 2), (None, 1)])
def test_paired_rounds_put_the_longest_step_next_to_the_shortest(
    cross_rank: bool | None, rounds: int
) -> None:
    # About 46 budgets of work per rank, more than a small epoch (grouped whole:
    # core.ramp.SMALL_EPOCH_BUDGETS). Per rank, the ramp's rounds run 1, 1 and 4 steps
    # and the last round 46; grouped across ranks (the default here), the ramp's pooled
    # rounds run 1, 1 and 32 steps and the tail's pooled round the other 15.
    result = _dealt(8, "paired", cross_rank)
    by_round: dict[int, list[float]] = defaultdict(list)
    for step in result.steps[0]:
        # What every rank knows alike: supervised tokens per sample over all ranks.
        by_round[step.round_index].append(step.global_loss_tokens / step.global_samples)
    checked = 0
    for lengths in by_round.values():
        ranked = sorted(lengths, reverse=True)
        n = len(ranked)
        pairs = Counter(tuple(sorted(lengths[k : k + 2])) for k in range(0, n - n % 2, 2))
        expected = Counter(tuple(sorted((ranked[i], ranked[n - 1 - i]))) for i in range(n // 2))
        if n % 2 == 0:
            assert pairs == expected
            checked += n > 2
    assert checked >= rounds


def test_paired_by_lengths_pairs_the_longest_with_the_shortest() -> None:
    lengths = [5.0, 90.0, 20.0, 70.0, 1.0, 40.0]
    order = emission_order(6, make_rng(0, "round", 0, 0), paired=True, lengths=lengths)
    pairs = {frozenset(order[k : k + 2]) for k in range(0, 6, 2)}
    assert pairs == {frozenset({1, 4}), frozenset({3, 0}), frozenset({5, 2})}
