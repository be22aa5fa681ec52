"""Per-page digests of a cache's files: written when the cache is made, checked when it
is opened, so a cache proves that its content is the one its conversion wrote.

A file's digest is its size and the SHA-256 (128 bits kept) of each :data:`PAGE_BYTES`
page. A check compares the size, then the pages: all of them when the files checked
together are at most :data:`FULL_CHECK_BYTES` (about 0.1 s on one core), else the first
and the last page of each file and :data:`SAMPLED_PAGES` pages drawn at random on every
check. Files are opened without following a symbolic link.

The record tables (``data/record_table.py``) and the streams (``data/stream.py``) keep
their digests beside the data they cover.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any, BinaryIO

PAGE_BYTES = 1 << 20
"""The pages whose digests are kept."""
FULL_CHECK_BYTES = 64 << 20
"""Files up to this size together are checked whole on every open."""
SAMPLED_PAGES = 32
"""Pages drawn at random, besides each file's first and last, to check larger files."""


def page_digest(data: bytes) -> str:
    """The digest of one page (SHA-256, 128 bits in hex)."""
    return hashlib.sha256(data).hexdigest()[:32]


def open_nofollow(path: Path) -> BinaryIO:
    """``path`` opened for reading bytes, refused (``OSError``, ELOOP) if it is a link."""
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")


def content_digest(path: Path) -> dict[str, Any]:
    """``{"size", "page_bytes", "pages"}`` of the file at ``path``: what a check reads."""
    pages = []
    with open_nofollow(path) as file:
        while data := file.read(PAGE_BYTES):
            pages.append(page_digest(data))
    return {"size": path.stat().st_size, "page_bytes": PAGE_BYTES, "pages": pages}


def content_problem(digests: dict[Path, dict[str, Any]]) -> str | None:
    """How the files differ from their ``digests`` (:func:`content_digest` of each, when
    the cache was made), in the pages this check reads (the module docstring): the
    first difference found, naming the file and the page; ``None`` when none differs.

    Raises:
        OSError: A file is missing, unreadable, or a symbolic link.
    """
    for path, digest in digests.items():
        size = path.lstat().st_size
        if size != digest["size"]:
            return f"{path.name}: {size:,} bytes, {digest['size']:,} when written"
    every = [(path, k) for path, d in digests.items() for k in range(len(d["pages"]))]
    chosen = every
    if sum(digest["size"] for digest in digests.values()) > FULL_CHECK_BYTES:
        ends = {(path, k) for path, d in digests.items() for k in _ends(d)}
        drawn = random.SystemRandom().sample(every, min(SAMPLED_PAGES, len(every)))
        chosen = sorted(ends | set(drawn))
    for path, page in chosen:
        digest = digests[path]
        with open_nofollow(path) as file:
            file.seek(page * digest["page_bytes"])
            data = file.read(digest["page_bytes"])
        if page_digest(data) != digest["pages"][page]:
            start = page * digest["page_bytes"]
            return (
                f"{path.name}: page {page} of {len(digest['pages'])} (bytes {start:,} on) "
                "differs from its digest when written"
            )
    return None


def _ends(digest: dict[str, Any]) -> list[int]:
    count = len(digest["pages"])
    return sorted({0, count - 1}) if count else []
