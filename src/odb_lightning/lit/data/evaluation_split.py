"""The seeded validation hold-out, the splits a data module evaluates (held-out, training,
every record), and the unaugmented view of a dataset that validation and evaluation
measure."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from torch.utils.data import Dataset

from odb_lightning.core.order import epoch_permutation
from odb_lightning.data.sizes import validation_count

EVALUATION_SPLITS = ("val", "train", "all")
"""What :meth:`~odb_lightning.lit.data.datamodule.ODBDataModule.evaluation_loader` evaluates:
the held-out records, the training records, or every record read."""


def check_split(split: str) -> None:
    """Refuse a split :meth:`ODBDataModule.evaluation_loader` does not know."""
    if split not in EVALUATION_SPLITS:
        raise ValueError(f"split must be one of {', '.join(EVALUATION_SPLITS)}, got {split!r}")


def split_indices(
    split: str, val_indices: Sequence[int], train_indices: Sequence[int], num_records: int
) -> list[int]:
    """The sorted dataset indices of ``split``: ``val`` (the held-out records), ``train``
    or ``all`` (every record read).

    Raises:
        ValueError: An unknown split, or one that holds no records.
    """
    check_split(split)
    splits = {"val": val_indices, "train": train_indices, "all": range(num_records)}
    indices = sorted(splits[split])
    if not indices:
        raise ValueError(f"split={split!r} holds no records (data.sizes.val_samples=0?)")
    return indices


def without_augmentation(dataset: Dataset) -> Dataset:
    """The same samples, never augmented: validation measures the unaugmented data."""
    if getattr(dataset, "augmentation", None) is None:
        return dataset
    plain = copy.copy(dataset)
    plain.augmentation = None
    return plain


def hold_out(
    num_records: int, val_samples: int | float | None, seed: int
) -> tuple[list[int], list[int]]:
    """The validation and training indices of ``num_records`` records, each sorted:
    ``val_samples`` of them (:func:`~odb_lightning.data.sizes.validation_count`) drawn by
    ``seed``.

    Raises:
        ValueError: ``val_samples`` leaves no training record.
    """
    num_val = validation_count(val_samples, num_records)
    if num_val and num_val >= num_records:
        raise ValueError(
            f"val_samples ({val_samples}) leaves no training data: the source has "
            f"{num_records} records; hold out a fraction (data.sizes.val_samples=0.1) or "
            "fewer records"
        )
    order = epoch_permutation(num_records, seed, epoch=-1)
    return sorted(order[:num_val]), sorted(order[num_val:])
