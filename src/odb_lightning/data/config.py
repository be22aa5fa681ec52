"""The data configuration by concern: the source (or a mixture of sources), the sizes,
the caches.

Each concern is a frozen dataclass whose fields are the keys of its Hydra node
(``data.source.*``, ``data.sizes.*``, ``data.caches.*``, each entry of ``data.mixture``);
each field's doc sits under it and each check names the key. The data modules take the
three objects whole; the app generates each data node from these defaults
(``app/config_store.py``), so a default is written once. ``data.streaming`` and, for
image-text data, ``data.images`` are the data module's own arguments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from odb_lightning.core.checks import enum_member, is_int
from odb_lightning.data.chat_formats import Supervision, ThinkBlock, Truncation
from odb_lightning.data.formats import FieldMapping, format_named
from odb_lightning.data.sizes import check_size
from odb_lightning.data.sources.table import SOURCES, Source, SourceKind, source_named

if TYPE_CHECKING:
    from odb_lightning.core.config import BatchingConfig
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
    """The chat template: ``auto`` (the tokenizer's own chat template, through a built-in
    layout only where a start-up probe finds it equal; the log says which, in one line),
    ``chatml``, ``qwen3``, ``llama3``, ``mistral``, ``gemma``, or ``hf`` (the tokenizer's
    own, always) (:mod:`odb_lightning.data.template_choice`); checked against the
    tokenizer when the data module is built."""
    system_prompt: str | None = None
    """The system turn of conversations that have none (``None``: none, or the one the
    tokenizer's own template gives, such as Qwen2.5's)."""
    think_block: str = "generation"
    """An empty think block the template puts before an answer (Qwen3's
    ``<think>\n\n</think>\n\n``): ``generation`` supervises it, as the template's
    generation and TRL do; ``prompt`` leaves it unsupervised
    (:class:`~odb_lightning.data.chat_formats.ThinkBlock`)."""
    supervise: str = "assistant"
    """Which tokens carry the loss: ``assistant`` (every assistant turn, its content and
    end-of-turn token), ``last_assistant`` (the last assistant turn of each chat only) or
    ``all`` (every token, system and user turns included)
    (:class:`~odb_lightning.data.chat_formats.Supervision`). Plain layouts
    (``prompt_completion`` strings, ``text``) keep their own rule."""
    augmentation: Augmentation | None = None
    """Seeded per-epoch augmentation (:class:`~odb_lightning.data.Augmentation`; changes
    lengths between epochs, so length-pass modes and image-text sources refuse it)."""
    image_root: str | None = None
    """Directory of relative image paths (``llava_jsonl``; ``None``: the file's own
    directory)."""

    def __post_init__(self) -> None:
        format_named(self.format)  # an unknown layout fails here, listing the layouts
        think = enum_member(ThinkBlock, "data.source.think_block", self.think_block)
        object.__setattr__(self, "think_block", think)
        supervise = enum_member(Supervision, "data.source.supervise", self.supervise)
        object.__setattr__(self, "supervise", supervise)
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
    """The most tokens of a sample (at most ``batching.token_budget``: a sample must fit
    one step); ``truncation`` says what happens to a longer one."""
    truncation: str = "turns"
    """A conversation longer than ``max_seq_len``: ``turns`` cuts whole turns from the
    start, keeping the system turn; ``drop`` drops it; ``tail`` cuts its end (the last
    answer may lose its end-of-turn token). A sample left without a supervised token is
    dropped; both are counted in the summary (``truncated_samples``,
    ``unsupervised_samples``) (:class:`~odb_lightning.data.chat_formats.Truncation`)."""
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
        truncation = enum_member(Truncation, "data.sizes.truncation", self.truncation)
        object.__setattr__(self, "truncation", truncation)
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


@dataclass(frozen=True)
class MixturePart:
    """One source of a mixture (an entry of ``data.mixture``): what ``data.source`` says
    of one source, and its share of the mixture.

    Each part is read as that source alone would be (its layout detected and said, its
    bad records named, converted once into its record table); ``data.source.template``,
    ``system_prompt`` and ``augmentation`` hold for every part. A part takes ``weight`` or
    ``samples``: weighted parts share the records that are left in proportion, as many as
    the part that runs out first allows (no record repeats); ``samples`` takes that many
    records of its part (repeating them where the part has fewer, said in the log).
    ``data.sizes.max_samples`` caps the whole mixture, each part scaled alike.
    """

    path: str | None = None
    """The part's data (as ``data.source.path``)."""
    name: str = "jsonl"
    """Its source (as ``data.source.name``; a text source of the source table)."""
    format: str = "auto"
    """Its record layout (as ``data.source.format``)."""
    mapping: FieldMapping | None = None
    """A layout of its own (as ``data.source.mapping``)."""
    regime: str = "whole"
    """Its regime (as ``data.source.regime``)."""
    weight: float | None = None
    """Its share among the weighted parts (``1`` when neither this nor ``samples`` is
    set)."""
    samples: int | None = None
    """Records of this part in the mixture, instead of a weight."""
    label: str | None = None
    """How the log, the record ids and the summary name the part (``None``: the path's
    file name, or the source's name)."""

    def __post_init__(self) -> None:
        if self.weight is not None and self.samples is not None:
            raise ValueError("weight and samples are two ways to size a part: set one")
        weight = self.weight
        if weight is not None and not (
            isinstance(weight, int | float) and math.isfinite(weight) and weight > 0
        ):
            raise ValueError(f"weight must be a number > 0, got {weight!r}")
        if self.samples is not None and not (is_int(self.samples) and self.samples >= 1):
            raise ValueError(f"samples must be an integer >= 1, got {self.samples!r}")
        if self.label is None:
            named = Path(str(self.path).rstrip("/")).name if self.path else self.name
            object.__setattr__(self, "label", named)

    def source(self, base: DataSource) -> DataSource:
        """The part as a source: ``base`` (the run's ``data.source``) with this part's
        name, path, layout and regime."""
        return replace(
            base, name=self.name, path=self.path, format=self.format, mapping=self.mapping,
            regime=self.regime,
        )  # fmt: skip

    def settings(self) -> dict[str, Any]:
        """What decides the part's records (the path left out: moved data still resumes)."""
        return {
            "label": self.label, "name": self.name, "format": self.format,
            "regime": self.regime, "weight": self.weight, "samples": self.samples,
        }  # fmt: skip


