"""Converters: NumPy arrays and iterables of arrays into loaderx datasets.

:func:`from_numpy` writes a *dense* dataset -- one record per slice along axis 0, every record
the same shape -- and :func:`from_iterator` a *ragged* one, whose records may differ in length
along their first axis. Both write a Zrecord store plus ``schema.msgpack`` (see
:mod:`loaderx.dataset` to read them back).

>>> import numpy as np, tempfile, os
>>> from loaderx.converter import from_numpy
>>> from loaderx.dataset import DenseDataset
>>> path = os.path.join(tempfile.mkdtemp(), "points")
>>> from_numpy(path, np.arange(12, dtype=np.float32).reshape(4, 3))
4
>>> from_numpy(path, np.ones((2, 3), dtype=np.float32), append=True)   # same path: appends
6
>>> DenseDataset(path)[[5, 0]]
array([[1., 1., 1.],
       [0., 1., 2.]], dtype=float32)

Converting streams in chunks of about ``chunk_bytes``: a ``np.load(..., mmap_mode="r")`` array is
read piece by piece and never held in memory whole. When a converter returns, what it wrote is
durable; when it raises (bad data, a full disk, Ctrl-C), the records it had appended are removed
again, so the store is left as it was. A new dataset (also one replacing another with
``overwrite=True``) is built in a private directory beside ``path`` and put in place by one
atomic step (see :mod:`loaderx.staging`), so a kill or a power cut leaves ``path`` holding the
old dataset or the new one, never a half-made one; the next conversion removes what it left.

Appending to a dataset that exists is what loaderx 0.9.11 does when the same path is converted
again; since re-running a script then doubles the data silently, a call that did not say
``append=True`` warns once (:class:`~loaderx.errors.AppendWarning`), and ``append=False``
refuses.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Any, Literal

import numpy as np

from loaderx._appends_behind import AppendsBehind
from loaderx._store import schema as _schema
from loaderx._store import staging
from loaderx._store.sparse import copy_files
from loaderx.errors import (
    AppendWarning,
    DatasetError,
    LimitExceededError,
    LoaderxTypeError,
    LoaderxValueError,
    TokenArrayWarning,
)
from loaderx.zrecord import (
    CODECS,
    FORMAT,
    MAX_RECORD_BYTES,
    MAX_RECORD_LEN,
    MAX_RECORDS,
    SCHEMA,
    Codec,
    Zrecord,
)
from loaderx.zrecord import _codec as _store_codec

__all__ = ["from_numpy", "from_iterator", "DEFAULT_CHUNK_BYTES", "AUTO_RAW_BELOW", "CODECS",
           "FORMAT", "SCHEMA", "MAX_RECORD_LEN", "Zrecord", "DICT_MIN", "DICT_MAX",
           "DICT_MAX_SAMPLES", "WRITE_CHUNK_BYTES"]

#: Default size of one append while converting.
DEFAULT_CHUNK_BYTES = 64 << 20
#: loaderx 0.9.11's names, for code written against it, with its values: the size of one
#: append (this module's ``DEFAULT_CHUNK_BYTES``), and its dictionary bounds -- the smallest and
#: largest dictionary and the most samples it trained on. This converter sizes a dictionary by
#: its data (at most ``dict_size``, 112,640 bytes by default) and samples up to 16 MiB.
WRITE_CHUNK_BYTES = DEFAULT_CHUNK_BYTES
DICT_MIN = 8192
DICT_MAX = 1 << 20
DICT_MAX_SAMPLES = 8192
#: zstd's own default dictionary size, the most an automatically sized dictionary gets.
_MAX_AUTO_DICT = 112_640
#: Most sample bytes a dictionary is trained on.
_DICT_SAMPLE_BYTES = 16 << 20


#: ``codec="auto"`` stores records smaller than this raw: per record, zstd costs 4-15 us to
#: decode (zstd's own speed on blocks this small: ``python scripts/bench_fixed.py``), 25-50
#: times a raw copy, so below it only a device slower than ~180 MB/s gains from the smaller
#: reads; from this size on it stores them with zstd.
AUTO_RAW_BELOW = 4096


def from_numpy(
    path: str | os.PathLike[str],
    array: Any,
    codec: Codec | Literal["auto"] = "auto",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    dict_size: int | None = None,
    schema: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    *,
    append: bool | None = None,
    progress: bool | None = None,
    checksums: bool = False,
) -> int:
    """Writes ``array`` as a dense dataset at ``path``, one record per slice along axis 0, and
    returns the dataset's length.

    ``array`` is any array-like with at least one dimension; a 1-D array becomes a dataset of
    scalars. ``codec`` is ``"raw"``, ``"zstd"`` (level 3) or ``"zstd_dict"`` (level 19 against
    a dictionary trained on a sample of ``array`` before the first record is written; its size
    adapts to the data, capped by ``dict_size``), or ``"auto"`` (the default): raw for records
    under :data:`AUTO_RAW_BELOW` bytes (4 KiB), whose zstd decoding costs far more per record
    than the bytes it saves (zstd on 52- and 208-byte rows made a conversion 37x slower and
    reads 5-6x slower for 27% less space), zstd from that size on. loaderx 0.9.11's default was
    ``"zstd"``: pass it to compress small records anyway. ``schema`` adds extra keys to
    ``schema.msgpack``; reserved keys (``kind``, ``dtype``, ``item_shape``, ...) must agree with
    the data. If ``path`` already holds a dense dataset of the same dtype and item shape, the
    records are appended to it (the codec may differ; the schema keeps its extra keys, and
    those given update them); ``overwrite=True`` replaces it instead. ``append=True`` says
    the append is meant; ``append=None`` (the default) appends too, as loaderx 0.9.11 does,
    but warns once per path (:class:`~loaderx.errors.AppendWarning`); ``append=False`` refuses
    to touch an existing dataset (DatasetError).
    ``progress`` shows a progress bar on stderr (tqdm's when installed, else a one-line display;
    default: when stderr is a terminal).
    ``checksums=True`` makes the store keep a checksum of every record (see
    :meth:`loaderx.zrecord.Zrecord.enable_checksums`); once on, it stays on for later appends.
    """
    arr = array if isinstance(array, np.ndarray) else np.asarray(array)
    if arr.ndim == 0:
        raise DatasetError("from_numpy needs an array with at least one dimension (records "
                           "are its slices along axis 0)")
    dtype = _schema.check_dtype(arr.dtype, "from_numpy")
    if arr.ndim == 1 and dtype.kind in "iu":
        _check_token_array(path, arr)
    if codec == "auto":
        record = dtype.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))
        codec = "raw" if record < AUTO_RAW_BELOW else "zstd"
    wanted = _schema.Schema("dense", dtype, tuple(int(d) for d in arr.shape[1:]),
                            _codec(codec), _extra(schema, "dense", dtype, arr.shape[1:]))
    wanted.to_bytes()  # an unencodable or oversized schema= fails before any store is touched
    row_bytes = wanted.item_bytes
    if row_bytes > MAX_RECORD_BYTES:
        raise LimitExceededError(f"one record of shape {arr.shape[1:]} and dtype {dtype} is "
                                 f"{row_bytes} bytes, over the {MAX_RECORD_BYTES}-byte limit")
    n = int(arr.shape[0])
    existing = _existing_schema(path, overwrite, append)
    with _Conversion(path, wanted, existing, overwrite, append, n, checksums) as conv:
        rows = max(1, _positive(chunk_bytes, "chunk_bytes") // max(row_bytes, 1))
        offsets = np.arange(rows, dtype=np.uint64) * np.uint64(row_bytes)
        with _progress(progress, n, str(path)) as bar:
            if wanted.codec == "zstd_dict" and n:
                with _phase(bar, "training the zstd dictionary"):
                    conv.ensure_dict(_dense_sample(arr, row_bytes), dict_size)
            for start in range(0, n, rows):
                block = np.ascontiguousarray(arr[start:start + rows])
                conv.append(block, offsets[: len(block)])
                bar.update(len(block))
        return conv.finish()


#: From this many elements on, a 1-D uint16/uint32 array passed to from_numpy is warned about as
#: a likely token stream (TokenArrayWarning).
_TOKEN_WARNING_ELEMENTS = 1 << 22


def _check_token_array(path: Any, arr: np.ndarray) -> None:
    """A 1-D integer array is one record per element. Past the record limit that is refused,
    naming what a token stream should be written with; a long one of a token dtype (16 or 32
    bits unsigned: labels are usually NumPy's default int64) is warned about."""
    n = int(arr.shape[0])
    hint = ("; a token stream belongs in from_iterator(path, documents, codec='raw') -- one "
            "record per document, max_record_bytes= for long ones -- read with loaderx.pack(), "
            "or in fixed rows: from_numpy(path, tokens[:n // L * L].reshape(-1, L))")
    if n > MAX_RECORDS:
        raise LimitExceededError(f"from_numpy writes one record per element of a 1-D array: "
                                 f"{n} records, over the limit of {MAX_RECORDS}{hint}")
    if n >= _TOKEN_WARNING_ELEMENTS and arr.dtype in (np.uint16, np.uint32):
        warnings.warn(f"{os.fspath(path)}: from_numpy writes one record per element of a 1-D "
                      f"array ({n} records of {arr.dtype.itemsize} bytes, slow to write and "
                      f"several times the bytes on disk){hint}. If these are per-sample values "
                      "(labels), filter loaderx.errors.TokenArrayWarning", TokenArrayWarning,
                      stacklevel=3)


def from_iterator(
    path: str | os.PathLike[str],
    source: Iterable[Any],
    codec: Codec = "zstd",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    dict_size: int | None = None,
    schema: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    *,
    append: bool | None = None,
    progress: bool | None = None,
    checksums: bool = False,
    max_record_bytes: int | None = None,
) -> int:
    """Writes every item of ``source`` as one record of a ragged dataset at ``path`` and returns
    the dataset's length.

    Items are arrays with at least one dimension (records may differ along their first axis;
    the dtype and the trailing dimensions must be the same throughout) or bytes-like objects,
    stored as ``uint8`` records. Items are packed into appends of about ``chunk_bytes``. With
    ``codec="zstd_dict"`` the dictionary is trained on the first chunk before anything is
    written. ``schema``, ``overwrite``, ``append``, ``progress`` and ``checksums`` are as in
    :func:`from_numpy`; an existing ragged dataset at ``path`` is appended to.

    ``max_record_bytes=N`` writes each item as pieces of at most ``N`` bytes -- the layout
    :func:`loaderx.pack` reads best (a row decodes a piece, not a whole long document, and
    documents may exceed the 1 MiB record limit): records of exactly ``N // row_bytes`` rows
    are continued by the next record, an item ends at its first shorter record (an empty one
    when its length is a multiple), and the schema keeps that size as ``piece_rows``, so
    appends continue the layout (given again, ``N`` must agree). The returned length and
    ``len()`` of the dataset count pieces.
    """
    codec = _codec(codec)
    limit = _positive(chunk_bytes, "chunk_bytes")
    existing = _existing_schema(path, overwrite, append)
    items = iter(source)
    first = next(items, None)
    if first is None:
        if existing is None:
            raise DatasetError("from_iterator got no records and there is no dataset at "
                               f"{os.fspath(path)!r} to take the dtype from")
        _check_kind(existing, "ragged", path)
        return _length_of(path)
    rec = _ragged_record(first, 0)
    dtype = existing.dtype if existing is not None else rec.dtype
    trail = existing.item_shape if existing is not None else rec.shape[1:]
    extra = _extra(schema, "ragged", dtype, trail)
    piece = _piece_rows(path, existing, extra, max_record_bytes,
                        math.prod(trail) * dtype.itemsize)
    if piece:
        extra[_PIECE_ROWS] = piece
    wanted = _schema.Schema("ragged", dtype, tuple(trail), codec, extra)
    wanted.to_bytes()  # an unencodable or oversized schema= fails before any store is touched
    _check_record(rec, wanted, 0, piece)
    total = len(source) if isinstance(source, Sized) else None
    with _Conversion(path, wanted, existing, overwrite, append, None, checksums) as conv:
        with _progress(progress, total, str(path)) as bar:
            pending: list[np.ndarray] = _pieces(rec, piece)
            size = rec.nbytes
            count = 1
            trained = codec != "zstd_dict"
            for item in items:
                if size >= limit:
                    if not trained:
                        with _phase(bar, "training the zstd dictionary"):
                            conv.ensure_dict(pending, dict_size)
                        trained = True
                    conv.append_records(pending)
                    bar.update(len(pending))
                    pending, size = [], 0
                rec = _ragged_record(item, count)
                _check_record(rec, wanted, count, piece)
                pending.extend(_pieces(rec, piece))
                size += rec.nbytes
                count += 1
            if not trained:
                with _phase(bar, "training the zstd dictionary"):
                    conv.ensure_dict(pending, dict_size)
            conv.append_records(pending)
            bar.update(len(pending))
        return conv.finish()


# -- the conversion transaction ------------------------------------------------------------------


class _Conversion:
    """Opens or creates the store, checks the schema before writing, appends, and on failure
    removes what this conversion appended (or the whole store, if it created it).

    Three ways: *append* to the store at ``path``, whose schema is rewritten before the final
    sync (the commit point: anything failing before it is undone); *create* a new store in a
    private staging directory beside ``path``, published onto nothing or onto an empty
    directory; *replace* the store at ``path`` (``overwrite=True``) by a new one built beside it,
    swapped in atomically, and only then retired. An empty mount point at ``path`` cannot be
    renamed onto: the store is built in a staging directory inside it and its files moved in,
    ``meta.zr`` last (:func:`loaderx.staging.move_in`)."""

    def __init__(self, path: Any, wanted: _schema.Schema, existing: _schema.Schema | None,
                 overwrite: bool, append: bool | None, count: int | None,
                 checksums: bool = False):
        self.path = os.fspath(path)
        self.wanted = wanted
        self.existing = existing
        self.schema_written = False
        self.stack = contextlib.ExitStack()
        self.behind: AppendsBehind | None = None
        if existing is not None:
            _check_kind(existing, wanted.kind, self.path)
            if (existing.dtype, existing.item_shape) != (wanted.dtype, wanted.item_shape):
                raise DatasetError(
                    f"{self.path} holds a {existing.describe()} dataset; cannot append "
                    f"{wanted.describe()} records (use overwrite=True to replace it)")
            # An append keeps the extra keys the dataset had; those given now update them.
            self.wanted = _schema.Schema(wanted.kind, wanted.dtype, wanted.item_shape,
                                         wanted.codec, {**existing.extra, **wanted.extra})
            if append is None:
                _warn_append(self.path)
        self.created = existing is None
        self.replacing = overwrite and _schema.is_store(self.path)
        self.inside = False  # building inside `path`, an empty mount point
        self.target = self.path
        # The store being replaced is held under its writer lock from now until it was swapped
        # away: a store another handle or process is writing is refused before any work, and
        # no writer can slip in between (its appends would vanish with the old directory).
        self.old: Zrecord | None = None
        if self.replacing:
            if os.path.islink(self.path.rstrip(os.sep) or os.sep):
                # A swap would replace the link, and retire the dataset it points to.
                raise DatasetError(f"{self.path} is a symbolic link: overwrite=True replaces a "
                                   f"directory; pass the link's target "
                                   f"({os.path.realpath(self.path)}) or remove the link")
            if staging.is_mount_point(self.path):
                raise DatasetError(f"{self.path} is a mount point: overwrite=True cannot swap "
                                   "a dataset there; remove its files first (converting into "
                                   "the empty mount point works)")
            old = Zrecord(self.path)
            try:
                old.lock_for_writing()
            except BaseException:
                old.close()
                raise
            self.old = old
        try:
            if self.created:
                if not self.replacing and os.path.isdir(self.path) and os.listdir(self.path):
                    raise DatasetError(f"{self.path} is a non-empty directory that is not a "
                                       "loaderx dataset; refusing to write into it")
                self.inside = not self.replacing and staging.is_mount_point(self.path)
                self.target = self.stack.enter_context(
                    staging.private_dir(self.path, "new", within=self.inside))
            self.store = Zrecord(self.target, codec=_codec(wanted.codec))
        except BaseException:
            self._release()
            raise
        self.start = len(self.store)
        if count is not None and self.start + count > MAX_RECORDS:
            self._abandon()
            raise LimitExceededError(f"{self.path} would hold {self.start + count} records, "
                                     f"over the limit of {MAX_RECORDS}")
        if self.created:
            # Written before any record: a store with records always says what they are.
            _schema.write(self.target, wanted)
        if checksums and not self.store.has_checksums():
            self.store.enable_checksums()

    def __enter__(self) -> _Conversion:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self._stop_appends()
            self._abandon()

    def _appends(self) -> AppendsBehind:
        """The thread appending one chunk behind the reading (started on the first append)."""
        if self.behind is None:
            self.behind = AppendsBehind(self.store)
        return self.behind

    def _wait_appends(self) -> None:
        if self.behind is not None:
            self.behind.wait()

    def _stop_appends(self) -> None:
        """Lets the append under way finish and stops the thread (before anything is undone)."""
        behind, self.behind = self.behind, None
        if behind is not None:
            behind.close()

    def ensure_dict(self, samples: list[np.ndarray] | np.ndarray, dict_size: int | None) -> None:
        self._wait_appends()
        if self.store.has_dict():
            return
        parts = [np.ascontiguousarray(s).reshape(-1).view(np.uint8) for s in samples]
        parts = [p for p in parts if p.size]
        total = sum(p.size for p in parts)
        auto = min(_MAX_AUTO_DICT, max(1024, total // 50))
        target = auto if dict_size is None else min(auto, _positive(dict_size, "dict_size"))
        sizes = np.array([p.size for p in parts], dtype=np.uint64)
        blob = np.concatenate(parts) if parts else np.empty(0, np.uint8)
        try:
            self.store.train_dict(blob, sizes, max(target, 256))
        except Exception as e:
            raise LoaderxValueError(
                f"cannot train a zstd dictionary on {len(parts)} records ({total} bytes): {e}; "
                "a dictionary needs many records -- use codec='zstd' for small data") from e

    def append(self, block: np.ndarray, offsets: np.ndarray) -> None:
        if len(offsets):
            self._appends().submit(block, offsets)

    def append_records(self, records: list[np.ndarray]) -> None:
        if not records:
            return
        sizes = np.fromiter((r.nbytes for r in records), dtype=np.uint64, count=len(records))
        offsets = np.zeros(len(records), dtype=np.uint64)
        np.cumsum(sizes[:-1], out=offsets[1:])
        blob = np.concatenate([np.ascontiguousarray(r).reshape(-1).view(np.uint8)
                               for r in records])
        self._appends().submit(blob, offsets)

    def finish(self) -> int:
        """Makes everything durable and records the codec; returns the dataset length. Called
        inside the ``with``: whatever fails here is undone by :meth:`_abandon`."""
        self._wait_appends()
        self._stop_appends()
        n = len(self.store)
        if not self.created:
            # Before the commit point (the sync): a schema that cannot be written takes the
            # appended records back with it, so a retry does not add them twice.
            self.schema_written = True
            _schema.write(self.path, self.wanted)
        self.store.sync()
        self.store.close()
        if self.replacing:
            assert self.old is not None
            old = self.old
            try:
                # Handles still open on the old store learn it was replaced (StoreChangedError)
                # -- once the swap happened: a failed one leaves the old store as it was.
                staging.replace(self.target, self.path, swapped=old._retire)
            except OSError as e:
                raise _rename_error(self.path, e) from e
        elif self.inside:
            staging.move_in(self.target, self.path)
        elif self.created:
            self._publish()
        self._release()
        return n

    def _publish(self) -> None:
        try:
            staging.publish(self.target, self.path)
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            # A mount point that is_mount_point did not see: copy the store inside it, then
            # move its files in.
            with staging.private_dir(self.path, "new", within=True) as inside:
                copy_files(self.target, inside)
                staging.move_in(inside, self.path)

    def _release(self) -> None:
        """Lets the old store and the staging directory go (removing it unless published)."""
        try:
            if self.old is not None:
                self.old.close()
                self.old = None
        finally:
            self.stack.close()

    def _abandon(self) -> None:
        store = getattr(self, "store", None)
        try:
            if store is not None and not self.created and not store.closed:
                appended = np.arange(self.start, len(store), dtype=np.uint64)
                if len(appended):
                    store.delete(appended)
                    store.compact()
            if self.schema_written and self.existing is not None:
                _schema.write(self.path, self.existing)
        except Exception:  # the original error matters more; the store is still consistent
            pass
        finally:
            with contextlib.suppress(Exception):
                if store is not None:
                    store.close()
            with contextlib.suppress(Exception):
                self._release()


def _rename_error(path: str, e: OSError) -> BaseException:
    if e.errno == errno.EBUSY:
        return DatasetError(f"{path} cannot be replaced ({e.strerror}): it is a mount point or "
                            "in use; the dataset there is unchanged. Remove its files and "
                            "convert into the empty directory, or choose another path")
    return e


_warned: set[str] = set()


def _warn_append(path: str) -> None:
    key = os.path.abspath(path)
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(f"{path} already holds a dataset: the records are appended to it (as "
                  "loaderx 0.9.11 does). Pass append=True to append without this warning, "
                  "or overwrite=True to replace the dataset", AppendWarning, stacklevel=4)


# -- helpers -------------------------------------------------------------------------------------


def _codec(codec: Any) -> Codec:
    """The canonical codec name (the reference's ``zstdict`` spelled out for schema.msgpack)."""
    return _store_codec(codec)


def _positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise LoaderxValueError(f"{what} must be a positive int, got {value!r}")
    return int(value)


def _extra(schema: Mapping[str, Any] | None, kind: str, dtype: np.dtype,
           shape: tuple[int, ...]) -> dict[str, Any]:
    """The user's extra schema keys, after checking that reserved keys agree with the data."""
    if schema is None:
        return {}
    if not isinstance(schema, Mapping):
        raise DatasetError(f"schema must be a mapping, got {type(schema).__name__}")
    ours = {"kind": kind, "dtype": dtype.str, "item_shape": [int(d) for d in shape],
            "format": _schema.FORMAT, "version": _schema.VERSION}
    for key, value in schema.items():
        if not isinstance(key, str):
            raise DatasetError(f"schema keys must be strings, got {key!r}")
        if key in ours:
            given = list(value) if key == "item_shape" and isinstance(value, (list, tuple)) \
                else value
            if key == "dtype":
                given = _schema.check_dtype(value, "schema").str
            if given != ours[key]:
                raise DatasetError(f"schema[{key!r}] = {value!r} contradicts the data "
                                   f"({ours[key]!r})")
    return {k: v for k, v in schema.items() if k not in _schema.RESERVED}


def _existing_schema(path: Any, overwrite: bool,
                     append: bool | None) -> _schema.Schema | None:
    """The schema of the dataset that will be appended to (None: a new one), after checking
    the arguments and removing what earlier conversions left (see :mod:`loaderx.staging`)."""
    if append is not None and not isinstance(append, bool):
        raise LoaderxTypeError(f"append must be True, False or None, got {append!r}")
    if append and overwrite:
        raise LoaderxValueError("append=True and overwrite=True contradict each other: pass "
                                "one of them")
    path = os.fspath(path)
    staging.remove_stale(path)
    if overwrite or not _schema.is_store(path):
        return None
    if append is False:
        raise DatasetError(f"{path} already holds a dataset and append=False: pass "
                           "overwrite=True to replace it, or append=True to add to it")
    return _schema.read(path)


def _check_kind(existing: _schema.Schema, kind: str, path: Any) -> None:
    if existing.kind != kind:
        raise DatasetError(f"{os.fspath(path)} holds a {existing.kind} dataset; cannot append "
                           f"{kind} records to it (use overwrite=True to replace it)")


def _length_of(path: Any) -> int:
    with Zrecord(path) as z:
        return len(z)


def _ragged_record(item: Any, i: int) -> np.ndarray:
    if isinstance(item, (bytes, bytearray, memoryview)):
        return np.frombuffer(item, dtype=np.uint8)
    arr = item if isinstance(item, np.ndarray) else np.asarray(item)
    if isinstance(item, str):
        raise DatasetError(f"record {i} is a str; records are arrays or bytes: encode text "
                           f"first (e.g. {item[:20]!r}.encode())")
    if arr.ndim == 0:
        raise DatasetError(f"record {i} is a scalar; ragged records need at least one dimension")
    _schema.check_dtype(arr.dtype, f"record {i}")
    return arr


def _check_record(rec: np.ndarray, wanted: _schema.Schema, i: int, piece: int = 0) -> None:
    if rec.dtype != wanted.dtype or tuple(rec.shape[1:]) != wanted.item_shape:
        raise DatasetError(
            f"record {i} is {rec.dtype.str}{rec.shape}, but records of this dataset are "
            f"{wanted.dtype.str}(n, {', '.join(map(str, wanted.item_shape))})".replace(", )", ")"))
    if not piece and rec.nbytes > MAX_RECORD_BYTES:
        raise LimitExceededError(f"record {i} (counting from 0 in the order the iterator gave "
                                 f"them) is {rec.nbytes} bytes, over the {MAX_RECORD_BYTES}-byte "
                                 "limit; split it, store it in several records, or pass "
                                 "max_record_bytes= to write every item in pieces "
                                 "(loaderx.pack reads them back as one document)")


#: The schema key of a dataset written in pieces (loaderx.packing.PIECE_ROWS_KEY).
_PIECE_ROWS = "piece_rows"


def _piece_rows(path: Any, existing: _schema.Schema | None, extra: dict[str, Any],
                max_record_bytes: Any, row_bytes: int) -> int:
    """Rows per piece for ``max_record_bytes`` (0: items are written whole), agreeing with the
    dataset appended to and with ``schema=``."""
    had = 0 if existing is None else int(existing.extra.get(_PIECE_ROWS) or 0)
    given = extra.pop(_PIECE_ROWS, None)
    if max_record_bytes is None:
        piece = had
    else:
        limit = _positive(max_record_bytes, "max_record_bytes")
        if limit > MAX_RECORD_BYTES:
            raise LimitExceededError(f"max_record_bytes={limit} is over the "
                                     f"{MAX_RECORD_BYTES}-byte record limit")
        if row_bytes == 0 or limit < row_bytes:
            raise LoaderxValueError(f"max_record_bytes={limit} holds no whole {row_bytes}-byte "
                                    "row of a record")
        piece = limit // row_bytes
        if had and piece != had:
            raise DatasetError(f"{os.fspath(path)} was written in pieces of {had} rows; "
                               f"max_record_bytes={limit} makes pieces of {piece} (pass "
                               f"{had * row_bytes}, or leave it out to continue the layout)")
        if existing is not None and not had:
            _check_whole_records(path, piece, row_bytes)
    if given is not None and given != piece:
        raise DatasetError(f"schema[{_PIECE_ROWS!r}] = {given!r} is written by "
                           "max_record_bytes= (the rows per piece); leave it out of schema=")
    return piece


def _check_whole_records(path: Any, piece: int, row_bytes: int) -> None:
    """Appending in pieces to a dataset of whole items: none of them may look continued."""
    with Zrecord(path) as z:
        rows = z.lengths(np.arange(len(z), dtype=np.uint64)) // row_bytes
    if (rows >= piece).any():
        raise DatasetError(f"{os.fspath(path)} holds whole records of {piece} rows or more; "
                           "appended in pieces they would read as one document with the next "
                           "record. Convert into a new path (or overwrite=True)")


def _pieces(rec: np.ndarray, piece: int) -> list[np.ndarray]:
    """``rec`` as records: itself, or pieces of ``piece`` rows, the last one shorter (empty
    when ``piece`` divides its length) so that a reader knows where the item ends."""
    if not piece:
        return [rec]
    return [rec[a:a + piece] for a in range(0, len(rec) + 1, piece)]


def _dense_sample(arr: np.ndarray, row_bytes: int) -> np.ndarray:
    """Rows spread evenly over ``arr``, about ``_DICT_SAMPLE_BYTES`` in all."""
    n = int(arr.shape[0])
    want = max(1, min(n, _DICT_SAMPLE_BYTES // max(row_bytes, 1)))
    rows = np.unique(np.linspace(0, n - 1, want).astype(np.int64))
    return np.ascontiguousarray(arr[rows])


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class _TextBar:
    """A one-line progress display on stderr for when tqdm is not installed, redrawn at most
    ten times a second."""

    def __init__(self, total: int | None, desc: str) -> None:
        self.total, self.desc, self.n = total, desc, 0
        self.text = ""
        self.start = self.shown = time.monotonic()

    def update(self, n: int) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.shown >= 0.1:
            self.shown = now
            self._draw(now)

    def note(self, text: str) -> None:
        """Shows ``text`` after the counts until the next note (an empty one clears it)."""
        self.text = text
        self._draw(time.monotonic())

    def _draw(self, now: float) -> None:
        rate = self.n / max(now - self.start, 1e-9)
        done = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        pct = f" {100 * self.n / self.total:5.1f}%" if self.total else ""
        extra = f", {self.text}" if self.text else ""
        sys.stderr.write(f"\r{self.desc}: {done} records{pct}, {rate:,.0f} rec/s{extra}\x1b[K")
        sys.stderr.flush()

    def __enter__(self) -> _TextBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self._draw(time.monotonic())
        sys.stderr.write("\n")
        sys.stderr.flush()


@contextlib.contextmanager
def _phase(bar: Any, what: str) -> Iterator[None]:
    """Shows ``what`` on the progress display while it runs (a long step that writes no
    record, such as training the dictionary, would otherwise look stuck at 0)."""
    show = getattr(bar, "set_postfix_str", None) or getattr(bar, "note", None)
    if show is not None:
        show(what + "...")
    try:
        yield
    finally:
        if show is not None:
            show("")


def _progress(progress: bool | None, total: int | None, desc: str) -> Any:
    if progress is False or (progress is None and not sys.stderr.isatty()):
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _TextBar(total, desc)
    return tqdm(total=total, desc=desc, unit="rec")
