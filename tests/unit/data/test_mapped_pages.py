"""A process reading a memory-mapped record table at random keeps only the pages of its
last few hundred rows mapped, reads the same records, and never touches a mapping its own
table does not hold."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")

from odb_lightning.data.mapped_pages import PageRelease, mapped_ranges  # noqa: E402
from odb_lightning.data.sources.arrow_records import (  # noqa: E402
    TableRecords,
    record_schema,
    table_row,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux mappings")

NUM_ROWS = 12_000


def resident_kib(path: Path) -> dict[int, int]:
    """Resident KiB of each of this process's mappings of ``path``, by start address."""
    by_start: dict[int, int] = {}
    start = None
    name = str(path.resolve())
    with open("/proc/self/smaps", encoding="utf-8") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                start = int(fields[0].split("-")[0], 16) if fields[-1] == name else None
            elif start is not None and fields[0] == "Rss:":
                by_start[start] = by_start.get(start, 0) + int(fields[1])
    return by_start


def mapped_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of ``path`` (``/proc/self/smaps``)."""
    return sum(resident_kib(path).values())


@pytest.fixture(scope="module")
def table_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A record table of 12,000 conversations of about 1.5 KB (18 MB)."""
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    rows = []
    for k in range(NUM_ROWS):
        text = " ".join(rng.choices(words, k=250))
        record = {
            "id": f"r{k}",
            "messages": [
                {"role": "user", "content": text[:700]},
                {"role": "assistant", "content": text[700:]},
            ],
        }
        rows.append(table_row(record, images=False))
    path = tmp_path_factory.mktemp("table") / "records.arrow"
    schema = record_schema(False)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for start in range(0, NUM_ROWS, 1000):
            writer.write_batch(
                pa.RecordBatch.from_pylist(rows[start : start + 1000], schema=schema)
            )
    return path


def read_at_random(records: TableRecords, count: int) -> list[str]:
    rng = random.Random(1)
    return [json.dumps(records[rng.randrange(len(records))]) for _ in range(count)]


def test_released_reads_keep_a_bounded_mapping_and_the_same_records(table_file: Path) -> None:
    kept = TableRecords(datasets.Dataset.from_file(str(table_file)))
    kept._pages.every_rows = 0  # never released
    released = TableRecords(datasets.Dataset.from_file(str(table_file)))
    released._pages.every_rows = 8
    baseline = mapped_kib(table_file)

    expected = read_at_random(kept, 1500)
    grown = mapped_kib(table_file) - baseline
    del kept
    baseline = mapped_kib(table_file)
    assert read_at_random(released, 1500) == expected  # the same records after each release
    bounded = mapped_kib(table_file) - baseline

    size_kib = table_file.stat().st_size // 1024
    assert grown > size_kib // 2  # read at random, unreleased: most of the table stays mapped
    assert bounded < grown // 4, (bounded, grown, size_kib)
    # In order too: iterating the whole table leaves at most a few batches mapped.
    assert sum(1 for _ in released) == NUM_ROWS
    assert mapped_kib(table_file) - baseline < size_kib // 4


def test_a_release_leaves_another_tables_mapping_of_the_same_file(table_file: Path) -> None:
    ours = datasets.Dataset.from_file(str(table_file))
    other = TableRecords(datasets.Dataset.from_file(str(table_file)))
    other._pages.every_rows = 0
    read_at_random(other, 2000)
    ours_address = ours.data.table.column(0).chunks[0].buffers()[1].address
    (ours_start,) = [
        start for start, end in mapped_ranges([table_file]) if start <= ours_address < end
    ]
    before = resident_kib(table_file)
    others_before = sum(kib for start, kib in before.items() if start != ours_start)
    assert len(before) >= 2 and others_before > 1024
    advised = PageRelease([table_file]).release(ours.data.table)
    assert advised > 0  # our own mapping was advised ...
    after = resident_kib(table_file)
    assert after.get(ours_start, 0) < before[ours_start] or before[ours_start] == 0
    # ... and the other table's pages are all still mapped.
    assert sum(kib for start, kib in after.items() if start != ours_start) == others_before
