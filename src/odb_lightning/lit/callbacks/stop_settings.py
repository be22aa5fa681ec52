"""How a stop signal ends the run (the ``stop`` config group), apart from the callback
that stops (:mod:`odb_lightning.lit.callbacks.graceful_stop`): the config is composed and
checked before torch and Lightning load (``odb-check``)."""

from __future__ import annotations

from dataclasses import dataclass

from odb_lightning.core.checks import check_positive


@dataclass(frozen=True)
class StopSettings:
    """How a stop signal ends the run (Hydra group ``stop``)."""

    deadline_s: float = 25.0
    """Seconds from the first stop signal to this process's exit: the wait for the step
    boundary, the save of the stop checkpoint and the teardown. Past it, the process
    exits at once, the newest complete checkpoint on disk kept (the log names it). Below
    the scheduler's grace: SLURM's default is 30 s from SIGTERM to SIGKILL; with
    ``--signal=USR1@<s>`` (or submitit's ``signal_delay_s``) it may approach ``s``."""

    def __post_init__(self) -> None:
        check_positive("stop.deadline_s", self.deadline_s, "seconds")
