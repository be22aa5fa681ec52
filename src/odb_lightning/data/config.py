"""The data configuration by concern: the source, the sizes, the caches.

Each concern is a frozen dataclass whose fields are the keys of its Hydra node
(``data.source.*``, ``data.sizes.*``, ``data.caches.*``); each field's doc sits under it
and each check names the key. The data modules take the three objects whole; the app
generates each data node from these defaults (``app/config_store.py``), so a default is
written once. ``data.streaming`` and, for image-text data, ``data.images`` are the data
module's own arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import TYPE_CHECKING, Any

from odb_lightning.core.checks import is_int
from odb_lightning.data.formats import FieldMapping, format_named
from odb_lightning.data.sizes import check_size
from odb_lightning.data.sources.table import SOURCES, Source, source_named

if TYPE_CHECKING:
    from odb_lightning.data.augment import Augmentation


@dataclass(frozen=True)
class DataSource:
    """Where the records come from and how they become tokens (``data.source``)."""

    name: str = "sharegpt"
    """A source of the source table (:data:`~odb_lightning.data.sources.table.SOURCES`):
    ``sharegpt``, ``chitchat``, ``ultrachat``, ``jsonl``, ``synthetic`` (text);
    ``llava_jsonl``, ``llava``, ``sharegpt4o`` (image-text)."""
    path: str | None = None
    """The user's data: a JSON Lines file (``jsonl``, ``llava_jsonl``), a parquet file,
    directory or hub name (``ultrachat``). Required by those sources, unused by the rest."""
    format: str = "auto"
    """The record layout of the user's files (``jsonl``): ``messages``, ``sharegpt``,
    ``alpaca``, ``prompt_completion`` or ``text`` (:mod:`odb_lightning.data.formats`);
    ``auto`` detects it from the first record and the log says what it found."""
    mapping: FieldMapping | None = None
    """A layout of your own (``jsonl``): ``{messages: <field of the turns>, role: <key>,
    content: <key>, roles: {<speaker>: user|assistant|system}}``, each key defaulting to
    the ``messages`` layout's (:class:`~odb_lightning.data.formats.FieldMapping`); instead
    of ``format``."""
    regime: str = "whole"
    """ShareGPT ``whole``, ``first_exchange`` or ``mix``; for ``synthetic`` the length
    profile (``sharegpt_whole``, ``sharegpt_first_exchange``, ``sharegpt_mix``)."""
    template: str = "auto"
    """The chat template: ``auto`` (the tokenizer's own where its ``{% generation %}``
    blocks mark the assistant tokens, else the layout it shows), ``chatml``, ``qwen3``,
    ``llama3``, ``mistral``, ``gemma`` or ``hf``; checked against the tokenizer when the
    data module is built."""
    system_prompt: str | None = None
    """The system turn of conversations that have none (``None``: no system turn)."""
    augmentation: Augmentation | None = None
    """Seeded per-epoch augmentation (:class:`~odb_lightning.data.Augmentation`; changes
    lengths between epochs, so length-pass modes and image-text sources refuse it)."""
    image_root: str | None = None
    """Directory of relative image paths (``llava_jsonl``; ``None``: the file's own
    directory)."""

    def __post_init__(self) -> None:
        format_named(self.format)  # an unknown layout fails here, listing the layouts
        if self.mapping is not None and not isinstance(self.mapping, FieldMapping):
            object.__setattr__(self, "mapping", FieldMapping(**dict(self.mapping)))
        if self.mapping is not None and self.format != "auto":
            raise ValueError(
                f"data.source.mapping is a layout of its own: drop "
                f"data.source.format={self.format} (or the mapping)"
            )
        source = self.entry  # an unknown name fails here, listing the sources
        if (self.format != "auto" or self.mapping is not None) and not source.layouts:
            readers = ", ".join(s.name for s in SOURCES.values() if s.layouts)
            raise ValueError(
                f"data.source.format={self.format}: data.source.name={self.name} has one "
                f"layout of its own; the layouts are read from your files ({readers})"
            )
        if source.needs_path and self.path is None:
            raise ValueError(
                f"data.source.path is required by data.source.name={self.name}: the file, "
                "directory or hub name to read"
            )

    @property
    def entry(self) -> Source:
        """The source table's entry of :attr:`name`."""
        return source_named(self.name)


@dataclass(frozen=True)
class DataSizes:
    """How much of the source is read, held out, and how long a sample may be
    (``data.sizes``). A count, a fraction in ``(0, 1)`` of the records, or ``None``
    (:mod:`odb_lightning.data.sizes`)."""

    max_seq_len: int = 4096
    """Samples are right-truncated to this many tokens (at most ``batching.token_budget``:
    a sample must fit one step)."""
    max_samples: int | float | None = None
    """Records read from the source (train and validation): a count, a fraction of the
    source's records, or ``None`` for all of them."""
    val_samples: int | float | None = 64
    """Records held out for validation (a seeded choice): a count, a fraction of the
    records read, or 0/``None`` for no validation."""

    def __post_init__(self) -> None:
        if not (is_int(self.max_seq_len) and self.max_seq_len >= 1):
            raise ValueError(
                f"data.sizes.max_seq_len must be an integer >= 1, got {self.max_seq_len!r}"
            )
        check_size("data.sizes.max_samples", self.max_samples, least=1)
        check_size("data.sizes.val_samples", self.val_samples, least=0)


@dataclass(frozen=True)
class DataCaches:
    """Where the data's derived files are kept, each keyed by a fingerprint of what it
    was made from; every one is safe to delete (``data.caches``)."""

    record_dir: str | None = None
    """Record tables: every source with a reader is converted once into a memory-mapped
    Arrow table here, shared by ranks and loader workers (``None``: the ``datasets``
    cache's ``odb_lightning/records``)."""
    length_dir: str | None = None
    """Exact lengths of the length-pass modes (``sorted``, ``bucketed``, ``oracle``),
    keyed by source, tokenizer, template, ``max_seq_len`` and augmentation (``None``: no
    cache; the pass runs every time)."""
    stream_dir: str | None = None
    """LitData chunks of a streamed file (``data.streaming=true``), keyed by its path,
    size and modification time."""
    image_set_dir: str | None = None
    """Where the written image-text sets (``llava``, ``sharegpt4o``) are written."""


CONCERNS = {"source": DataSource, "sizes": DataSizes, "caches": DataCaches}
"""Each data concern by its key under ``data``."""


def split_concerns(fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keyword form: flat data fields (``name="jsonl", path=..., max_seq_len=...``)
    routed to the concern whose dataclass has the field (names are unique across
    concerns), as ``{"source": DataSource(...), ...}``, and the fields no concern has."""
    concerns, rest = {}, dict(fields)
    for key, kind in CONCERNS.items():
        names = {f.name for f in dataclass_fields(kind)}
        mine = {name: rest.pop(name) for name in list(rest) if name in names}
        concerns[key] = kind(**mine)
    return concerns, rest
