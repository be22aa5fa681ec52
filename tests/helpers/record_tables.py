"""What a process of the record-table race runs (importable by spawned children)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any


def convert_at_once(cache_dir: str, path: str, barrier: Any, readers: Any, results: Any) -> None:
    """Read ``path``'s records through a record table in ``cache_dir`` once every process
    of ``barrier`` is ready; count the reader runs in ``readers``; put the records and
    counts on ``results``."""
    from odb_lightning.data.record_table import RecordCache
    from odb_lightning.data.sources.jsonl import jsonl_source

    source = jsonl_source(path, on_bad_record="skip")

    def read(result: Any) -> Iterator[Any]:
        with readers.get_lock():
            readers.value += 1
        yield from source.read(result)

    barrier.wait(timeout=120)
    records = RecordCache(cache_dir).records(dataclasses.replace(source, read=read))
    results.put((list(records.records), dict(records.counts)))
