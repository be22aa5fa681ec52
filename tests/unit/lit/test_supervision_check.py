"""The check that refuses a first epoch without a supervised token judges whole epochs
only: an epoch a stop or ``max_steps`` cut short may have run only unsupervised samples of
a set that has supervised ones."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from odb_lightning.lit.callbacks.run_report import NoSupervisedTokensError
from odb_lightning.lit.callbacks.supervision import SupervisionCheck


def _trainer(*, should_stop: bool = False, max_steps: int = -1, global_step: int = 3,
             other_rank: list[float] | None = None) -> SimpleNamespace:  # fmt: skip
    """A trainer whose all-gather returns this rank's row and, given, another rank's."""

    def all_gather(local: torch.Tensor) -> torch.Tensor:
        rows = [local] + ([torch.tensor(other_rank, dtype=local.dtype)] if other_rank else [])
        return torch.stack(rows)

    return SimpleNamespace(
        strategy=SimpleNamespace(all_gather=all_gather),
        should_stop=should_stop,
        max_steps=max_steps,
        global_step=global_step,
        world_size=2 if other_rank else 1,
    )


def _check(loss_tokens: int = 0, samples: int = 6) -> SupervisionCheck:
    counters = SimpleNamespace(totals=SimpleNamespace(loss_tokens=loss_tokens, samples=samples))
    return SupervisionCheck(counters, max_seq_len=64)  # type: ignore[arg-type]


MODULE = SimpleNamespace(device=torch.device("cpu"))


def test_a_whole_epoch_without_a_supervised_token_is_refused() -> None:
    with pytest.raises(NoSupervisedTokensError, match="6 samples emitted over 1 rank"):
        _check().on_train_epoch_end(_trainer(), MODULE)  # type: ignore[arg-type]
    # Supervised tokens, or no samples at all: nothing to refuse.
    _check(loss_tokens=1).on_train_epoch_end(_trainer(), MODULE)  # type: ignore[arg-type]
    _check(samples=0).on_train_epoch_end(_trainer(), MODULE)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "trainer",
    [_trainer(should_stop=True), _trainer(max_steps=3, global_step=3)],
    ids=["stop requested", "max_steps reached"],
)
def test_an_epoch_cut_short_is_no_evidence(trainer: SimpleNamespace) -> None:
    _check().on_train_epoch_end(trainer, MODULE)  # type: ignore[arg-type]


def test_one_rank_cut_short_spares_every_rank() -> None:
    # This rank ran its whole share without a supervised token; the other rank's epoch was
    # cut short (its row: no tokens, 4 samples, cut short): neither raises.
    trainer = _trainer(other_rank=[0.0, 4.0, 1.0])
    _check().on_train_epoch_end(trainer, MODULE)  # type: ignore[arg-type]
    with pytest.raises(NoSupervisedTokensError, match="10 samples emitted over 2 rank"):
        _check().on_train_epoch_end(_trainer(other_rank=[0.0, 4.0, 0.0]), MODULE)  # type: ignore[arg-type]
