"""Synthetic length profiles for unit tests and simulations (never for training data)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from odb_lightning.core.checks import check_positive_int, is_int
from odb_lightning.core.order import make_rng


def lognormal_lengths(
    n: int, mean: float, cv: float, seed: int, max_len: int | None = None
) -> list[int]:
    """Seeded lognormal token lengths with a given mean and coefficient of variation.

    A lognormal ``exp(N(mu, sigma^2))`` has mean ``exp(mu + sigma^2 / 2)`` and
    ``CV^2 = exp(sigma^2) - 1``, so ``sigma^2 = ln(1 + CV^2)`` and
    ``mu = ln(mean) - sigma^2 / 2``. Draws are rounded to integers >= 1 and, when
    ``max_len`` is given, clipped to it (what truncation at ``max_seq_len`` does), which
    lowers the realised mean and CV slightly. The same arguments always give the same list.
    """
    if not is_int(n) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if not (math.isfinite(mean) and mean > 0):
        raise ValueError(f"mean must be a positive number, got {mean!r}")
    if not (math.isfinite(cv) and cv >= 0):
        raise ValueError(f"cv must be a non-negative number, got {cv!r}")
    check_positive_int("max_len", max_len, optional=True)
    sigma2 = math.log1p(cv * cv)
    mu = math.log(mean) - sigma2 / 2
    rng = make_rng(seed, "lognormal")
    sigma = math.sqrt(sigma2)
    lengths = [max(1, round(rng.lognormvariate(mu, sigma))) for _ in range(n)]
    if max_len is not None:
        lengths = [min(length, max_len) for length in lengths]
    return lengths


def largest_remainder(shares: Sequence[float], total: int) -> list[int]:
    """``total`` split in proportion to ``shares``: each part's floor, then one more for
    the parts with the largest remainders (ties to the earlier part), so the counts sum
    to ``total`` and each is within one of its share."""
    whole = math.fsum(shares)
    exact = [total * share / whole for share in shares]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


@dataclass(frozen=True, slots=True)
class HistogramProfile:
    """A length distribution given bin by bin: each ``(lo, hi, share)`` puts ``share`` of
    the samples in ``[lo, hi)`` tokens, uniformly inside the bin.

    For distributions that a mean and a CV do not describe (a dense middle, a short head
    and a thin tail, each with its own mass). Bins are sorted, disjoint, and their shares
    sum to 1.
    """

    bins: tuple[tuple[int, int, float], ...]

    def __post_init__(self) -> None:
        if not self.bins:
            raise ValueError("a histogram profile needs at least one bin")
        previous_hi = 1
        for index, (lo, hi, share) in enumerate(self.bins):
            if not (is_int(lo) and is_int(hi) and previous_hi <= lo < hi):
                raise ValueError(
                    f"bins[{index}] = [{lo}, {hi}) must be integers with lo < hi, "
                    f"at or above the previous bin's end {previous_hi}"
                )
            if not (math.isfinite(share) and share > 0):
                raise ValueError(f"bins[{index}] share must be positive, got {share!r}")
            previous_hi = hi
        total = math.fsum(share for _, _, share in self.bins)
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"the bins' shares must sum to 1, got {total!r}")

    @property
    def mean_length(self) -> float:
        """The distribution's mean (a uniform bin ``[lo, hi)`` has mean ``(lo + hi - 1) / 2``)."""
        return math.fsum(share * (lo + hi - 1) / 2 for lo, hi, share in self.bins)

    def counts(self, n: int) -> list[int]:
        """Samples per bin out of ``n``: ``n * share`` rounded by largest remainder, so the
        counts sum to ``n`` and each is within one sample of its share."""
        return largest_remainder([share for _, _, share in self.bins], n)

    def lengths(
        self, n: int, seed: int, max_len: int | None = None, scale: float = 1.0
    ) -> list[int]:
        """``n`` seeded lengths, in a seeded random order: each bin gets its count
        (:meth:`counts`), uniform inside it, then every length is multiplied by ``scale``
        (rounded, at least 1) and clipped to ``max_len``. The same arguments always give
        the same list."""
        if not is_int(n) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a positive number, got {scale!r}")
        rng = make_rng(seed, "histogram")
        lengths = [
            rng.randrange(lo, hi)
            for (lo, hi, _), count in zip(self.bins, self.counts(n), strict=True)
            for _ in range(count)
        ]
        rng.shuffle(lengths)
        lengths = [max(1, round(length * scale)) for length in lengths]
        if max_len is not None:
            lengths = [min(length, max_len) for length in lengths]
        return lengths


CASE_STUDY_LENGTHS = HistogramProfile(
    (
        (64, 450, 0.020),
        (450, 770, 0.130),
        (770, 1024, 0.110),
        (1024, 1216, 0.080),
        (1216, 1728, 0.170),
        (1728, 2432, 0.140),
        (2432, 3296, 0.100),
        (3296, 3712, 0.040),
        (3712, 4096, 0.090),
        (4096, 4608, 0.085),
        (4608, 5120, 0.029),
        (5120, 8192, 0.006),
    )
)
"""The token lengths of the bucketed-shuffle case study's 902,087 training samples, as
far as its published figures pin them (``experiments/scale_data/README.md`` derives each
bin): 15% below 770 tokens with mean about 559, 62% between 1,024 and 4,096, a thin tail
to 8,191 (its last bucket edge, 8,192, is exclusive), and bucket means whose batch sizes
(``floor(49,152 / mean)``, capped at 64) are the case study's 64, 49, 33, 23, 17
and 11."""
