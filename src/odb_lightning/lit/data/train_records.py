"""What the data module knows at setup of its training records' supervision: the records
without a supervised token and those cut to ``max_seq_len``, and the refusal of a training
set with no supervised token at all."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch.utils.data import Dataset

from odb_lightning.data.config import DataSource
from odb_lightning.data.dataset import ChatDataset
from odb_lightning.lit.callbacks.run_report import NoSupervisedTokensError


def count_train_records(
    dataset: Dataset,
    indices: Sequence[int],
    lengths: Sequence[int],
    loss_tokens: Sequence[int] | None,
    max_seq_len: int,
) -> tuple[dict[str, int], list[int]]:
    """The counts of the training records at ``indices`` (``lengths`` theirs, in order),
    and the dataset indices of those without a supervised token (in ``indices``' order).

    Length-pass modes know every sample's supervised tokens and length: the counts are
    exact (a record of exactly ``max_seq_len`` tokens counts as truncated). Online modes
    tokenize in the workers only, so here a text scan finds the records with no assistant
    turn; truncation is counted by the loader's epoch statistics. Synthetic data is
    supervised everywhere and counts nothing.
    """
    if loss_tokens is not None:
        chosen = np.asarray(indices, dtype=np.int64)
        unsupervised = chosen[np.asarray(loss_tokens)[chosen] == 0].tolist()
        counts = {
            "unsupervised_samples": len(unsupervised),
            "truncated_samples": int(np.count_nonzero(np.asarray(lengths) >= max_seq_len)),
        }
    elif isinstance(dataset, ChatDataset):
        unsupervised = dataset.unsupervised_indices(indices)
        counts = {"unsupervised_samples": len(unsupervised)}
    else:
        return {}, []
    return counts, unsupervised


def data_named(source: DataSource) -> str:
    """The data as its keys name it: ``data.source.name='jsonl' data.source.path='...'``."""
    where = f"data.source.name={source.name!r}"
    return where + (f" data.source.path={source.path!r}" if source.path is not None else "")


def no_supervision_error(
    source: DataSource, read: int, num_train: int, max_seq_len: int, *, exact: bool
) -> NoSupervisedTokensError:
    """The refusal of a training set without a supervised token, naming the data
    (``data.source``), what was read, and why none is supervised (``exact``: the length
    pass counted every record's supervised tokens)."""
    where = data_named(source)
    why = (
        f"every one has 0 supervised tokens after the template and max_seq_len={max_seq_len}"
        if exact
        else "none has an assistant turn"
    )
    return NoSupervisedTokensError(
        f"{where}: no supervised tokens to train on: read {read} records, "
        f"{num_train} for training, and {why}. SFT trains on assistant "
        "turns only (user and system turns are context): add assistant turns, or "
        "check the role names of the source"
    )


def refuse_unsupervised(
    source: DataSource,
    read: int,
    num_train: int,
    num_unsupervised: int,
    max_seq_len: int,
    *,
    exact: bool,
) -> None:
    """Raise :func:`no_supervision_error` where every one of ``num_train`` training
    records (> 0) is without a supervised token."""
    if num_train and num_unsupervised == num_train:
        raise no_supervision_error(source, read, num_train, max_seq_len, exact=exact)


class NoTrainingRecordsError(NoSupervisedTokensError):
    """The source gave no record at all to train on (an empty file, every line rejected)."""


def no_records_error(
    source: DataSource, counts: dict[str, int], on_bad_record: str
) -> NoTrainingRecordsError:
    """The refusal of a source that kept no record, naming the data, what was read and
    dropped (``counts``: the source's ``read``, ``kept`` and ``dropped/<reason>``), and the
    fix."""
    where = data_named(source)
    read = counts.get("read", 0)
    rejected = counts.get("dropped/bad_record", 0)
    if read == 0:
        what = "the file has no non-blank line" if source.path else "the source is empty"
        found, fix = f"{what} (0 records read)", "point data.source.path at your conversations"
    elif rejected == read:
        found = (
            f"read {read} lines and rejected all {read} as bad records "
            f"(batching.loader.on_bad_sample={on_bad_record} skipped them)"
        )
        fix = (
            "fix the lines: with batching.loader.on_bad_sample=raise the first bad one is "
            "named with its line number and field"
        )
    else:
        dropped = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()) if k != "read")
        found, fix = (
            f"read {read} records and kept none ({dropped})",
            "check data.sizes.max_samples",
        )
    example = '{"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}'
    return NoTrainingRecordsError(
        f"{where}: no records to train on: {found}. Each line is one conversation, {example}: {fix}"
    )
