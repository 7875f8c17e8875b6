"""Exceptions raised by loaderx.

Every error loaderx raises on its own account is a :class:`LoaderxError` (a ``RuntimeError``;
``ZrecordError`` is the same class under the reference's name), raised by the store engine,
the sampler, the datasets, the converters and the loader alike; the subclasses say what went
wrong. Where a Python protocol expects a built-in type, the subclass is also one: an
out-of-range index is an ``IndexError``, a bad argument a ``ValueError``, an argument of the
wrong type a ``TypeError``, so ``except IndexError`` and friends keep working. Failures of the
operating system (missing permissions, a full disk) are raised as the built-in ``OSError``
subclass for their errno, with the file name set.

The native module maps each engine error to one of these classes in one place
(``crates/loaderx-py/src/errors.rs``); ``tests/test_errors.py`` pins every mapping.

    LoaderxError (RuntimeError)          alias ZrecordError
    ├── CorruptStoreError
    ├── StoreBusyError
    ├── StoreChangedError
    ├── MissingDictionaryError
    ├── InternalError
    ├── LoaderxIndexError (IndexError)   alias ZrecordIndexError
    ├── LoaderxTypeError (TypeError)
    └── LoaderxValueError (ValueError)   alias ZrecordValueError
        ├── LimitExceededError
        ├── DatasetError
        ├── StoreClosedError
        └── LoaderClosedError
"""

from __future__ import annotations

__all__ = [
    "LoaderxError",
    "ZrecordError",
    "CorruptStoreError",
    "StoreBusyError",
    "StoreChangedError",
    "MissingDictionaryError",
    "InternalError",
    "LoaderxIndexError",
    "ZrecordIndexError",
    "LoaderxTypeError",
    "LoaderxValueError",
    "ZrecordValueError",
    "LimitExceededError",
    "DatasetError",
    "StoreClosedError",
    "WorkerError",
    "RemoteTraceback",
    "LoaderClosedError",
]


class LoaderxError(RuntimeError):
    """Base class of every loaderx error: the store engine's, the sampler's, the datasets'
    and the loader's.

    ``code`` is the integer loaderx 0.9.11's ``ZrecordError`` carried for the same failure, so
    code that tests ``e.code`` keeps working: -1 out of memory, -2 file I/O, -3 index out of
    range, -4 a record over the size limit, -5 the store full, -6 a buffer too small (any
    unusable argument), -7 a record that fails to decode, -8 not a store, -9 dictionary
    training failed. Each class has its usual code; the engine sets the exact one. (Failures
    of the operating system are raised as ``OSError``, whose ``errno`` says more than -2.)"""

    code: int = -2


ZrecordError = LoaderxError


class CorruptStoreError(LoaderxError):
    """A store file holds bytes that cannot be trusted: wrong magic or version, a wrong size,
    a table entry outside its chunk, a missing chunk file, a bad zstd frame; or an archive
    that does not hold a store."""

    code = -7


class StoreBusyError(LoaderxError):
    """The store cannot be used this way right now: ``delete``/``compact`` while other calls
    are in flight, or a write while another process or handle holds the writer lock."""


class StoreChangedError(LoaderxError):
    """Another handle or process deleted records from the store, or replaced it, since this
    handle last looked: its indices may now name other records. Call ``refresh()`` on the
    store (``Zrecord.refresh``, ``DenseDataset.store.refresh()``) to accept the new state, or
    open it again. (Compaction by others needs nothing: reads follow the moved records.)"""


class MissingDictionaryError(LoaderxError):
    """A ``zstd_dict`` record or append in a store without ``dict.zr``."""

    code = -7


class InternalError(LoaderxError):
    """A failure inside loaderx or a library it relies on (zstd could not compress, rejected a
    dictionary it had just trained) that no argument explains. Please report it."""

    code = -1


class LoaderxIndexError(LoaderxError, IndexError):
    """A record index is negative, not an integer, or not below the store's length."""

    code = -3


ZrecordIndexError = LoaderxIndexError


class LoaderxTypeError(LoaderxError, TypeError):
    """An argument of the wrong type: a path where an open dataset is needed, a transform
    that is not callable, ``len()`` of an endless loader."""

    code = -6


class LoaderxValueError(LoaderxError, ValueError):
    """An argument is unusable: unknown codec or mode, bad offsets, overlapping or
    overflowing destination ranges, a non-contiguous or read-only buffer, a batch size the
    stream cannot give."""

    code = -6


ZrecordValueError = LoaderxValueError


class LimitExceededError(LoaderxValueError):
    """A format limit would be exceeded (1 MiB per record, 2**24 records, 4096 chunks).
    Raised before anything is written."""

    code = -4


class DatasetError(LoaderxValueError):
    """A directory is not a dataset of the kind asked for: no ``schema.msgpack``, a dense view
    of a ragged store (or the reverse), a schema with an unusable dtype or shape, or data that
    does not match the schema of the store it is being appended to."""

    code = -8


class StoreClosedError(LoaderxValueError):
    """The store handle was closed."""


class LoaderClosedError(LoaderxValueError):
    """The DataLoader was closed (explicitly, by its context manager, or after it delivered a
    worker's exception), or is being used in a process forked after its threads started."""


class AppendWarning(UserWarning):  # a warning, not an error: kept out of __all__'s error tree
    """A conversion appended to a dataset that already existed at its path although the call
    did not ask to append (``append=True``); ``overwrite=True`` replaces the dataset instead.
    Emitted once per path and process."""


class TokenArrayWarning(UserWarning):  # a warning, not an error, like AppendWarning
    """``from_numpy`` was given a long 1-D array of 16- or 32-bit integers, which it writes as
    one record per element: the usual shape of a token stream, which belongs in
    ``from_iterator`` (one record per document) and :func:`loaderx.pack`. Filter it
    (``warnings.filterwarnings("ignore", category=TokenArrayWarning)``) when the array really
    is one value per sample."""


class TruncationWarning(UserWarning):  # a warning, not an error, like AppendWarning
    """``pack(..., method="first_fit")`` cut documents longer than ``seq_len`` to their row;
    the message says how many and the share of the tokens the rows keep. Emitted once per
    view; ``truncate=True`` asks for the cut (no warning), ``truncate=False`` refuses it, and
    ``method="concat"`` keeps every token."""


class WorkerError(LoaderxError):
    """A DataLoader worker process died (killed, out of memory, ``os._exit``) or raised an
    exception that could not be sent to the consumer; the message names the worker, its pid
    and the step."""


class RemoteTraceback(LoaderxError):
    """The ``__cause__`` of an exception raised in a DataLoader worker process: its text is
    the worker's traceback."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text
