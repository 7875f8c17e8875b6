"""Exceptions raised by loaderx.

Every error loaderx raises on its own account is a :class:`ZrecordError` (a ``RuntimeError``);
the subclasses say what went wrong. Where a Python protocol expects a built-in type, the subclass
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
    "StoreChangedError",
    "StoreClosedError",
    "MissingDictionaryError",
    "ZrecordIndexError",
    "ZrecordValueError",
    "DatasetError",
    "LoaderClosedError",
]


class ZrecordError(RuntimeError):
    """Base class of every loaderx error: the store engine's, the datasets' and the loader's."""


class CorruptStoreError(ZrecordError):
    """A store file holds bytes that cannot be trusted: wrong magic or version, a wrong size,
    a table entry outside its chunk, a missing chunk file, a bad zstd frame."""


class LimitExceededError(ZrecordError):
    """A format limit would be exceeded (1 MiB per record, 2**24 records, 4096 chunks).
    Raised before anything is written."""


class StoreBusyError(ZrecordError):
    """The store cannot be used this way right now: ``delete``/``compact`` while other calls
    are in flight, or a write while another process or handle holds the writer lock."""


class StoreChangedError(ZrecordError):
    """Another handle or process deleted records from the store, or replaced it, since this
    handle last looked: its indices may now name other records. Call ``refresh()`` on the
    store (``Zrecord.refresh``, ``DenseDataset.store.refresh()``) to accept the new state, or
    open it again. (Compaction by others needs nothing: reads follow the moved records.)"""


class StoreClosedError(ZrecordError, ValueError):
    """The store handle was closed."""


class MissingDictionaryError(ZrecordError):
    """A ``zstd_dict`` record or append in a store without ``dict.zr``."""


class ZrecordIndexError(ZrecordError, IndexError):
    """A record index is negative, not an integer, or not below the store's length."""


class ZrecordValueError(ZrecordError, ValueError):
    """An argument is unusable: unknown codec, bad offsets, overlapping or overflowing
    destination ranges, a non-contiguous or read-only buffer."""


class DatasetError(ZrecordError, ValueError):
    """A directory is not a dataset of the kind asked for: no ``schema.msgpack``, a dense view
    of a ragged store (or the reverse), a schema with an unusable dtype or shape, or data that
    does not match the schema of the store it is being appended to."""


class LoaderClosedError(ZrecordError, ValueError):
    """The DataLoader was closed (explicitly, by its context manager, or after it delivered a
    worker's exception), or is being used in a process forked after its threads started."""
