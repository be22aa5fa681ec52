"""The ODB runtime: worker and collate processes, the Gloo metadata channel, ``ODBLoader``.

Imports only :mod:`odb_lightning.core`, torch and the standard library.
"""

from odb_lightning.runtime.batch import ODBBatch, StepMeta, idle_sample, pad_collate
from odb_lightning.runtime.errors import (
    BadSampleError,
    LoaderProcessError,
    MetadataChannelError,
    SampleFetchError,
    SampleTimeoutError,
)
from odb_lightning.runtime.loader import ODBLoader
from odb_lightning.runtime.options import LoaderOptions, OnBadSample, StartMethod
from odb_lightning.runtime.rendezvous import Rendezvous
from odb_lightning.runtime.stats import EpochStats

__all__ = [
    "BadSampleError",
    "EpochStats",
    "LoaderOptions",
    "LoaderProcessError",
    "MetadataChannelError",
    "ODBBatch",
    "ODBLoader",
    "OnBadSample",
    "Rendezvous",
    "SampleFetchError",
    "SampleTimeoutError",
    "StartMethod",
    "StepMeta",
    "idle_sample",
    "pad_collate",
]
