"""Errors the runtime raises. Each names what failed: a dataset index and field, a child
process and its pid, or the metadata channel with its address, rank and round."""

from __future__ import annotations


class SampleFetchError(RuntimeError):
    """``dataset[i]`` raised; the message names the index and the original exception."""


class SampleTimeoutError(TimeoutError):
    """No requested sample arrived from the workers within ``timeout_s``."""


class LoaderProcessError(RuntimeError):
    """A worker or the collate process of this rank died or could not be reached."""


class MetadataChannelError(RuntimeError):
    """The Gloo metadata channel between ranks failed or timed out (a peer died or hangs)."""


class RemoteTraceback(Exception):
    """The formatted traceback of an error raised in a child process (set as ``__cause__``)."""

    def __str__(self) -> str:
        return "\n" + self.args[0] if self.args else ""
