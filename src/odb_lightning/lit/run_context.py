"""What the application knows of a run before ``fit``, handed whole to every component.

The app builds one :class:`RunContext` and gives it to the LightningModule, the data
module and the callbacks, so that no component reads another's attributes through the
trainer. Facts known before ``fit`` are plain fields; the one fact known only once the
data is read (the training samples per epoch) is a :class:`TrainSampleCount` that the data
module fills at ``setup`` and the others read after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class TrainSampleCount:
    """Training samples per epoch: written once by the data module's ``setup``, read by
    the sample-budget LR schedule and the progress bar (after ``setup``)."""

    def __init__(self, value: int | None = None) -> None:
        self._value = value

    def set(self, value: int) -> None:
        """Record the count (the data module, at ``setup``)."""
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"a training sample count must be an integer >= 0, got {value!r}")
        self._value = value

    @property
    def known(self) -> bool:
        return self._value is not None

    def get(self) -> int | None:
        """The count, or ``None`` before the data module's ``setup``."""
        return self._value


@dataclass(frozen=True)
class RunContext:
    """The facts of one run that several components need.

    Attributes:
        vocab_size: The model's input vocabulary, against which the loaders check token
            ids; ``None`` when it is not known or the model folds token ids.
        world_size: Processes of the job (``devices x num_nodes``).
        device: The accelerator the trainer runs on (``cpu``, ``cuda``, ...).
        train_samples: Training samples per epoch, known after the data module's setup.
        output_dir: The run directory (``paths.output_dir``), where components write the
            run's files (the data module's ``skipped_records.jsonl``); ``None``: none.
    """

    vocab_size: int | None = None
    world_size: int = 1
    device: str = "cpu"
    train_samples: TrainSampleCount = field(default_factory=TrainSampleCount)
    output_dir: str | None = None
