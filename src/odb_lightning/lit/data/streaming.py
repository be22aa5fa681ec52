"""The settings a streamed data module (``data.streaming=true``) refuses, each with the
reason and the fix: a stream is read in order, each rank its own part, and never whole."""

from __future__ import annotations

import logging

from lightning.fabric.utilities.rank_zero import rank_zero_only

from odb_lightning.core.config import BatchingConfig
from odb_lightning.data.config import (
    DataCaches,
    DataSizes,
    DataSource,
    check_streaming_settings,
)
from odb_lightning.data.formats import layout_read
from odb_lightning.data.stream import ChatStream, StreamedChatDataset, require_litdata
from odb_lightning.data.stream_convert import convert_jsonl_stream
from odb_lightning.data.tokenizer import ChatTokenizer
from odb_lightning.lit.data.train_records import no_records_error

log = logging.getLogger(__name__)


def check_streaming(
    source: DataSource, sizes: DataSizes, batching: BatchingConfig, stream_dir: str | None
) -> None:
    """Raise ``ValueError`` naming the key and the fix for a setting a stream cannot serve
    (:func:`~odb_lightning.data.config.check_streaming_settings`), or for a missing engine."""
    check_streaming_settings(source, sizes, batching, stream_dir)
    require_litdata()  # the engine: missing, the error says how to install it


def open_stream(
    source: DataSource,
    sizes: DataSizes,
    caches: DataCaches,
    tokenizer: ChatTokenizer,
    on_bad_record: str,
) -> tuple[ChatStream, StreamedChatDataset]:
    """The stream of ``source``'s files (written once as chunks under
    ``caches.stream_dir``, in the layout of ``data.source.format`` or ``mapping``) and its
    tokenizing dataset; says the layout it read (rank 0), refuses files of no record."""
    written = convert_jsonl_stream(
        source.path, caches.stream_dir, on_bad_record,
        layout=source.format, mapping=source.mapping,
    )  # fmt: skip
    stream = ChatStream(written)
    if stream.layout is not None and rank_zero_only.rank == 0:
        layout = layout_read(stream.layout, source.mapping)
        log.info("read %s as %s, %d records", source.path, layout, stream.num_records)
    if stream.num_records == 0:
        raise no_records_error(source, dict(stream.counts), on_bad_record)
    dataset = StreamedChatDataset(
        stream.num_records,
        tokenizer,
        sizes.max_seq_len,
        system_prompt=source.system_prompt,
        augmentation=source.augmentation,
        template=source.template,
        truncation=sizes.truncation,
        think_block=source.think_block,
        supervise=source.supervise,
    )
    return stream, dataset
