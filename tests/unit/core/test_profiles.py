"""Length profiles: the histogram profile's draws, and the case study's figures."""

from __future__ import annotations

import statistics

import pytest

from odb_lightning.core.profiles import CASE_STUDY_LENGTHS, HistogramProfile

CASE_STUDY_SAMPLES = 902_087
CASE_STUDY_EDGES = (0, 770, 1216, 1728, 2432, 3296, 8192)
CASE_STUDY_BATCH_SIZES = (64, 49, 33, 23, 17, 11)  # its table, at a 49,152-token budget


@pytest.fixture(scope="module")
def case_study() -> list[int]:
    return CASE_STUDY_LENGTHS.lengths(CASE_STUDY_SAMPLES, seed=0)


def test_histogram_draws_are_seeded_and_keep_every_bin_share() -> None:
    profile = HistogramProfile(((10, 20, 0.25), (20, 100, 0.5), (200, 201, 0.25)))
    lengths = profile.lengths(1001, seed=3)
    assert lengths == profile.lengths(1001, seed=3)
    assert lengths != profile.lengths(1001, seed=4)
    counts = [sum(lo <= n < hi for n in lengths) for lo, hi, _ in profile.bins]
    assert counts == profile.counts(1001) and sum(counts) == 1001
    assert all(abs(c - 1001 * s) < 1 for c, (_, _, s) in zip(counts, profile.bins, strict=True))
    scaled = profile.lengths(1001, seed=3, scale=0.5, max_len=60)
    assert scaled == [min(60, max(1, round(n * 0.5))) for n in lengths]


@pytest.mark.parametrize(
    ("bins", "problem"),
    [
        ((), "at least one bin"),
        (((10, 10, 1.0),), "lo < hi"),
        (((10, 20, 0.5), (15, 30, 0.5)), "previous bin"),
        (((10, 20, 0.5), (20, 30, 0.4)), "sum to 1"),
        (((10, 20, 0.0), (20, 30, 1.0)), "positive"),
    ],
)
def test_histogram_rejects_bad_bins(bins: tuple, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        HistogramProfile(bins)


def test_case_study_profile_matches_the_published_figures(case_study: list[int]) -> None:
    n = len(case_study)
    assert max(case_study) < CASE_STUDY_EDGES[-1] and min(case_study) >= 64
    short = [x for x in case_study if x < 770]
    assert abs(len(short) - 135_000) < 1_000  # "135K short samples"
    assert 544 <= statistics.fmean(short) <= 574  # "mean length of 559"
    assert abs(sum(1024 <= x < 4096 for x in case_study) / n - 0.62) < 0.005  # "62%"
    assert sum(x > 5000 for x in case_study) / n < 0.03  # "the long tail above 5,000 is small"
    buckets = [
        [x for x in case_study if lo <= x < hi]
        for lo, hi in zip(CASE_STUDY_EDGES, CASE_STUDY_EDGES[1:], strict=False)
    ]
    assert abs(statistics.fmean(buckets[-1]) - 4173) < 40  # the last bucket's mean
    # The table's batch sizes are the budget over the bucket's mean, capped at 64.
    sizes = tuple(min(64, 49_152 // round(statistics.fmean(b))) for b in buckets)
    assert sizes == CASE_STUDY_BATCH_SIZES


def test_case_study_profile_quantiles(case_study: list[int]) -> None:
    ordered = sorted(case_study)
    quantile = {q: ordered[int(q * len(ordered))] for q in (0.1, 0.5, 0.9, 0.99)}
    assert 600 <= quantile[0.1] <= 700
    assert 1600 <= quantile[0.5] <= 1800
    assert 4100 <= quantile[0.9] <= 4400
    assert 4800 <= quantile[0.99] <= 5300
    assert abs(statistics.fmean(case_study) - CASE_STUDY_LENGTHS.mean_length) < 5
