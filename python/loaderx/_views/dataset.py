"""The implementation behind :mod:`loaderx.dataset`, the public module, whose documentation
says what this does and why."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, SupportsIndex, overload

import numpy as np
import numpy.typing as npt

from loaderx._store import schema as _schema
from loaderx._views.gather import (
    _BATCH_INDEX,
    _dense_gather,
    _dense_item,
    _indices,
    _one_index,
    _ragged_layout,
    _ragged_views,
    _shortest_batch,
)
from loaderx._views.subset import Subset
from loaderx.errors import (
    CorruptStoreError,
    DatasetError,
    LoaderxValueError,
    StoreChangedError,
)
from loaderx.zrecord import Zrecord

__all__ = ["DenseDataset", "RaggedDataset", "pad", "pinned_to"]


class _StoreView:
    """What both dataset kinds share: the schema, the store handle, lifecycle and pickling."""

    _kind = ""
    #: A column of a dataset directory: ``(rows, directory, generation)`` (the generation ""
    #: for a manifest of version 1). The dataset then has ``rows`` records whatever its store holds
    #: (records past them are an append not yet committed), and a copy unpickled in a worker
    #: process refuses a directory written again since. None: the store's own length.
    _pin: tuple[int, str, str] | None = None

    def __init__(self, path: str | os.PathLike[str], *, verify_reads: bool = False,
                 _pin: tuple[int, str, str] | None = None) -> None:
        # Absolute from the start: a pickled dataset reopened in a worker whose working
        # directory differs (spawn after os.chdir) must read this dataset, not a namesake.
        self._path = os.path.abspath(os.fspath(path))
        self._verify_reads = bool(verify_reads)
        schema = _schema.read(self._path)
        if schema.kind != self._kind:
            other = "DenseDataset" if schema.kind == "dense" else "RaggedDataset"
            raise DatasetError(f"{self._path} holds a {schema.kind} dataset; open it with "
                               f"{other}")
        self._schema = schema
        self._store = Zrecord(self._path, verify_reads=self._verify_reads)
        if _pin is not None:
            self._pin = _pin
            if len(self._store) < _pin[0]:
                held = len(self._store)
                self._store.close()
                raise CorruptStoreError(f"{self._path}: holds {held} records; its dataset "
                                        f"directory's manifest says {_pin[0]}")

    @property
    def path(self) -> str:
        """The dataset directory, absolute (resolved against the working directory at open)."""
        return self._path

    @property
    def verify_reads(self) -> bool:
        """Whether every read is checked against the store's checksums."""
        return self._verify_reads

    @property
    def dtype(self) -> np.dtype:
        """Element type of every record."""
        return self._schema.dtype

    @property
    def item_shape(self) -> tuple[int, ...]:
        """A dense record's shape, or a ragged record's trailing dimensions."""
        return self._schema.item_shape

    @property
    def schema(self) -> dict[str, Any]:
        """``schema.msgpack`` as a dict (including any extra keys written with the data)."""
        return self._schema.to_dict()

    @property
    def store(self) -> Zrecord:
        """The underlying byte-record store."""
        return self._store

    @property
    def closed(self) -> bool:
        return self._store.closed

    def __len__(self) -> int:
        return len(self._store) if self._pin is None else self._pin[0]

    def subset(self, indices: Any) -> Any:
        """The records ``indices`` as a :class:`~loaderx.subset.Subset` view (nothing is
        copied); see :func:`loaderx.subset.split` for train/validation splits."""
        return Subset(self, indices)

    def prefetch(self, idxs: Any) -> bool:
        """Starts reading records ``idxs`` (non-negative integers) into the page cache without
        waiting, for a later gather; see :meth:`loaderx.zrecord.Zrecord.prefetch`."""
        return self._store.prefetch(idxs)

    @property
    def recently_cold(self) -> bool:
        """Whether the last read found records that were not in memory."""
        return self._store._native.recently_cold  # the loader asks every step: no wrapper hop

    def close(self) -> None:
        """Closes the store handle; closing twice is harmless."""
        self._store.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # The records this handle names travel with it: its length and its store's identity
        # (a worker process that opens the path again refuses other records at these indices).
        pin = self._pin if self._pin is not None else (len(self), "", "")
        return (_reopen, (type(self), self._path, self._verify_reads, pin,
                          self._store._native.view_token()))

    def _pinned(self, rows: int) -> None:
        """Shows only the first ``rows`` records from now on (see :func:`pinned_to`)."""
        root, generation = self._pin[1:] if self._pin is not None else ("", "")
        self._pin = (rows, root, generation)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"records={len(self)}"
        return (f"{type(self).__name__}({self._path!r}, {state}, dtype={self.dtype.str}, "
                f"item_shape={self.item_shape})")


