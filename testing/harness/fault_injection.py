"""Faults injected from inside a real ``train.py`` run.

Selected with Hydra overrides, e.g.
``model._target_=testing.harness.fault_injection.FaultInjectingModule
+model.fault=raise +model.fault_rank=1 +model.fault_step=2 +model.probe_dir=<dir>``
(:mod:`~testing.harness.train_faults` builds them). Each rank writes
``probe_rank{r}.json`` at its first training step (its pid and every descendant's, for the
orphan check) and, at the fault step, ``fault.json`` (the ``time.monotonic()`` of the
fault, comparable across processes on Linux) just before the fault.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
from typing_extensions import override

from odb_lightning.data.qwen_bpe import QwenTokenizer
from odb_lightning.lit.model.module import CausalLMModule
from testing.harness.processes import descendants, listening_sockets

FAULT_MOMENTS = ("step", "backward", "batch_end")
"""When in its step the fault fires: at ``training_step``'s start, as the backward
reaches the loss, or in ``on_train_batch_end`` after every callback's."""


class Fault(StrEnum):
    """What the fault rank does at the fault step."""

    NONE = "none"
    RAISE = "raise"  # RuntimeError in training_step
    KILL = "kill"  # SIGKILL of its own main process (preemption, OOM killer)
    SIGTERM = "sigterm"  # SIGTERM to its own main process (scheduler stop, `kill <pid>`)
    SIGINT = "sigint"  # SIGINT to the whole process group (Ctrl-C in the terminal)
    SIGUSR1 = "sigusr1"  # SIGUSR1 to its own main process (SLURM's --signal before the limit)
    SIGTERM_HANG = "sigterm_hang"  # SIGTERM to itself, then a step that never ends


def write_json(path: Path, value: Any) -> None:
    """Write atomically: a reader polling for ``path`` never sees half a file (each
    process writes its own partial file: with ``fault_rank=-1`` every rank writes
    ``fault.json`` at once)."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(value))
    partial.replace(path)


class FaultInjectingModule(CausalLMModule):
    """``CausalLMModule`` that injects ``fault`` on ``fault_rank`` at training step
    ``fault_step`` (counted over the whole run, from 0) and writes the probes.

    Args:
        fault: A :class:`Fault` value.
        fault_rank: Global rank that injects it (``-1``: every rank).
        fault_step: Training step (0-based, over all epochs) at which it is injected.
        fault_moment: When in that step (:data:`FAULT_MOMENTS`).
        probe_dir: Where the probe files go (required).
        socket_probe_step: Rank 0 records every listening socket of the job's processes
            at this step (``sockets.json``). Step 0 already sees every rank's loader: no
            batch exists before the first alignment round, which every rank's collate
            process (and its metadata channel) takes part in.
        **kwargs: ``CausalLMModule`` arguments.
    """

    def __init__(
        self,
        *,
        probe_dir: str,
        fault: str = Fault.NONE.value,
        fault_rank: int = 1,
        fault_step: int = 2,
        fault_moment: str = "step",
        socket_probe_step: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.fault, self.fault_rank, self.fault_step = Fault(fault), fault_rank, fault_step
        if fault_moment not in FAULT_MOMENTS:
            raise ValueError(f"fault_moment must be one of {FAULT_MOMENTS}, got {fault_moment!r}")
        self.fault_moment = fault_moment
        self.probe_dir = Path(probe_dir)
        self.socket_probe_step = socket_probe_step
        self._steps = 0

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        rank, step = self.global_rank, self._steps
        self._steps += 1
        if step == 0:
            pid = os.getpid()
            probe = {"pid": pid, "descendants": descendants(pid)}
            write_json(self.probe_dir / f"probe_rank{rank}.json", probe)
        if step == self.socket_probe_step and rank == 0:
            self._probe_sockets()
        if not self._faults_here(step):
            return super().training_step(batch, batch_idx)
        if self.fault_moment == "step":
            self._inject()
        loss = super().training_step(batch, batch_idx)
        if self.fault_moment == "backward":
            # Fires when the backward reaches the loss: the step's gradient collectives
            # are about to run on every rank.
            loss.register_hook(lambda grad: self._inject() or grad)
        return loss

    @override
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        if self.fault_moment == "batch_end" and self._faults_here(self._steps - 1):
            self._inject()  # after the callbacks' hooks of this step

    def _faults_here(self, step: int) -> bool:
        return step == self.fault_step and self.fault_rank in (self.global_rank, -1)

    def _probe_sockets(self) -> None:
        pid = os.getpid()
        write_json(
            self.probe_dir / "sockets.json",
            {
                "master_port": int(os.environ["MASTER_PORT"]),
                "listening": listening_sockets([pid, *descendants(pid)]),
            },
        )

    def _inject(self) -> None:
        if self.fault is Fault.NONE:
            return
        write_json(self.probe_dir / "fault.json", {"at": time.monotonic(), "pid": os.getpid()})
        if self.fault is Fault.RAISE:
            raise RuntimeError(
                f"injected failure in training_step {self._steps - 1} on rank {self.global_rank}"
            )
        if self.fault is Fault.KILL:
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.fault is Fault.SIGTERM:
            os.kill(os.getpid(), signal.SIGTERM)
        elif self.fault is Fault.SIGUSR1:
            os.kill(os.getpid(), signal.SIGUSR1)
        elif self.fault is Fault.SIGTERM_HANG:
            os.kill(os.getpid(), signal.SIGTERM)
            threading.Event().wait()  # no step boundary, ever: the stop's deadline ends it
        else:
            os.killpg(os.getpgid(0), signal.SIGINT)


class RaisingTokenizer(QwenTokenizer):
    """The Qwen tokenizer, except that text containing ``trigger`` raises ``ValueError``:
    a record whose preprocessing fails inside the loader's workers."""

    def __init__(self, trigger: str = "TRIGGER-PREPROCESSING-FAILURE") -> None:
        super().__init__()
        self.trigger = trigger

    @override
    def encode_text(self, text: str) -> list[int]:
        if self.trigger in text:
            raise ValueError(f"cannot tokenize text containing {self.trigger!r}")
        return super().encode_text(text)

    @override
    def encode_rendered(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        if self.trigger in text:
            raise ValueError(f"cannot tokenize text containing {self.trigger!r}")
        return super().encode_rendered(text)
