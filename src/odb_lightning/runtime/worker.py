"""Worker processes: fetch ``dataset[i]``, validate it, measure it, serialize it."""

from __future__ import annotations

import traceback
from multiprocessing.queues import Queue
from typing import Any, Protocol

from odb_lightning.core.config import BatchingConfig
from odb_lightning.core.loader_config import OnBadSample
from odb_lightning.runtime.lifecycle import prepare_child
from odb_lightning.runtime.messages import (
    FetchedSample,
    FetchRequest,
    FetchResult,
    SampleFailed,
    SampleSkipped,
    StopWorker,
)
from odb_lightning.runtime.transport import dump_sample
from odb_lightning.sample import (
    BadSampleError,
    SampleLimits,
    count_image_patches,
    count_image_tokens,
    count_patch_squares,
    is_truncated,
    normalize_sample,
)


class MapDataset(Protocol):
    """A map-style dataset: ``dataset[i]`` for ``i`` in ``range(len(dataset))``."""

    def __getitem__(self, index: int) -> Any: ...

    def __len__(self) -> int: ...


def _tokenized(dataset: MapDataset, request: FetchRequest) -> Any:
    tokenize = getattr(dataset, "tokenize_record", None)
    if not callable(tokenize):
        raise TypeError(
            f"a streamed record reached a {type(dataset).__name__}, which has no "
            "tokenize_record(record, index)"
        )
    return tokenize(request.record, request.dataset_index)


def record_label(dataset: MapDataset, index: int) -> str:
    """`` (record id 'abc')`` for a dataset that names its records (``record_id(i)``, as
    :class:`~odb_lightning.data.ChatDataset` does), so errors point into the user's file;
    empty otherwise, or when the record is too broken to have an id."""
    record_id = getattr(dataset, "record_id", None)
    if not callable(record_id):
        return ""
    try:
        return f" (record id {record_id(index)!r})"
    except (LookupError, TypeError, ValueError):  # not a mapping, or cannot be decoded
        return ""


def _label(dataset: MapDataset, request: FetchRequest) -> str:
    """:func:`record_label`, or the id a streamed record carries."""
    record = request.record
    if isinstance(record, dict) and "id" in record:
        return f" (record id {record['id']!r})"
    return record_label(dataset, request.dataset_index)


def _failure(request: FetchRequest, error: Exception) -> SampleFailed:
    bad = isinstance(error, BadSampleError)
    return SampleFailed(
        position=request.position,
        dataset_index=request.dataset_index,
        bad_sample=bad,
        message=str(error),
        traceback=traceback.format_exc(),
        field=error.field if bad else "",
        problem=error.problem if bad else "",
    )


def _reject(request: FetchRequest, error: Exception, on_bad_sample: OnBadSample) -> FetchResult:
    """A sample that cannot be used: skipped and counted, or reported as a failure."""
    if on_bad_sample is OnBadSample.SKIP:
        return SampleSkipped(request.position, request.dataset_index, reason=str(error))
    return _failure(request, error)


def fetch_sample(
    dataset: MapDataset,
    request: FetchRequest,
    on_bad_sample: OnBadSample,
    limits: SampleLimits | int | None,
) -> FetchResult:
    """Run ``dataset[i]`` and turn the outcome into a typed result (never raises).

    A record the data layer rejects (:class:`BadSampleError`) or a sample that fails
    :func:`~odb_lightning.sample.normalize_sample` is a bad sample; any other exception
    in ``dataset[i]`` is a fetch failure. Under ``on_bad_sample="skip"`` both are skipped
    and counted. Messages name the dataset index, the record id where the dataset has
    one, and the field. ``limits``: a bare ``int`` or ``None`` is ``max_seq_len`` alone.
    The sample is sent with its token ids widened to int64.
    """
    if not isinstance(limits, SampleLimits):
        limits = SampleLimits(max_seq_len=limits)
    index = request.dataset_index
    set_epoch = getattr(dataset, "set_epoch", None)
    if callable(set_epoch) and getattr(dataset, "epoch", None) != request.epoch:
        set_epoch(request.epoch)  # per-epoch augmentation, in this worker's copy
    try:
        sample = dataset[index] if request.record is None else _tokenized(dataset, request)
    except BadSampleError as error:
        located = BadSampleError(index, error.field, error.problem + _label(dataset, request))
        return _reject(request, located, on_bad_sample)
    except Exception as error:  # any user error is reported, with its traceback, by index
        where = f"dataset[{index}]{_label(dataset, request)}"
        wrapped = RuntimeError(f"{where} raised {type(error).__name__}: {error}")
        return _reject(request, wrapped, on_bad_sample)
    try:
        sample, (length, num_loss_tokens) = normalize_sample(sample, index, limits)
    except BadSampleError as error:
        located = BadSampleError(index, error.field, error.problem + _label(dataset, request))
        return _reject(request, located, on_bad_sample)
    try:
        payload = dump_sample(sample)
    except Exception as error:  # e.g. an unpicklable value in the sample
        where = f"sample {index}{_label(dataset, request)}"
        wrapped = RuntimeError(f"{where} could not be serialized: {error}")
        return _failure(request, wrapped)
    truncated = is_truncated(sample, length)
    return FetchedSample(
        request.position,
        index,
        length,
        num_loss_tokens,
        payload,
        truncated,
        num_patches=count_image_patches(sample),
        num_image_tokens=count_image_tokens(sample),
        patch_square_sum=count_patch_squares(sample),
    )


def worker_main(
    dataset: MapDataset,
    config: BatchingConfig,
    limits: SampleLimits | int | None,
    requests: Queue,
    results: Queue,
) -> None:
    """Entry point of a worker: serve requests until :class:`StopWorker`."""
    prepare_child()
    while True:
        request = requests.get()
        if isinstance(request, StopWorker):
            return
        results.put(fetch_sample(dataset, request, config.loader.on_bad_sample, limits))
