"""A callback that holds every rank at one step boundary until the test lets it go, so a
test can send a scheduler's signal while training is known to be under way, and without a
race against the end of training.

Added to a run with ``+callbacks.pause._target_=testing.harness.pause.PauseAtStep
+callbacks.pause.step=<S> +callbacks.pause.directory=<dir>``: after optimizer step ``S``
each rank writes ``<dir>/paused.rank<r>`` and waits for ``<dir>/go`` (at most
``timeout_s``). A resumed run past step ``S`` never pauses.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

POLL_S = 0.05


class PauseAtStep(Callback):
    """Holds each rank after optimizer step ``step`` until ``<directory>/go`` exists."""

    def __init__(self, step: int, directory: str, timeout_s: float = 300.0) -> None:
        self.step, self.directory, self.timeout_s = step, Path(directory), timeout_s

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step != self.step:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / f"paused.rank{trainer.global_rank}").write_text(str(self.step))
        deadline = time.monotonic() + self.timeout_s
        while not (self.directory / "go").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.directory / 'go'} did not appear in {self.timeout_s}s")
            time.sleep(POLL_S)
