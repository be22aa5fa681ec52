"""Fixed-size integer wire format of one alignment round.

Each rank publishes one :class:`RankReport` per round. Its length depends only on
``max_steps_per_round`` (``Q``), so one ``all_gather`` of equal-sized tensors carries it.
``Q`` bounds everything a round can need: the target ``T`` never exceeds the free output
slots, which never exceed ``Q``, so at most ``Q`` groups are kept and at most ``Q - 1``
samples are peeled off by a split. Per group the report carries its size, supervised
token count and cost (the budget's cost model, rounded up to an integer), and per sample a
split would peel, in peel order, its supervised tokens, the cost of its new singleton and
how much the cost of the group it leaves falls: with that, every rank replays every other
rank's alignment, knows the global sample and loss-token count of each step and every
rank's cost of each step (which orders the steps, :func:`alignment.cost_order`) after this
single exchange.
"""

from __future__ import annotations

from dataclasses import dataclass

WIRE_VERSION = 5
_HEADER = (
    "version",
    "epoch",
    "round_index",
    "aborted",
    "finished",
    "free_slots",
    "buffered",
    "num_groups",
    "undealt",
    "wanted",
    "full",
    "dealt_cost",
    "dealt_samples",
    "wait_us",
    "elapsed_us",
)


class WireFormatError(RuntimeError):
    """A message does not have the layout of this wire version."""


@dataclass(frozen=True, slots=True)
class RankReport:
    """What one rank tells the others before a round.

    Attributes:
        epoch: Epoch this report belongs to.
        round_index: Round counter within the epoch; equal on every rank.
        aborted: This rank failed and leaves the job; every peer must raise.
        finished: Shard exhausted and window empty.
        free_slots: Output slots this rank can fill now (``C_r``).
        buffered: Samples in the window (``S_r``).
        num_groups: Groups the local plan formed (``G_r``), capped at ``Q``.
        group_sizes: Samples per group, in emission-priority order (at most ``Q``).
        group_loss_tokens: Supervised tokens per group, same order.
        peel_loss_tokens: Supervised tokens of the samples a split would peel, in order.
        group_costs: Cost of each group (integer, rounded up), same order as the sizes.
        peel_costs: Cost of the singleton each peel makes, in peel order.
        peel_savings: How much each peel lowers the cost of the group it leaves.
        undealt: Samples of the epoch's global order not dealt to any rank yet (0 with
            fixed shards); equal on every rank.
        wanted: Samples this rank asks to be dealt (``shard_dealing=by_need``).
        full: The window holds its work (or cannot get more): it may emit.
        dealt_cost: The cost (the budget's row cost of each sample, rounded up, summed) of
            every sample this rank received this epoch; ``dealt_samples`` how many. With
            them the deal balances the ranks' work (:func:`dealing.deal_counts`).
        wait_us: Microseconds this rank has waited this epoch for its own samples to
            arrive (its fetch backlog); ``elapsed_us`` since the epoch started. Only
            ``fetch_aware_dealing`` reads them (:func:`dealing.fetch_shares`); the
            simulator leaves both 0.
    """

    epoch: int
    round_index: int
    aborted: bool
    finished: bool
    free_slots: int
    buffered: int
    num_groups: int
    group_sizes: tuple[int, ...] = ()
    group_loss_tokens: tuple[int, ...] = ()
    peel_loss_tokens: tuple[int, ...] = ()
    group_costs: tuple[int, ...] = ()
    peel_costs: tuple[int, ...] = ()
    peel_savings: tuple[int, ...] = ()
    undealt: int = 0
    wanted: int = 0
    full: bool = True
    dealt_cost: int = 0
    dealt_samples: int = 0
    wait_us: int = 0
    elapsed_us: int = 0


_BODY = (
    "group_sizes",
    "group_loss_tokens",
    "peel_loss_tokens",
    "group_costs",
    "peel_costs",
    "peel_savings",
)


def message_length(max_steps: int) -> int:
    """Length of every encoded report for ``Q = max_steps``."""
    return len(_HEADER) + len(_BODY) * max_steps


