"""The shared validators: what counts as a count, and the messages that name the key."""

from __future__ import annotations

import pytest

from odb_lightning.core.checks import check_int, check_positive_int, is_count


@pytest.mark.parametrize(
    ("value", "least", "counts"),
    [(0, 0, True), (3, 1, True), (0, 1, False), (-1, 0, False), (True, 0, False),
     (2.0, 1, False), ("2", 1, False), (None, 0, False)],
)  # fmt: skip
def test_a_count_is_an_int_not_a_bool_of_at_least_least(
    value: object, least: int, counts: bool
) -> None:
    assert is_count(value, least) is counts


def test_messages_name_the_key_the_bound_and_the_value() -> None:
    check_int("pad_id", 0, least=0)
    with pytest.raises(ValueError, match=r"^pad_id must be an integer >= 0, got -1$"):
        check_int("pad_id", -1, least=0)
    check_positive_int("a.b", None, optional=True)
    with pytest.raises(ValueError, match=r"^a\.b must be a positive integer or null, got True$"):
        check_positive_int("a.b", True, optional=True)
