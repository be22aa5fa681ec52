"""Every value ODB puts into the job's store is framed, and every value it reads back is
checked, so that a value it did not write is refused with an error naming the key.

torch's ``TCPStore`` has no authentication: any process that reaches ``MASTER_PORT`` may
write any key (``docs/reliability.md``, "The job store"). Unchecked, a foreign value under
the metadata channel's prefix reached Gloo's address parser, which died in C++
(``basic_string::_M_create``) or waited out its connect timeout. Now:

* A value is ``b"ODB"``, the schema version (one byte), the payload's length and CRC-32
  (4 bytes each, big-endian), then the payload. A read checks each part
  (:func:`unframe_value`).
* A write never replaces a value (``compare_set`` against "absent"): every ODB key is
  written once, so a value found there was written by someone else, and the writer says
  so, naming the key.
* :class:`FramedStore` does both for Gloo's own keys: the metadata channel's Gloo group is
  built on it, so the address records Gloo exchanges are framed and checked too. A Python
  exception cannot cross Gloo's C++ frames intact, so the store keeps the first problem
  (:attr:`FramedStore.problem`) for the channel to raise.
"""

from __future__ import annotations

import struct
import zlib
from datetime import timedelta

import torch.distributed as dist

from odb_lightning.runtime.errors import MetadataChannelError

MAGIC = b"ODB"
SCHEMA_VERSION = 1
"""Version of the framing and of the values ODB keeps in the store; bumped on any change."""
_HEADER = struct.Struct(">3sBII")  # magic, version, payload length, payload CRC-32
MAX_PAYLOAD_BYTES = 1 << 20
"""No ODB value is near this (Gloo's address records are ~200 bytes)."""
FOREIGN_VALUE_HINT = (
    "something other than this job's ranks wrote into the job's store (MASTER_PORT); "
    "see 'The job store' in docs/reliability.md"
)


def frame_value(payload: bytes) -> bytes:
    """``payload`` with the ODB header (module docstring)."""
    return _HEADER.pack(MAGIC, SCHEMA_VERSION, len(payload), zlib.crc32(payload)) + payload


def unframe_value(key: str, value: bytes) -> bytes:
    """The payload of a framed ``value`` read from ``key``.

    Raises:
        MetadataChannelError: ``value`` is not an ODB value of this schema version; the
            message names the key and what was expected.
    """
    expected = (
        f"expected an ODB value: the {_HEADER.size}-byte header {MAGIC!r} + schema version "
        f"{SCHEMA_VERSION} + payload length + CRC-32, then the payload"
    )
    if len(value) < _HEADER.size or value[:3] != MAGIC:
        problem = f"{len(value)} bytes starting {bytes(value[:12])!r}"
    else:
        _, version, length, crc = _HEADER.unpack_from(value)
        payload = bytes(value[_HEADER.size :])
        if version != SCHEMA_VERSION:
            problem = f"schema version {version} (the ranks run different odb_lightning versions?)"
        elif length > MAX_PAYLOAD_BYTES or length != len(payload):
            problem = f"a header announcing {length} payload bytes, followed by {len(payload)}"
        elif zlib.crc32(payload) != crc:
            problem = "a payload whose CRC-32 does not match its header"
        else:
            return payload
    raise MetadataChannelError(
        f"the job store's key {key!r} holds {problem}; {expected}: {FOREIGN_VALUE_HINT}"
    )


def set_once(store: dist.Store, key: str, payload: bytes, where: str) -> None:
    """Write ``payload`` (framed) under ``key``, which must be absent.

    Raises:
        MetadataChannelError: ``key`` already holds another value (named in the message).
    """
    framed = frame_value(payload)
    found = store.compare_set(key, "", framed)
    if bytes(found) != framed:
        raise MetadataChannelError(
            f"the job store's key {where!r} already holds {len(found)} bytes starting "
            f"{bytes(found[:12])!r}, which this rank did not write; every ODB key is written "
            f"once, by one rank: {FOREIGN_VALUE_HINT}"
        )


def get_checked(store: dist.Store, key: str, where: str) -> bytes:
    """The payload of the framed value under ``key`` (see :func:`unframe_value`)."""
    return unframe_value(where, store.get(key))


class FramedStore(dist.Store):
    """A store whose values are framed on write and checked on read (module docstring).

    Args:
        inner: The store to read and write (a ``PrefixStore`` of the job's store).
        prefix: ``inner``'s key prefix, to name full keys in errors.
    """

    def __init__(self, inner: dist.Store, prefix: str) -> None:
        super().__init__()
        self._inner, self._prefix = inner, prefix
        self.problem: MetadataChannelError | None = None

    def _keep(self, error: MetadataChannelError) -> MetadataChannelError:
        self.problem = self.problem or error
        return error

    def set(self, key: str, value: bytes) -> None:
        try:
            set_once(self._inner, key, bytes(value), f"{self._prefix}/{key}")
        except MetadataChannelError as error:
            raise self._keep(error) from None

    def get(self, key: str) -> bytes:
        try:
            return get_checked(self._inner, key, f"{self._prefix}/{key}")
        except MetadataChannelError as error:
            raise self._keep(error) from None

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self._inner.wait(keys)
        else:
            self._inner.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        return self._inner.check(keys)

    def set_timeout(self, timeout: timedelta) -> None:
        self._inner.set_timeout(timeout)

    @property
    def timeout(self) -> timedelta:
        return self._inner.timeout