def _padded(values: tuple[int, ...], size: int, what: str) -> list[int]:
    if len(values) > size:
        raise WireFormatError(f"{what} has {len(values)} entries, the wire holds {size}")
    return list(values) + [0] * (size - len(values))


def encode_report(report: RankReport, max_steps: int) -> list[int]:
    """Encode ``report`` into exactly :func:`message_length` integers."""
    header = [
        WIRE_VERSION,
        report.epoch,
        report.round_index,
        int(report.aborted),
        int(report.finished),
        report.free_slots,
        report.buffered,
        report.num_groups,
        report.undealt,
        report.wanted,
        int(report.full),
        report.dealt_cost,
        report.dealt_samples,
        report.wait_us,
        report.elapsed_us,
    ]
    body = [value for name in _BODY for value in _padded(getattr(report, name), max_steps, name)]
    return header + body


def report_max_steps(message: list[int]) -> int | None:
    """The ``Q`` of ``message`` if its length and version are those of a report, else ``None``."""
    extra = len(message) - len(_HEADER)
    if extra < len(_BODY) or extra % len(_BODY) or message[0] != WIRE_VERSION:
        return None
    return extra // len(_BODY)


def check_message(message: list[int], max_steps: int) -> None:
    """Raise :class:`WireFormatError` naming the first field of ``message`` that no
    report can hold (wrong length or version, a flag not 0/1, a negative count, more
    groups than ``Q``): garbage is caught here, before the planner sizes anything by it."""
    if len(message) != message_length(max_steps):
        raise WireFormatError(
            f"message has {len(message)} integers, expected {message_length(max_steps)}"
        )
    if message[0] != WIRE_VERSION:
        raise WireFormatError(f"wire version {message[0]}, expected {WIRE_VERSION}")
    header = dict(zip(_HEADER, message, strict=False))
    for name in ("aborted", "finished", "full"):
        if header[name] not in (0, 1):
            raise WireFormatError(f"{name} is {header[name]}, expected 0 or 1")
    for name in (
        "epoch",
        "round_index",
        "free_slots",
        "buffered",
        "num_groups",
        "undealt",
        "wanted",
        "dealt_cost",
        "dealt_samples",
        "wait_us",
        "elapsed_us",
    ):
        if header[name] < 0:
            raise WireFormatError(f"{name} is {header[name]}, expected >= 0")
    if header["num_groups"] > max_steps:
        raise WireFormatError(
            f"num_groups is {header['num_groups']}, more than max_steps_per_round {max_steps}"
        )
    body = message[len(_HEADER) :]
    negative = next((i for i, value in enumerate(body) if value < 0), None)
    if negative is not None:
        raise WireFormatError(
            f"{_BODY[negative // max_steps]}[{negative % max_steps}] is {body[negative]}, "
            "expected >= 0"
        )


def decode_report(message: list[int], max_steps: int) -> RankReport:
    """Inverse of :func:`encode_report`; a malformed message raises :class:`WireFormatError`."""
    check_message(message, max_steps)
    header = dict(zip(_HEADER, message, strict=False))
    num_groups, buffered = header["num_groups"], header["buffered"]
    body = message[len(_HEADER) :]
    shown = min(num_groups, max_steps)
    peels = max(0, min(buffered, max_steps) - num_groups)
    columns = {
        name: tuple(body[i * max_steps : i * max_steps + (peels if "peel" in name else shown)])
        for i, name in enumerate(_BODY)
    }
    return RankReport(
        epoch=header["epoch"],
        round_index=header["round_index"],
        aborted=bool(header["aborted"]),
        finished=bool(header["finished"]),
        free_slots=header["free_slots"],
        buffered=buffered,
        num_groups=num_groups,
        undealt=header["undealt"],
        wanted=header["wanted"],
        full=bool(header["full"]),
        dealt_cost=header["dealt_cost"],
        dealt_samples=header["dealt_samples"],
        wait_us=header["wait_us"],
        elapsed_us=header["elapsed_us"],
        **columns,
    )
