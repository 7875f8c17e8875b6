"""Exceptions raised by loaderx.

Every error from the store engine is a :class:`ZrecordError` (a ``RuntimeError``); the
subclasses say what went wrong. Where a Python protocol expects a built-in type, the subclass
is also one: an out-of-range index is an ``IndexError``, a bad argument a ``ValueError``.
Failures of the operating system (missing permissions, a full disk) are raised as the built-in
``OSError`` subclass for their errno, with the file name set.
"""

from __future__ import annotations

__all__ = [
    "ZrecordError",
    "CorruptStoreError",
    "LimitExceededError",
    "StoreBusyError",
    "StoreClosedError",
    "MissingDictionaryError",
    "ZrecordIndexError",
    "ZrecordValueError",
]


class ZrecordError(RuntimeError):
    """Base class of every store error."""


class CorruptStoreError(ZrecordError):
    """A store file holds bytes that cannot be trusted: wrong magic or version, a wrong size,
    a table entry outside its chunk, a missing chunk file, a bad zstd frame."""


class LimitExceededError(ZrecordError):
    """A format limit would be exceeded (1 MiB per record, 2**24 records, 4096 chunks).
    Raised before anything is written."""


class StoreBusyError(ZrecordError):
    """The store cannot be used this way right now: ``delete``/``compact`` while other calls
    are in flight, or a write while another process or handle holds the writer lock."""


class StoreClosedError(ZrecordError, ValueError):
    """The store handle was closed."""


class MissingDictionaryError(ZrecordError):
    """A ``zstd_dict`` record or append in a store without ``dict.zr``."""


class ZrecordIndexError(ZrecordError, IndexError):
    """A record index is negative, not an integer, or not below the store's length."""


class ZrecordValueError(ZrecordError, ValueError):
    """An argument is unusable: unknown codec, bad offsets, overlapping or overflowing
    destination ranges, a non-contiguous or read-only buffer."""
