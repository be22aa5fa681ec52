"""Exact mid-epoch resume: what a loader keeps in a checkpoint, and where it picks up.

A loader's place in an epoch is the set of samples the trainer has consumed in it, over
all ranks (dataset indices), plus the epoch number. Resuming runs the rest of that epoch:

* the ODB loader gives each rank its shard for the epoch minus the consumed ids, so a
  sample that sat in a window but was never emitted is read again, not lost;
* a streamed ODB loader's shard is its part of the stream minus the consumed ids, so the
  stream restarts at the first unconsumed record of the part and passes over the
  consumed ones after it (:mod:`~odb_lightning.runtime.stream_source`);
* a planned loader runs the epoch's plan without the consumed ids: when the plan is the
  one the checkpoint saw, fully consumed batches vanish and the run goes on with the very
  next batch of the uninterrupted run.

Either way every sample of the epoch is emitted exactly once over the two runs (join
mode). The set is job-wide, so the rest of an epoch may be re-sharded over a different
number of ranks, and a finished epoch is saved as the start of the next one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from odb_lightning.core.checks import is_int

STATE_FORMAT = 1
"""Version of the dictionary :meth:`EpochProgress.to_state` writes."""


class ResumeStateError(ValueError):
    """A loader state cannot be resumed from (malformed, or from other data)."""


@dataclass(frozen=True, slots=True)
class EpochProgress:
    """Samples of ``epoch`` already consumed, over all ranks.

    Attributes:
        epoch: The epoch the next iteration runs.
        consumed: Dataset indices of that epoch that were consumed before.
    """

    epoch: int = 0
    consumed: frozenset[int] = frozenset()

    def to_state(self) -> dict[str, Any]:
        """Plain, picklable form for a checkpoint."""
        return {"format": STATE_FORMAT, "epoch": self.epoch, "consumed_ids": sorted(self.consumed)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], *, num_samples: int) -> EpochProgress:
        """Validate a state written by :meth:`to_state`; every consumed id must index a
        dataset of ``num_samples``.

        Raises:
            ResumeStateError: Naming the field at fault.
        """
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            found = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise ResumeStateError(
                f"loader state: 'format' must be {STATE_FORMAT}, got {found!r} "
                "(not a state written by this version's state_dict())"
            )
        epoch = state.get("epoch")
        if not is_int(epoch) or epoch < 0:
            raise ResumeStateError(f"loader state: 'epoch' must be an integer >= 0, got {epoch!r}")
        ids = state.get("consumed_ids")
        if not isinstance(ids, Sequence) or isinstance(ids, str | bytes):
            raise ResumeStateError(f"loader state: 'consumed_ids' must be a list, got {ids!r}")
        bad = [i for i in ids if not is_int(i)]
        bad += [i for i in ids if isinstance(i, int) and not 0 <= i < num_samples]
        if bad:
            raise ResumeStateError(
                f"loader state: 'consumed_ids' holds {len(bad)} ids that are not indices of "
                f"this dataset of {num_samples} samples (first: {bad[0]!r}); was the "
                "checkpoint taken on other data?"
            )
        consumed = frozenset(ids)
        if len(consumed) != len(ids):
            raise ResumeStateError("loader state: 'consumed_ids' lists an id twice")
        return cls(epoch, consumed)


@dataclass
class EpochRecord:
    """One rank's record of the epoch being iterated: what it yielded, in order.

    Attributes:
        start: The progress the iteration started from (its consumed ids were left out).
        yielded: Dataset indices of each yielded batch (``()`` for IDLE).
        finished: The iteration ran to the end of the epoch.
    """

    start: EpochProgress = field(default_factory=EpochProgress)
    yielded: list[tuple[int, ...]] = field(default_factory=list)
    finished: bool = False

    def consumed_steps(self, consumed_steps: int | None) -> int:
        """``consumed_steps`` checked against the yielded batches (all of them if ``None``)."""
        if consumed_steps is None:
            return len(self.yielded)
        if not 0 <= consumed_steps <= len(self.yielded):
            raise ValueError(
                f"consumed_steps must be in [0, {len(self.yielded)}] (the batches yielded "
                f"this epoch), got {consumed_steps}"
            )
        return consumed_steps

    def ended_with(self, steps: int) -> bool:
        """Whether the first ``steps`` batches are the whole, finished epoch."""
        return self.finished and steps == len(self.yielded)

    def progress(self, consumed: Iterable[int], *, finished: bool) -> EpochProgress:
        """The progress after ``consumed`` more ids; a finished epoch rolls over."""
        if finished:
            return EpochProgress(self.start.epoch + 1)
        return EpochProgress(self.start.epoch, self.start.consumed | frozenset(consumed))


Everywhere = Callable[["EpochRecord", int], tuple[list[int], bool]]
"""``everywhere(record, steps)``: the ids the first ``steps`` batches carried on every
rank, and whether every rank finished the epoch with them."""


class EpochResume:
    """A loader's resume bookkeeping: the record of the epoch it iterates, and a loaded
    state waiting for the iteration it resumes."""

    def __init__(self) -> None:
        self.pending: EpochProgress | None = None
        self.record: EpochRecord | None = None

    def begin(self, epoch: int) -> EpochRecord:
        """Start recording an iteration of ``epoch``; it leaves out what a loaded state
        consumed in that epoch (a loaded state resumes one iteration). An iteration that
        was abandoned before the end of the same epoch counts as never run."""
        start, last = self.pending, self.record
        if start is None and last is not None and not last.finished:
            start = last.start
        if start is None or start.epoch != epoch:
            start = EpochProgress(epoch)
        self.pending = None
        self.record = EpochRecord(start)
        return self.record

    def load(self, state: Mapping[str, Any], num_samples: int) -> EpochProgress:
        """Validate ``state`` and keep it for the next iteration.

        Raises:
            RuntimeError: An iteration has started and not finished its epoch.
            ResumeStateError: See :meth:`EpochProgress.from_state`.
        """
        if self.record is not None and not self.record.finished:
            raise RuntimeError(
                "load_state_dict() must come before the loader's first iteration or between "
                "epochs, not after an epoch has started"
            )
        self.pending, self.record = EpochProgress.from_state(state, num_samples=num_samples), None
        return self.pending

    def state(self, epoch: int, consumed_steps: int | None, everywhere: Everywhere) -> dict:
        """The checkpoint state after ``consumed_steps`` batches of the recorded epoch
        (before any iteration: the loaded state, or the start of ``epoch``)."""
        record = self.record
        if record is None:
            return (self.pending or EpochProgress(epoch)).to_state()
        consumed, finished = everywhere(record, record.consumed_steps(consumed_steps))
        return record.progress(consumed, finished=finished).to_state()


def gather_objects(value: Any, world_size: int) -> list[Any]:
    """``value`` of every rank, by rank, over the default process group.

    Raises:
        RuntimeError: With several ranks but no initialized default process group.
    """
    if world_size == 1:
        return [value]
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"state_dict() of a loader with {world_size} ranks gathers every rank's progress "
            "over the default process group; initialize it (torchrun, Lightning) first"
        )
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered
