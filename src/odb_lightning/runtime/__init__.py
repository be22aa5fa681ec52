"""The ODB runtime: worker and collate processes, the Gloo metadata channel, ``ODBLoader``.

Imports only :mod:`odb_lightning.core`, the sample contract, torch and the standard library.
"""

from odb_lightning.runtime.batch import (
    ODBBatch,
    StepMeta,
    idle_sample,
    idle_samples,
    pad_collate,
)
from odb_lightning.runtime.errors import (
    LoaderProcessError,
    MetadataChannelError,
    SampleFetchError,
    SampleTimeoutError,
)
from odb_lightning.runtime.loader import ODBLoader
from odb_lightning.runtime.rendezvous import Rendezvous
from odb_lightning.runtime.stats import EpochStats
from odb_lightning.sample import BadSampleError

__all__ = [
    "BadSampleError",
    "EpochStats",
    "LoaderProcessError",
    "MetadataChannelError",
    "ODBBatch",
    "ODBLoader",
    "Rendezvous",
    "SampleFetchError",
    "SampleTimeoutError",
    "StepMeta",
    "idle_sample",
    "idle_samples",
    "pad_collate",
]
