"""Bucket optimizer for ``bucketed`` batching: edges that minimize modelled padding.

Model. A bucket holds ``m`` samples; each epoch they are shuffled and cut greedily in
batches of (about) ``b``. Shuffled chunks of a random permutation are draws *without
replacement*, so a batch is padded to the maximum of ``b`` such draws, and the bucket
costs about ``m * E[max_b]`` padded tokens. With the bucket's values sorted,
``P(max <= x) = C(c(x), b) / C(m, b)`` where ``c(x)`` counts samples ``<= x`` (all ``b``
draws must land among them), so ``P(max = x_j) = C(j-1, b-1) / C(m, b)``: the empirical
order statistic, not a uniform-within-bucket approximation. ``b`` is the largest batch
size ``<= max_batch_size`` with ``b * E[max_b] <= token_budget`` (at least 1); since
``E[max_b]`` grows with ``b`` the feasible sizes are ``1..b``. The quadratic attention
term is not modelled: the optimizer works in padded tokens. The model errs on the
conservative side: the real packer's variable batch sizes absorb some of the tail
(accuracy and speed: docs/data.md, "Bucket length model").

Speed. The probabilities are evaluated in log space (``lgamma``, no giant integers) on a
histogram, so one step jumps a whole bin instead of one sample. One ``E[max_b]`` is one
pass over the bucket's bins from the top down, stopped once the remaining mass is below
1e-13. The optimizer merges adjacent distinct lengths into bins no wider than
``bin_width`` (relative), represented by their mean; every reported figure
(:func:`predict_efficiency`, :func:`bucket_table`) uses the exact histogram.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from odb_lightning.core.budget import Budget
from odb_lightning.core.checks import check_positive_int
from odb_lightning.core.plans import bucket_of, plan_bucketed, summarize_plan, validate_lengths

# Below this probability the rest of the histogram cannot move E[max] by a visible amount.
_TAIL_MASS = 1e-13


@dataclass(frozen=True, slots=True)
class BucketRow:
    """One row of the bucket table (:func:`bucket_table`).

    Attributes:
        lo: Inclusive lower edge in tokens.
        hi: Exclusive upper edge in tokens.
        count: Samples in the bucket.
        mean_length: Their mean length.
        batch_size: Model batch size ``b`` (largest with ``b * E[max_b] <= budget``).
        predicted_efficiency: Real / modelled padded tokens of the bucket.
        efficiency: Real / padded tokens measured by the real packer (``plan_bucketed``).
    """

    lo: int
    hi: int
    count: int
    mean_length: float
    batch_size: int
    predicted_efficiency: float
    efficiency: float


class _LengthModel:
    """Length histogram with cumulative counts and a ``lgamma`` table for ``E[max_b]``."""

    def __init__(self, lengths: Sequence[int], splits: Sequence[int], bin_width: float) -> None:
        validate_lengths(lengths)
        if not lengths:
            raise ValueError("lengths must not be empty")
        split_set = set(splits)
        self.lows: list[int] = []  # smallest length in each bin
        self.cum = [0]  # cum[k] = samples in bins < k
        self.cum_tokens = [0]
        for value, count in sorted(Counter(lengths).items()):
            # A bin never straddles a split (bucket edges stay exact) nor grows wider
            # than bin_width relative to its lowest length.
            if not self.lows or value in split_set or value > self.lows[-1] * (1 + bin_width):
                self.lows.append(value)
                self.cum.append(self.cum[-1])
                self.cum_tokens.append(self.cum_tokens[-1])
            self.cum[-1] += count
            self.cum_tokens[-1] += value * count
        # Each bin is represented by its mean length (exact when it holds one length).
        self.means = [
            (self.cum_tokens[k + 1] - self.cum_tokens[k]) / (self.cum[k + 1] - self.cum[k])
            for k in range(len(self.lows))
        ]
        self.log_fact = [math.lgamma(c + 1) for c in range(len(lengths) + 1)]

    @property
    def num_bins(self) -> int:
        return len(self.lows)

    def bin_at(self, edge: int) -> int:
        """First bin whose lengths are all ``>= edge``."""
        return bisect.bisect_left(self.lows, edge)

    def count(self, a: int, z: int) -> int:
        return self.cum[z] - self.cum[a]

    def tokens(self, a: int, z: int) -> int:
        return self.cum_tokens[z] - self.cum_tokens[a]

    def expected_max(self, a: int, z: int, b: int) -> float:
        """``E[max]`` of ``b`` draws without replacement from bins ``a..z-1``."""
        base, m = self.cum[a], self.count(a, z)
        b = min(b, m)
        if b == 1:
            return self.tokens(a, z) / m
        lf = self.log_fact
        # log C(c, b) - log C(m, b) = lf[c] - lf[c-b] - (lf[m] - lf[m-b]).
        log_norm = lf[m] - lf[m - b]
        total, above = 0.0, 1.0  # above = P(max <= top of bin k)
        for k in range(z - 1, a - 1, -1):
            c = self.cum[k] - base  # samples below bin k
            below = math.exp(lf[c] - lf[c - b] - log_norm) if c >= b else 0.0
            total += self.means[k] * (above - below)  # P(max falls in bin k)
            if below < _TAIL_MASS:
                break
            above = below
        return total

    def fit_batch(self, a: int, z: int, token_budget: int, cap: int) -> tuple[int, float]:
        """Largest ``b <= min(cap, m)`` with ``b * E[max_b] <= token_budget`` (>= 1).

        Returns:
            ``(b, E[max_b])``.
        """
        hi = min(cap, self.count(a, z))
        hi_max = self.expected_max(a, z, hi)
        if hi == 1 or hi * hi_max <= token_budget:
            return hi, hi_max
        # Invariant: lo is feasible (or is 1), hi is not; b * E[max_b] grows with b.
        lo, lo_max = 1, self.expected_max(a, z, 1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            mid_max = self.expected_max(a, z, mid)
            if mid * mid_max <= token_budget:
                lo, lo_max = mid, mid_max
            else:
                hi = mid
        return lo, lo_max

    def bucket_cost(self, a: int, z: int, token_budget: int, cap: int) -> float:
        """Modelled padded tokens ``m * E[max_b]`` of bins ``a..z-1`` (0 when empty)."""
        if self.count(a, z) == 0:
            return 0.0
        _, e_max = self.fit_batch(a, z, token_budget, cap)
        return self.count(a, z) * e_max


def _check_args(
    lengths: Sequence[int], k: int, token_budget: int, max_batch_size: int, num_candidates: int
) -> None:
    validate_lengths(lengths)
    if not lengths:
        raise ValueError("lengths must not be empty")
    for name, value in (
        ("k", k),
        ("token_budget", token_budget),
        ("max_batch_size", max_batch_size),
        ("num_candidates", num_candidates),
    ):
        check_positive_int(name, value)


def candidate_edges(lengths: Sequence[int], num_candidates: int = 128) -> list[int]:
    """Interior edge candidates: the lengths at quantiles ``q / (num_candidates + 1)``.

    Deduplicated and above the shortest length, so each candidate is itself a length in
    the data and every bucket cut from them is non-empty.
    """
    ordered = sorted(lengths)
    n = len(ordered)
    picks = {ordered[q * n // (num_candidates + 1)] for q in range(1, num_candidates + 1)}
    return sorted(v for v in picks if v > ordered[0])


def _edges(model: _LengthModel, cuts: Sequence[int], k: int, longest: int) -> list[int]:
    # Fewer candidates than k - 1 cuts: pad with empty buckets above the longest sample,
    # so the result always has k + 1 edges.
    tail = [longest + 1 + extra for extra in range(k - len(cuts))]
    return [0, *(model.lows[c] for c in cuts), *tail]


def _cost_table(
    model: _LengthModel, positions: list[int], token_budget: int, cap: int
) -> list[list[float]]:
    """``cost[i][j]`` of the bucket between positions ``i < j``.

    For a fixed lower edge, adding longer samples raises ``E[max_b]`` for every ``b``, so
    once the budget binds the batch size can only shrink as the upper edge moves up: the
    search for ``j`` starts at the batch size found for ``j - 1``.
    """
    size = len(positions)
    cost = [[math.inf] * size for _ in range(size)]
    for i in range(size - 1):
        limit = cap
        for j in range(i + 1, size):
            a, z = positions[i], positions[j]
            b, e_max = model.fit_batch(a, z, token_budget, limit)
            if b < min(limit, model.count(a, z)):
                limit = b  # the budget binds from here on
            cost[i][j] = model.count(a, z) * e_max
    return cost


def optimize_boundaries(
    lengths: Sequence[int],
    k: int,
    *,
    token_budget: int,
    max_batch_size: int,
    num_candidates: int = 128,
    bin_width: float = 0.005,
) -> list[int]:
    """Bucket edges minimizing modelled padded tokens, by an exact dynamic program.

    ``best[t][j]`` is the least cost of covering candidate positions ``0..j`` with ``t``
    buckets; ``best[t][j] = min_i best[t-1][i] + cost(i, j)``. ``O(k * C^2)`` over the
    ``C`` candidate edges, after ``O(C^2)`` bucket costs. With fewer than ``k - 1``
    distinct candidates every candidate becomes an edge and the remaining buckets are
    empty ones above the longest sample.

    Args:
        k: Number of buckets.
        token_budget: Padded tokens per batch.
        num_candidates: Quantile positions tried as edges (:func:`candidate_edges`).
        bin_width: Relative width of the model's histogram bins (0 = exact histogram).

    Returns:
        ``k + 1`` strictly increasing edges: 0, the cuts, and one above the longest.
    """
    _check_args(lengths, k, token_budget, max_batch_size, num_candidates)
    candidates = candidate_edges(lengths, num_candidates)
    model = _LengthModel(lengths, candidates, bin_width)
    positions = [0, *(model.bin_at(c) for c in candidates), model.num_bins]
    cost = _cost_table(model, positions, token_budget, max_batch_size)
    cuts = _best_cuts(cost, min(k, len(positions) - 1))
    return _edges(model, [positions[c] for c in cuts], k, max(lengths))


def _best_cuts(cost: list[list[float]], buckets: int) -> list[int]:
    """Interior positions of the cheapest cover of ``0..last`` by ``buckets`` buckets (the
    recurrence of :func:`optimize_boundaries`; ``back[t][j]`` keeps the argmin)."""
    last = len(cost) - 1
    best = [0.0] + [math.inf] * last  # zero buckets cover only position 0
    back: list[list[int]] = []
    for _ in range(buckets):
        new, arg = [math.inf] * (last + 1), [0] * (last + 1)
        for j in range(1, last + 1):
            for i in range(j):
                value = best[i] + cost[i][j]
                if value < new[j]:
                    new[j], arg[j] = value, i
        best = new
        back.append(arg)
    cuts, j = [], last
    for arg in reversed(back):
        j = arg[j]
        cuts.append(j)
    return cuts[-2::-1]  # drop position 0, lowest cut first


def _exact_model(lengths: Sequence[int], boundaries: Sequence[int]) -> _LengthModel:
    bucket_of(lengths, boundaries)  # validates edges against the lengths
    return _LengthModel(lengths, boundaries, bin_width=0.0)


def expected_padded_tokens(
    lengths: Sequence[int], boundaries: Sequence[int], *, token_budget: int, max_batch_size: int
) -> float:
    """Modelled padded tokens of one bucketed epoch (exact histogram)."""
    model = _exact_model(lengths, boundaries)
    return sum(
        model.bucket_cost(model.bin_at(lo), model.bin_at(hi), token_budget, max_batch_size)
        for lo, hi in itertools.pairwise(boundaries)
    )


def predict_efficiency(
    lengths: Sequence[int], boundaries: Sequence[int], *, token_budget: int, max_batch_size: int
) -> float:
    """Modelled padding efficiency: real tokens / :func:`expected_padded_tokens`."""
    padded = expected_padded_tokens(
        lengths, boundaries, token_budget=token_budget, max_batch_size=max_batch_size
    )
    return sum(lengths) / padded


def expected_max(values: Sequence[int], b: int) -> float:
    """Exact ``E[max]`` of ``b`` draws without replacement from ``values``."""
    model = _LengthModel(values, (), bin_width=0.0)
    return model.expected_max(0, model.num_bins, b)


def _bucketed_plans(
    lengths: Sequence[int],
    boundaries: Sequence[int],
    token_budget: int,
    max_batch_size: int,
    seed: int,
    epochs: int,
) -> list[list[int]]:
    validate_lengths(lengths)
    budget = Budget(token_budget)
    return [
        batch
        for epoch in range(epochs)
        for batch in plan_bucketed(lengths, boundaries, budget, max_batch_size, seed, epoch)
    ]


def simulate_bucketed(
    lengths: Sequence[int],
    boundaries: Sequence[int],
    *,
    token_budget: int,
    max_batch_size: int,
    seed: int = 0,
    epochs: int = 3,
) -> float:
    """Padding efficiency the real packer (``plan_bucketed``) reaches over epochs."""
    batches = _bucketed_plans(lengths, boundaries, token_budget, max_batch_size, seed, epochs)
    return summarize_plan(lengths, batches, token_budget).padding_efficiency


def bucket_table(
    lengths: Sequence[int],
    boundaries: Sequence[int],
    *,
    token_budget: int,
    max_batch_size: int,
    seed: int = 0,
    epochs: int = 3,
) -> list[BucketRow]:
    """Per bucket: range, count, mean, model batch size, predicted efficiency and the
    efficiency the real packer measures over ``epochs`` epochs."""
    model = _exact_model(lengths, boundaries)
    bucket = bucket_of(lengths, boundaries)
    real = [0] * (len(boundaries) - 1)
    padded = [0] * (len(boundaries) - 1)
    for batch in _bucketed_plans(lengths, boundaries, token_budget, max_batch_size, seed, epochs):
        longest = max(lengths[i] for i in batch)
        real[bucket[batch[0]]] += sum(lengths[i] for i in batch)
        padded[bucket[batch[0]]] += len(batch) * longest
    rows = []
    for index, (lo, hi) in enumerate(itertools.pairwise(boundaries)):
        a, z = model.bin_at(lo), model.bin_at(hi)
        count = model.count(a, z)
        b, e_max = model.fit_batch(a, z, token_budget, max_batch_size) if count else (0, 0.0)
        rows.append(
            BucketRow(
                lo=lo,
                hi=hi,
                count=count,
                mean_length=model.tokens(a, z) / count if count else 0.0,
                batch_size=b,
                predicted_efficiency=model.tokens(a, z) / (count * e_max) if count else 1.0,
                efficiency=real[index] / padded[index] if padded[index] else 1.0,
            )
        )
    return rows
