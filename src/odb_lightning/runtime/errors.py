"""Errors the runtime raises. Each names what failed: a dataset index and field, a child
process and its pid, or the metadata channel with its address, rank and round."""

from __future__ import annotations


class BadSampleError(ValueError):
    """A sample the pipeline cannot batch: missing key, wrong dtype or rank, empty, too
    long, or a record its preprocessing rejects. The message names the dataset index and
    the field.

    Attributes:
        index: Dataset index (``None`` while not yet known, e.g. inside the template).
        field: The offending field, e.g. ``"input_ids"`` or ``"messages[1].role"``.
        problem: What is wrong, without the location.
    """

    def __init__(self, index: int | None, field: str, problem: str) -> None:
        where = "sample" if index is None else f"sample {index}"
        super().__init__(f"{where}: field '{field}' {problem}")
        self.index, self.field, self.problem = index, field, problem

    def __reduce__(self) -> tuple[type, tuple[int | None, str, str]]:
        return (type(self), (self.index, self.field, self.problem))

    def at_index(self, index: int) -> BadSampleError:
        """The same error, located at dataset index ``index``."""
        return BadSampleError(index, self.field, self.problem)


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
