"""Serialization of samples between a worker and the collate process.

A whole grouping window of samples is in flight at once. Sent as tensors through a
``multiprocessing`` queue, each would hold a shared-memory file descriptor, and a deep
window runs out of descriptors; plain ``pickle`` of a tensor goes through ``torch.save``,
which is several times slower. So a sample is pickled into bytes with CPU tensors
carried as NumPy arrays; other values (and tensors NumPy cannot hold, e.g. bfloat16)
pickle normally. Costs: ``experiments/runtime/README.md``, "Sample transport".
"""

from __future__ import annotations

import io
import pickle
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
