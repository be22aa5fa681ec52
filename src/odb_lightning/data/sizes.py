"""Data sizes given as counts or as fractions of what the source holds.

``data.sizes.max_samples`` and ``data.sizes.val_samples`` take an integer (a count), a fraction in
``(0, 1)`` of the records the source has, or ``null`` (``max_samples``: every record;
``val_samples``: no validation). So one config fits a file of 20 records and one of 2
million: ``val_samples: 0.05`` holds out 5% of either.
"""

from __future__ import annotations

import math

from odb_lightning.core.checks import is_int


def check_size(name: str, value: object, *, least: int) -> None:
    """Refuse a size that is neither ``null``, an integer ``>= least``, nor a fraction
    in ``(0, 1)``; the message starts with ``name``."""
    if value is None or (is_int(value) and value >= least):
        return
    is_fraction = isinstance(value, float) and 0.0 < value < 1.0
    if not is_fraction:
        raise ValueError(
            f"{name} must be null, an integer >= {least} or a fraction in (0, 1) of the "
            f"source's records, got {value!r}"
        )


def records_to_read(max_samples: int | float | None) -> int | None:
    """How many records the source must yield: a count caps it, a fraction or ``null``
    needs all of them (the fraction is taken by :func:`kept_records`)."""
    return max_samples if is_int(max_samples) else None


def kept_records(max_samples: int | float | None, num_records: int) -> int:
    """Records kept of the ``num_records`` read: a fraction rounds down, keeping at
    least one of a non-empty source."""
    if isinstance(max_samples, float):
        return min(num_records, max(1, math.floor(max_samples * num_records)))
    return num_records if max_samples is None else min(max_samples, num_records)


def validation_count(val_samples: int | float | None, num_records: int) -> int:
    """Records held out for validation of ``num_records``.

    A fraction rounds to the nearest count, at least 1 and leaving at least one record
    for training (0 when there is a single record); ``null`` or 0 is no validation. An
    integer is taken as it is (the caller refuses one that leaves no training data).
    """
    if not val_samples:
        return 0
    if isinstance(val_samples, float):
        return (
            min(num_records - 1, max(1, round(val_samples * num_records))) if num_records > 1 else 0
        )
    return val_samples
