"""Synthetic length profiles for unit tests and simulations (never for training data)."""

from __future__ import annotations

import math

from odb_lightning.core.checks import is_int
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
    if max_len is not None and (not isinstance(max_len, int) or max_len < 1):
        raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
    sigma2 = math.log1p(cv * cv)
    mu = math.log(mean) - sigma2 / 2
    rng = make_rng(seed, "lognormal")
    sigma = math.sqrt(sigma2)
    lengths = [max(1, round(rng.lognormvariate(mu, sigma))) for _ in range(n)]
    if max_len is not None:
        lengths = [min(length, max_len) for length in lengths]
    return lengths
