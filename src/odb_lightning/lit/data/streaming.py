"""The settings a streamed data module (``data.streaming=true``) refuses, each with the
reason and the fix: a stream is read in order, each rank its own part, and never whole."""

from __future__ import annotations

import logging

from lightning.fabric.utilities.rank_zero import rank_zero_only

from odb_lightning.core.config import BatchingConfig
from odb_lightning.data.config import DataCaches, DataSizes, DataSource
from odb_lightning.data.formats import layout_read
from odb_lightning.data.stream import (
    ChatStream,
    StreamedChatDataset,
    convert_jsonl_stream,
    require_litdata,
)
from odb_lightning.data.tokenizer import ChatTokenizer
from odb_lightning.lit.data.train_records import no_records_error

log = logging.getLogger(__name__)


def check_streaming(
    source: DataSource, sizes: DataSizes, batching: BatchingConfig, stream_dir: str | None
) -> None:
    """Raise ``ValueError`` naming the key and the fix for a setting a stream cannot serve."""
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
