"""The sample contract the data layer produces: a dict with a 1-D integer ``input_ids``
tensor and, optionally, a ``labels`` tensor of the same shape (``-100`` = no loss).

The check every sample passes (:func:`inspect_sample`) and the error that names a bad
sample's index and field (:class:`BadSampleError`) live in the runtime, which runs the
check in its workers; the data layer raises the same error for records it rejects.
"""

from __future__ import annotations

import torch

from odb_lightning.runtime.errors import BadSampleError
from odb_lightning.runtime.samples import IGNORE_INDEX, SampleStats, inspect_sample

Sample = dict[str, torch.Tensor]
"""``{"input_ids": LongTensor[L], "labels": LongTensor[L]}``, what the datasets here return."""

__all__ = ["IGNORE_INDEX", "BadSampleError", "Sample", "SampleStats", "inspect_sample"]
