"""The user's files as rows: JSON Lines, a JSON array, parquet, a folder or glob of those,
a ``datasets`` folder written by ``save_to_disk``, or a set ``datasets.load_dataset``
reads (a hub name where the hub is reachable, or a local copy of a hub repository: a
folder whose data files sit in sub-folders, ``data/train-*.parquet``).

Each row comes with where it is (``<file>:<line>`` for lines, ``<file>[<k>]`` for an
array's element, ``<file>#<row>`` for a table's row) and its number in its file; a line
is left as bytes, for the record reader to decode and name what is wrong with it. The
files of a folder are read in name order.
"""

from __future__ import annotations

import glob
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from odb_lightning.data.sources.hub import hub_unreachable

ROW_SUFFIXES = (".jsonl", ".json", ".parquet")
"""The file kinds read, in a folder and by suffix."""

Row = tuple[str, int, bytes | Any]
"""Where a row is, its 1-based number in its file, and the row: a line's bytes, or a
decoded value."""


class DataPathError(FileNotFoundError):
    """``data.source.path`` names nothing readable; the message says what was found."""


HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+")
"""A hub name: ``<owner>/<name>``."""
HUB_SPLIT = "train"
"""The split read of a set :func:`datasets.load_dataset` reads."""


@dataclass(frozen=True)
class HubSet:
    """A set read by :func:`datasets.load_dataset`: a hub name, or a local copy of a hub
    repository (its :data:`HUB_SPLIT` split)."""

    name: str

    def __str__(self) -> str:
        return self.name


DataFile = Path | HubSet
"""One thing rows are read from."""


def is_saved_dataset(path: Path) -> bool:
    """A folder written by ``datasets``' ``save_to_disk`` (a dataset or a dataset dict)."""
    return path.is_dir() and (
        (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()
    )


def _holds_data_below(folder: Path) -> bool:
    """Data files in a sub-folder (a local copy of a hub repository)."""
    return any(
        f.suffix in ROW_SUFFIXES and not any(part.startswith(".") for part in f.parts)
        for f in folder.rglob("*")
    )


def data_files(path: str | Path) -> list[DataFile]:
    """The files a path names: itself, a folder's files of :data:`ROW_SUFFIXES` (in name
    order), or a glob's matches; a ``save_to_disk`` folder as itself; a hub name, or a
    folder whose data files are all in sub-folders, as a :class:`HubSet`.

    Raises:
        DataPathError: Nothing readable there, in one sentence naming what was found.
    """
    text = str(path)
    local = Path(text).expanduser()
    if any(c in text for c in "*?["):
        files = [Path(p) for p in sorted(glob.glob(text, recursive=True)) if Path(p).is_file()]
    elif is_saved_dataset(local) or local.is_file():
        return [local]
    elif local.is_dir():
        files = sorted(p for p in local.iterdir() if p.is_file())
        if not any(f.suffix in ROW_SUFFIXES for f in files) and _holds_data_below(local):
            return [HubSet(str(local))]
    elif HUB_NAME.fullmatch(text) and not text.startswith("."):
        return [HubSet(text)]
    else:
        raise DataPathError(
            f"data.source.path={text!r}: no such file or folder (nor a hub name, <owner>/<name>)"
        )
    kept = [f for f in files if f.suffix in ROW_SUFFIXES and not f.name.startswith(".")]
    if not kept:
        found = ", ".join(sorted({f.suffix or f.name for f in files})) or "nothing"
        raise DataPathError(
            f"data.source.path={text!r}: found {found}; conversations are read from "
            f"{', '.join(ROW_SUFFIXES)} files, a folder of them or a save_to_disk folder"
        )
    return kept


def file_lines(path: Path) -> Iterator[Row]:
    """The non-blank lines of a JSON Lines file."""
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            if raw.strip():
                yield f"{path}:{number}", number, raw


def _is_array(path: Path) -> bool:
    with path.open("rb") as file:
        head = file.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"[")


def _array(path: Path) -> Iterator[Row]:
    try:
        values = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataPathError(f"data.source.path: {path} is not a JSON array: {error}") from None
    for k, value in enumerate(values):
        yield f"{path}[{k}]", k + 1, value


def _table(path: Path) -> Iterator[Row]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
    else:
        from datasets import DatasetDict, load_from_disk

        saved = load_from_disk(str(path))
        if isinstance(saved, DatasetDict):
            if "train" not in saved:
                splits = ", ".join(saved)
                raise DataPathError(
                    f"data.source.path={str(path)!r}: a dataset dict without a 'train' split "
                    f"(it has {splits}); save the split to read with save_to_disk"
                )
            saved = saved["train"]
        batches = saved.with_format("arrow").iter(batch_size=1024)
    number = 0
    for batch in batches:
        for row in batch.to_pylist():
            number += 1
            yield f"{path}#{number}", number, row


def _hub(hub: HubSet) -> Iterator[Row]:
    import datasets

    local = Path(hub.name).is_dir()
    where = "a local copy of a hub repository" if local else "a hub name"
    fix = (
        "save the set with save_to_disk or as parquet where the hub is reachable, and give "
        "its folder"
    )
    if not local and (reason := hub_unreachable()):
        raise DataPathError(f"data.source.path={hub.name!r} is {where}, and {reason}: {fix}")
    try:
        table = datasets.load_dataset(hub.name, split=HUB_SPLIT)
    except (ConnectionError, OSError, ValueError) as error:
        raise DataPathError(
            f"data.source.path={hub.name!r} is {where}, and datasets.load_dataset could not "
            f"read its {HUB_SPLIT!r} split ({type(error).__name__}: {error}): {fix}"
        ) from None
    number = 0
    for batch in table.with_format("arrow").iter(batch_size=1024):
        for row in batch.to_pylist():
            number += 1
            yield f"{hub.name}#{number}", number, row


def iter_rows(files: list[DataFile]) -> Iterator[Row]:
    """Every row of ``files`` (those a path names: :func:`data_files`), file after file."""
    for file in files:
        if isinstance(file, HubSet):
            yield from _hub(file)
        elif file.is_dir() or file.suffix == ".parquet":
            yield from _table(file)
        elif file.suffix == ".json" and _is_array(file):
            yield from _array(file)
        else:
            yield from file_lines(file)