def _reopen(cls: type, path: str, verify_reads: bool,
            pin: tuple[int, str, str] | None = None,
            token: tuple[int, int, int] | None = None) -> Any:
    if pin is not None and pin[1]:
        rows, root, generation = pin
        now, held = _directory_state(root)
        # (A directory opened at version 1 has no generation; its first append in place gives
        # it one. A directory written again has new stores: the view token below tells.)
        if (generation and now != generation) or held < rows:
            raise StoreChangedError(
                f"{root} was written again or shrunk (generation {now!r}, {held} rows; this "
                f"dataset was opened at {generation!r}, {rows} rows): its records may no "
                "longer be the ones this dataset was given. Open it again (open_dataset)")
    try:
        ds = cls(path, verify_reads=verify_reads, _pin=pin)
    except CorruptStoreError:
        if pin is None or pin[1]:
            raise
        raise StoreChangedError(f"{path} now holds fewer records than the {pin[0]} this "
                                "dataset was given: records were deleted since. Open it again "
                                "and build the loader anew") from None
    if token is not None:
        now = ds._store._native.view_token()
        if now != tuple(token):
            ds.close()
            why = ("another store was put at its path" if now[:2] != tuple(token[:2]) else
                   "records were deleted from it (its indices now name other records)")
            raise StoreChangedError(f"{path}: {why} since this dataset was opened; a worker "
                                    "does not read other records at the loader's indices. "
                                    "Open it again and build the loader anew")
    return ds


def _no_directories(root: str) -> tuple[str, int]:
    raise StoreChangedError(f"{root}: dataset directories cannot be read here (loaderx.intake "
                            "is not imported)")


#: A dataset directory's generation and row count now, read from its manifest. Manifests are
#: read a floor above this one: :mod:`loaderx.intake.directory`, which imports this module,
#: registers its reader when it is imported (``import loaderx`` imports it).
_directory_state: Callable[[str], tuple[str, int]] = _no_directories


def register_directory_state(read: Callable[[str], tuple[str, int]]) -> None:
    """Sets how a dataset directory's generation and row count are read (see above)."""
    global _directory_state
    _directory_state = read


def pinned_to(ds: Any, rows: int, what: str) -> Any:
    """``ds`` showing exactly the ``rows`` records a view (a concatenation, a mixture, a packed
    view) was built on, for the view rebuilt in a worker process: a store's dataset with more
    now (appended since) is pinned to them; fewer, or a view of another length, is refused
    (StoreChangedError) -- the view's rows would not be the loader's."""
    n = len(ds)
    if n == rows:
        return ds
    pin = getattr(ds, "_pinned", None)
    if n > rows and pin is not None:
        pin(rows)
        return ds
    raise StoreChangedError(f"{what} holds {n} records now; the view was built on {rows}: its "
                            "rows would not be the loader's. Build the view and the loader anew")


