"""Serialization of samples between a worker and the collate process.

A whole grouping window of samples is in flight at once. Sent as tensors through a
``multiprocessing`` queue, each would hold a shared-memory file descriptor, and a deep
window runs out of descriptors; plain ``pickle`` of a tensor goes through ``torch.save``,
which is several times slower. So a sample is pickled into bytes with CPU tensors
carried as NumPy arrays; other values (and tensors NumPy cannot hold, e.g. bfloat16)
pickle normally. Costs: ``experiments/runtime/README.md``, "Sample transport".

The samples a pooled round moves to another rank cross the metadata channel compressed
(:func:`pack_moved`): a text sample's payload is two int64 tensors, about 16 bytes a token,
which zlib at its fastest level takes to about 2.2 (ShareGPT conversations,
``experiments/sync_efficiency/README.md``).
"""

from __future__ import annotations

import io
import pickle
import zlib
from typing import Any

import torch

_NUMPY_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
    }
)


class _SamplePickler(pickle.Pickler):
    def reducer_override(self, obj: object) -> Any:
        if (
            type(obj) is torch.Tensor
            and obj.device.type == "cpu"
            and obj.layout == torch.strided
            and not obj.requires_grad
            and not obj.is_conj()
            and not obj.is_neg()
            and obj.dtype in _NUMPY_DTYPES
        ):
            return torch.from_numpy, (obj.numpy(),)
        return NotImplemented


def dump_sample(sample: object) -> bytes:
    """Pickle ``sample`` (see the module docstring)."""
    buffer = io.BytesIO()
    _SamplePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(sample)
    return buffer.getvalue()


def load_sample(payload: bytes) -> Any:
    """Inverse of :func:`dump_sample`."""
    return pickle.loads(payload)


TEXT_WIRE_BYTES_PER_TOKEN = 2.2
"""Bytes a token of a text sample takes on the wire once moved (:func:`pack_moved` of
ShareGPT conversations' payloads, ``experiments/sync_efficiency/README.md``): what
``odb-plan --ranks`` estimates moved bytes at."""

MOVED_LEVEL = 1
"""zlib's level for moved samples: its fastest, which already takes token tensors to
about a seventh."""


class MovedBytesError(ValueError):
    """A rank received moved samples that do not decompress."""


def pack_moved(blob: bytes) -> bytes:
    """The wire form of the moved samples one rank sends another (zlib, lossless)."""
    return zlib.compress(blob, MOVED_LEVEL)


def unpack_moved(data: bytes) -> bytes:
    """Inverse of :func:`pack_moved`.

    Raises:
        MovedBytesError: ``data`` is not what :func:`pack_moved` writes.
    """
    try:
        return zlib.decompress(data)
    except zlib.error as error:
        raise MovedBytesError(
            f"moved samples of {len(data)} bytes do not decompress: {error}"
        ) from error
