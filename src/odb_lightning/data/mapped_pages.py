"""Releasing the pages of a memory-mapped table that a process has read.

A memory-mapped Arrow table is read through the page cache, which every rank and loader
worker of a machine shares. But each page a process touches stays mapped in that process,
and the kernel maps the cached pages around each fault too (``fault_around_bytes``, 64 KiB:
about 290 KiB per row of a record table read at random, measured on a 1.2 GB table). A
loader worker reading rows at random across a large table so grows its resident and
proportional set size with every row it reads, towards the whole table in every worker:
clean pages the kernel could reclaim, but memory every monitor and scheduler counts.

:class:`PageRelease` bounds that: every ``every_rows`` rows read it advises the kernel that
the process no longer needs its mappings of the table's files (``MADV_DONTNEED``). On a
read-only shared file mapping that only drops the process's page-table entries: the data
stays in the page cache and the next read of a row maps it again (a minor fault), and
arrays already pointing into the mapping stay valid. Linux only; elsewhere (or where the
files are not found in ``/proc/self/maps``) it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

MADV_DONTNEED = 4
RELEASE_EVERY_ROWS = 256
"""Rows read between two releases: at about 290 KiB mapped per row, about 72 MiB (and one
read of ``/proc/self/maps``, well under a millisecond)."""


def _madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        # PyDLL keeps the GIL through the call: no other thread runs between the lookup of
        # the ranges and the advice.
        function = ctypes.PyDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def mapped_ranges(paths: Sequence[str | Path]) -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of ``paths`` (``/proc/self/maps``)."""
    names = {os.path.realpath(path) for path in paths}
    ranges = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].rstrip("\n") in names:
                    start, end = (int(address, 16) for address in fields[0].split("-"))
                    ranges.append((start, end))
    except OSError:
        return []
    return ranges


def buffer_addresses(table: pa.Table) -> list[int]:
    """An address inside each of ``table``'s record batches (its first column's buffers)."""
    addresses = []
    for chunk in table.column(0).chunks:
        addresses += [buffer.address for buffer in chunk.buffers() if buffer is not None]
    return addresses


class PageRelease:
    """Counts the rows a process reads from a memory-mapped table and releases its
    mappings of the table's files every ``every_rows`` rows (see the module docstring).

    Only a mapping of one of ``paths`` that holds one of the live table's own buffers is
    advised, so a range the table does not hold (unmapped since, and perhaps reused for
    other memory) never is.

    Args:
        paths: The table's files (``datasets.Dataset.cache_files``).
        every_rows: Rows between releases; ``0`` never releases.
    """

    def __init__(self, paths: Sequence[str | Path], every_rows: int = RELEASE_EVERY_ROWS) -> None:
        self.paths = [str(path) for path in paths]
        self.every_rows = every_rows
        self._rows = 0

    def read(self, table: pa.Table, rows: int = 1) -> None:
        """Note ``rows`` rows read from ``table`` (the live table over :attr:`paths`);
        release the mappings when ``every_rows`` have been."""
        if self.every_rows <= 0 or not self.paths:
            return
        self._rows += rows
        if self._rows >= self.every_rows:
            self._rows = 0
            self.release(table)

    def release(self, table: pa.Table) -> int:
        """Drop this process's page mappings of the files that hold ``table``'s buffers;
        the bytes advised."""
        madvise = _MADVISE
        if madvise is None:
            return 0
        # The ranges are looked up at every release, never kept: advising a range that has
        # since been unmapped and reused for anonymous memory would zero that memory.
        anchors = buffer_addresses(table)
        advised = 0
        for start, end in mapped_ranges(self.paths):
            ours = any(start <= address < end for address in anchors)
            if ours and madvise(start, end - start, MADV_DONTNEED) == 0:
                advised += end - start
        return advised


_MADVISE = _madvise()