class DenseDataset(_StoreView):
    """Fixed-shape records of a dense store, read into NumPy arrays.

    ``ds[i]`` is one record (like ``array[i]``: an ``item_shape`` array, or a NumPy scalar for
    a store of scalars); ``ds[idx]`` with a list, an integer array, a slice or a boolean mask
    is a new ``(n, *item_shape)`` array gathered in one native call. Negative indices count
    from the end; an out-of-range or non-integer index raises ``IndexError``.

    ``verify_reads=True`` checks every record read against the store's checksums (a store
    written with ``checksums=True``), raising ``CorruptStoreError`` on a mismatch.
    """

    _kind = "dense"

    def __init__(self, path: str | os.PathLike[str], *, verify_reads: bool = False,
                 _pin: tuple[int, str, str] | None = None) -> None:
        super().__init__(path, verify_reads=verify_reads, _pin=_pin)
        self._row_bytes = self._schema.item_bytes
        self._native_gather_fixed = self._store._native.gather_fixed

    @property
    def record_bytes(self) -> int:
        """Bytes of one record."""
        return self._row_bytes

    # -- the dense-source protocol (loaderx.source) --------------------------------------------

    kind = "dense"
    view_digest = ""  # a whole dataset

    def _native_source(self) -> Any:
        """The native store a mixture reads this dataset's records from in one call with its
        other sources' (``_native.MixedBatch``): record ``i`` of the store is row ``i``."""
        return self._store._native

    def gather_rows(self, idxs: npt.NDArray[np.uint64], dst: npt.NDArray[np.uint8],
                    shards: int | None = None,
                    rows: npt.NDArray[np.uint64] | None = None) -> None:
        """Writes record ``idxs[i]`` into row ``i`` (or ``rows[i]``) of the uint8 buffer
        ``dst`` of ``record_bytes``-byte rows, in at most ``shards`` parallel blocks; see
        :mod:`loaderx.source`. The engine checks every index and record size first."""
        self._native_gather_fixed(idxs, dst, self._row_bytes, shards, rows)

    @overload
    def __getitem__(self, idx: SupportsIndex | tuple[Any, ...]) -> Any: ...
    @overload
    def __getitem__(self, idx: slice | Sequence[int] | npt.NDArray[Any]) -> npt.NDArray[Any]: ...

    def __getitem__(self, idx: Any) -> Any:
        """``ds[i]``: one record (a NumPy scalar when records are scalars); a slice, a list,
        an integer array or a boolean mask: an array of records; a tuple indexes further into
        the records, as NumPy does."""
        if type(idx) is np.ndarray and idx.ndim == 1 and idx.dtype in _BATCH_INDEX:
            out = self._batch(idx)
            if out is not None:
                return out
        return _dense_item(self, idx)

    def _batch(self, idx: np.ndarray) -> np.ndarray | None:
        """The common case of a batch -- a 1-D int64 or uint64 array -- on the shortest path:
        the engine checks the indices itself, before it writes anything. None when it refuses
        them (a negative index, which counts from the end, or one out of range): the general
        path then handles or reports them."""
        if self._pin is not None and len(idx) and int(idx.max()) >= self._pin[0]:
            return None  # past the commit point: the general path reports it
        return _shortest_batch(self, self._native_gather_fixed, idx, self._row_bytes)

    def __getitems__(self, idxs: Sequence[int]) -> np.ndarray:
        """Batch fetch, as torch's DataLoader calls it: the records as one array."""
        return self.gather(_indices(idxs, len(self)).reshape(-1))

    def gather(self, idxs: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Records ``idxs`` (non-negative integers) as a ``(len(idxs), *item_shape)`` array,
        written into ``out`` when given (a C-contiguous, writable array of exactly that shape
        and the dataset's dtype), so a loop can reuse one buffer."""
        return _dense_gather(self, idxs, out)


class RaggedDataset(_StoreView):
    """Variable-length records of a ragged store, read into lists of NumPy arrays.

    ``ds[i]`` is one record, an array of shape ``(length_i, *item_shape)``; ``ds[idx]`` with a
    list, an integer array, a slice or a boolean mask is a list of such arrays, all views into
    one buffer filled by a single native gather.
    """

    _kind = "ragged"

    # -- the ragged-source protocol (loaderx.source) -------------------------------------------

    kind = "ragged"
    view_digest = ""  # a whole dataset

    def record_nbytes(self, idxs: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        """The byte length of each record ``idxs[i]`` (uint64), from the record table alone;
        ``CorruptStoreError`` for a record that is not a whole number of rows. See
        :mod:`loaderx.source`."""
        nbytes = self._store.lengths(idxs)
        self._rows(nbytes, idxs)
        return nbytes.astype(np.uint64)

    def gather_at(self, idxs: npt.NDArray[np.uint64], dst: npt.NDArray[np.uint8],
                  offsets: npt.NDArray[np.uint64]) -> None:
        """Writes record ``idxs[i]`` into ``dst`` at byte ``offsets[i]``, in one native call
        (split across the store's thread pool). See :mod:`loaderx.source`."""
        self._store.gather(idxs, dst, offsets)

    @overload
    def __getitem__(self, idx: int | np.integer[Any]) -> npt.NDArray[Any]: ...
    @overload
    def __getitem__(
        self, idx: slice | Sequence[int] | npt.NDArray[Any]) -> list[npt.NDArray[Any]]: ...

    def __getitem__(self, idx: Any) -> Any:
        one = _one_index(idx, len(self))
        if one is not None:
            return self._read(np.array([one], dtype=np.uint64))[0]
        return self._read(_indices(idx, len(self)).reshape(-1))

    def __getitems__(self, idxs: Sequence[int]) -> list[np.ndarray]:
        return self._read(_indices(idxs, len(self)).reshape(-1))

    def lengths(self, idxs: Any) -> np.ndarray:
        """The number of rows (first-axis length) of each record, as int64."""
        flat = _indices(idxs, len(self)).reshape(-1)
        return self._rows(self._store.lengths(flat), flat)

    def _rows(self, nbytes: np.ndarray, idxs: np.ndarray) -> np.ndarray:
        return _whole_rows(nbytes, self._schema.item_bytes,
                           lambda k: (int(idxs[k]), self._path))

    def _read(self, idxs: np.ndarray) -> list[np.ndarray]:
        nbytes = self._store.lengths(idxs)
        self._rows(nbytes, idxs)
        offsets, total = _ragged_layout(nbytes)
        buf = np.empty(total, dtype=np.uint8)
        if len(idxs):
            self._store.gather(idxs, buf, offsets)
        return _ragged_views(buf, offsets, nbytes, self.dtype, self.item_shape)


def _whole_rows(nbytes: np.ndarray, unit: int,
                where: Callable[[int], tuple[int, str]]) -> np.ndarray:
    """The rows (int64) of records of ``nbytes`` bytes, rows of ``unit`` bytes; a record that is
    not whole rows is a :class:`CorruptStoreError` naming it (``where(k)``: the batch's record
    ``k`` as its index in its store and the store's path)."""
    if unit == 0:
        return np.zeros(len(nbytes), dtype=np.int64)
    rows, rem = np.divmod(nbytes.astype(np.int64), unit)
    if rem.any():
        k = int(np.flatnonzero(rem)[0])
        index, path = where(k)
        raise CorruptStoreError(f"record {index} of {path} holds {nbytes[k]} bytes, not a whole "
                                f"number of {unit}-byte rows")
    return rows


def pad(records: Sequence[Any], max_len: int | None = None,
        pad_value: Any = 0) -> tuple[np.ndarray, np.ndarray]:
    """Stacks variable-length records into one ``(len(records), max_len, *trailing)`` array,
    filling the tail of each row with ``pad_value``; returns it with the records' lengths.

    ``max_len`` defaults to the longest record and must not be shorter than it: ``pad`` never
    truncates. All records need the same trailing dimensions; the result has their common dtype.
    """
    arrays = [np.asarray(r) for r in records]
    if not arrays:
        raise LoaderxValueError("pad() needs at least one record to know the dtype and shape")
    for i, a in enumerate(arrays):
        if a.ndim == 0:
            raise LoaderxValueError(
                f"record {i} is a scalar; pad() stacks records along their first axis")
        if a.shape[1:] != arrays[0].shape[1:]:
            raise LoaderxValueError(f"record {i} has trailing shape {a.shape[1:]}, record 0 has "
                                    f"{arrays[0].shape[1:]}")
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    longest = int(lengths.max())
    if max_len is None:
        max_len = longest
    elif isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < 0:
        raise LoaderxValueError(f"max_len must be a non-negative int, got {max_len!r}")
    elif max_len < longest:
        k = int(lengths.argmax())
        raise LoaderxValueError(f"record {k} has {longest} rows, more than max_len={max_len}; "
                                "pad() does not truncate (slice the records first)")
    dtype = np.result_type(*{a.dtype for a in arrays})
    out = np.full((len(arrays), int(max_len), *arrays[0].shape[1:]), pad_value, dtype=dtype)
    for i, a in enumerate(arrays):
        out[i, : len(a)] = a
    return out, lengths