def mixture_parts(
    entries: Sequence[Any] | None, base: DataSource, kinds: Sequence[SourceKind]
) -> tuple[tuple[MixturePart, ...], tuple[DataSource, ...]]:
    """The parts of ``data.mixture`` and each as a source (``base``, the run's
    ``data.source``, with the part's own fields), each checked with its key
    (``data.mixture[1].weight``): a source of ``kinds``, labels told apart.

    Raises:
        ValueError: A part that is not one, naming its key and the fix.
    """
    parts: list[MixturePart] = []
    sources: list[DataSource] = []
    for k, entry in enumerate(entries or ()):
        key = f"data.mixture[{k}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{key} must be a mapping ({{path: ..., weight: ...}}), got {entry!r}")
        values = dict(entry)
        known = {f.name for f in dataclass_fields(MixturePart)}
        if unknown := sorted(set(map(str, values)) - known):
            raise ValueError(f"{key} has no key {', '.join(unknown)} (keys: {', '.join(known)})")
        try:
            part = MixturePart(**values)
            source = part.source(base)
        except ValueError as error:
            message = str(error).replace("data.source.", f"{key}.")
            raise ValueError(message if message.startswith(key) else f"{key}: {message}") from None
        if source.entry.kind not in kinds:
            raise ValueError(
                f"{key}.name={part.name}: a {source.entry.kind.value} source does not mix "
                f"here (this data module mixes {', '.join(k.value for k in kinds)} sources)"
            )
        if any(p.label == part.label for p in parts):
            raise ValueError(
                f"{key}.label={part.label!r} names another part too: give each part its own label"
            )
        parts.append(part)
        sources.append(source)
    return tuple(parts), tuple(sources)


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


def check_streaming_settings(
    source: DataSource, sizes: DataSizes, batching: BatchingConfig, stream_dir: str | None
) -> None:
    """Raise ``ValueError`` naming the key and the fix for a setting a stream cannot serve
    (``data.streaming=true``; the data module checks its engine after these, and
    ``odb-check`` runs these before torch loads)."""
    if source.name != "jsonl":
        raise ValueError(
            f"data.streaming=true streams your own files (data=jsonl), got "
            f"data.source.name={source.name!r}: write the records to a file (JSON Lines, "
            "JSON, parquet), or set data.streaming=false"
        )
    val_samples, max_samples = sizes.val_samples, sizes.max_samples
    policy = batching.policy
    if not policy.online:
        raise ValueError(
            f"data.streaming=true: batching={batching.mode} plans each epoch from the lengths "
            "of the whole set, which a stream never holds; use batching=odb or odb_packed "
            "(or data.streaming=false for a planned mode)"
        )
    if policy.by_need:
        raise ValueError(
            "data.streaming=true reads each rank's own part of the stream, in order; "
            "batching.policy.shard_dealing=by_need deals one global order (random access): "
            "set batching.policy.shard_dealing=fixed"
        )
    if val_samples:
        raise ValueError(
            f"data.streaming=true: data.sizes.val_samples={val_samples} holds out a seeded choice "
            "of records, which needs random access; set data.sizes.val_samples=0 (validate on "
            "another file with data.streaming=false)"
        )
    if max_samples is not None:
        raise ValueError(
            f"data.streaming=true reads the whole file; data.sizes.max_samples={max_samples} "
            "must be null (cut the file instead)"
        )
    if stream_dir is None:
        raise ValueError("data.streaming=true needs data.caches.stream_dir (where chunks go)")
