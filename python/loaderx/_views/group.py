"""Column groups: the fixed-width columns of a dataset directory stored together, row-major,
in one *block store* whose record ``b`` holds rows ``b * block_rows ..`` (docs/FORMAT.md,
"Column groups").

A row of a group is ``row_bytes`` bytes: each column's value at its byte ``offset``. Reading a
batch of rows is one native call per group (``Zrecord.gather_block_rows``), whatever the number
of columns, and the store's table entry is paid once per block, not once per value: a table of
40 narrow columns reads as fast as one array of its rows.

:class:`ColumnGroup` is the open group -- its store(s), its layout and the row count of the
commit point it was opened at; :class:`GroupColumn` is one column of it, a dense dataset (the
dense-source protocol of :mod:`loaderx.source`) that every view and the loader take. The loader
reads a group once per batch for all the columns it wants (:meth:`ColumnGroup.read`), then
takes each column's bytes out of the rows; a column read alone does the same for itself.

Every reader is pinned to the row count (and generation) it was opened with: rows a writer
appended since are refused like any row out of range, and a worker process that reopens the
group refuses a directory whose generation is no longer the one it was given
(StoreChangedError) rather than read rows of another dataset.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, SupportsIndex, overload

import numpy as np
import numpy.typing as npt

from loaderx._store import schema as _schema
from loaderx._views.gather import _dense_gather, _dense_item, _indices
from loaderx._views.subset import Subset
from loaderx.errors import (
    CorruptStoreError,
    LoaderxIndexError,
    StoreChangedError,
)
from loaderx.zrecord import MAX_RECORD_BYTES, Zrecord

__all__ = ["ColumnGroup", "GroupColumn", "GroupField", "GroupLayout", "plan_layout",
           "pack_rows", "BLOCK_BYTES", "MAX_GROUP_ROW_BYTES"]

#: Bytes a block of a group holds (at most: a block has at least one row). Random access to a
#: raw block store costs the same whatever the block size (a row is a window of its block);
#: larger blocks mean fewer table entries and a larger share of rows per chunk-file page. 64 KiB
#: keeps a compressed block's decode (the cost of a random row of a zstd group) near 20 us.
BLOCK_BYTES = 64 << 10
#: Widest row a group takes; wider fixed-width columns keep a store of their own.
MAX_GROUP_ROW_BYTES = 4096


@dataclass(frozen=True)
class GroupField:
    """One column of a group: its name, dtype, item shape and byte offset in a row."""

    name: str
    dtype: np.dtype
    item_shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.item_shape) * self.dtype.itemsize


@dataclass(frozen=True)
class GroupLayout:
    """Bytes of a row (its fields padded to the widest field's alignment) and rows a block."""

    row_bytes: int
    block_rows: int


def plan_layout(fields: Sequence[tuple[str, np.dtype, tuple[int, ...]]]) -> tuple[
        GroupLayout, list[GroupField]]:
    """Where each ``(name, dtype, item_shape)`` goes in a row: widest alignment first, so every
    value sits at a multiple of its own alignment and a column's values read as one strided
    NumPy copy; the row is padded to the widest alignment. Fields keep the given order."""
    order = sorted(range(len(fields)), key=lambda i: -fields[i][1].alignment)
    offsets = [0] * len(fields)
    at = 0
    for i in order:
        _, dt, shape = fields[i]
        offsets[i] = at
        at += math.prod(shape) * dt.itemsize
    align = max((dt.alignment for _, dt, _ in fields), default=1)
    row = max(1, -(-at // align) * align)
    block_rows = max(1, min(BLOCK_BYTES // row, MAX_RECORD_BYTES // row))
    placed = [GroupField(n, dt, tuple(shape), offsets[i])
              for i, (n, dt, shape) in enumerate(fields)]
    return GroupLayout(row, block_rows), placed


def pack_rows(layout: GroupLayout, fields: Sequence[GroupField],
              arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The rows of ``arrays`` (one per field, ``(n, *item_shape)`` of its dtype) as a C-ordered
    ``(n, row_bytes)`` uint8 array, padding zeroed."""
    n = len(arrays[0]) if arrays else 0
    rows = np.zeros((n, layout.row_bytes), np.uint8)
    for f, a in zip(fields, arrays, strict=True):
        _field_view(rows, layout.row_bytes, f)[...] = a
    return rows


def _field_view(rows: np.ndarray, row_bytes: int, f: GroupField) -> np.ndarray:
    """Field ``f`` of every row of the uint8 rows ``rows`` as a strided, typed view."""
    n = rows.size // row_bytes if row_bytes else 0
    # The item's own C-order strides, from its shape alone (no array made: this runs per
    # column per batch).
    inner = tuple(int(np.prod(f.item_shape[k + 1:], dtype=np.int64)) * f.dtype.itemsize
                  for k in range(len(f.item_shape)))
    return np.ndarray((n, *f.item_shape), dtype=f.dtype, buffer=rows, offset=f.offset,
                      strides=(row_bytes, *inner))


@dataclass(frozen=True)
class _Segment:
    """One block store of a group (a directory of parts has one per part): its path, the rows
    of the commit point that lie in it, and their tail (the rows after its last full block)."""

    path: str
    rows: int
    tail: bytes


class ColumnGroup:
    """An open column group: ``segments`` (block stores in row order, each with the rows it
    holds at the commit point and their tail), its ``layout``, and the directory ``root``,
    ``generation`` and group index ``index`` it was opened at (a worker process opens it again
    from them). ``pinned``: the rows this group shows, when fewer than the segments hold (a
    worker's group reopened after rows were appended to the directory)."""

    def __init__(self, segments: Sequence[tuple[str, int, bytes]], layout: GroupLayout,
                 root: str, generation: str, index: int = 0, *, verify_reads: bool = False,
                 pinned: int | None = None) -> None:
        self.layout = layout
        self.root, self.generation, self.index = root, generation, index
        self.verify_reads = bool(verify_reads)
        self._segments = tuple(_Segment(os.path.abspath(p), int(r), bytes(t))
                               for p, r, t in segments)
        self._tails = [np.frombuffer(s.tail, np.uint8) for s in self._segments]
        self._starts = np.cumsum([0] + [s.rows for s in self._segments], dtype=np.int64)
        held = int(self._starts[-1])
        self.rows = held if pinned is None else min(int(pinned), held)
        self._check_pin = self.rows < held
        self._stores: list[Zrecord] = []
        self._scratch = threading.local()
        try:
            for s in self._segments:
                self._stores.append(_open_block_store(s.path, s.rows, layout, verify_reads))
        except BaseException:
            self.close()
            raise
        self._natives = [z._native for z in self._stores]

    @property
    def stores(self) -> list[Zrecord]:
        """The block stores, in row order."""
        return list(self._stores)

    @property
    def closed(self) -> bool:
        return any(z.closed for z in self._stores)

    @property
    def recently_cold(self) -> bool:
        return any(n.recently_cold for n in self._natives)

    def read(self, idxs: npt.NDArray[np.uint64], shards: int | None = None) -> np.ndarray:
        """Rows ``idxs`` (uint64, checked by the engine) as ``(n, row_bytes)`` uint8, in a
        buffer of the calling thread's that the next read on this thread reuses."""
        n = len(idxs)
        row = self.layout.row_bytes
        buf = getattr(self._scratch, "buf", None)
        if buf is None or buf.size < n * row:
            buf = np.empty(max(n * row, 1 << 16), np.uint8)
            self._scratch.buf = buf
        out = buf[:n * row]
        if n:
            self._read_into(idxs, out, shards)
        return out.reshape(n, row)

    def _read_into(self, idxs: npt.NDArray[np.uint64], out: np.ndarray,
                   shards: int | None) -> None:
        block, row = self.layout.block_rows, self.layout.row_bytes
        if len(self._natives) == 1 and not self._check_pin:
            self._natives[0].gather_block_rows(idxs, out, block, row, self.rows,
                                               self._tails[0], shards)
            return
        if int(idxs.max()) >= self.rows:
            raise LoaderxIndexError(f"index {int(idxs.max())} is out of range for a dataset "
                                    f"of {self.rows} records")
        seg = np.searchsorted(self._starts, idxs.astype(np.int64), side="right") - 1
        rows2d = out.reshape(-1, row)
        for k in np.unique(seg):
            at = np.flatnonzero(seg == k)
            local = (idxs[at] - np.uint64(self._starts[k])).astype(np.uint64)
            part = np.empty(len(at) * row, np.uint8)
            self._natives[k].gather_block_rows(local, part, block, row,
                                               self._segments[k].rows, self._tails[k], shards)
            rows2d[at] = part.reshape(-1, row)

    def prefetch(self, idxs: Any) -> bool:
        idx = np.asarray(idxs, dtype=np.uint64).reshape(-1)
        if not len(idx) or len(self._stores) != 1:
            return False
        blocks = np.unique(idx // np.uint64(self.layout.block_rows))
        return bool(self._stores[0].prefetch(blocks))

    def close(self) -> None:
        for z in self._stores:
            z.close()

    def key(self) -> tuple[Any, ...]:
        """What identifies this open group for a worker process (see :func:`_reopen_group`):
        the directory, its generation, the group, the rows shown and the read checks."""
        return (self.root, self.generation, self.index, self.rows, self.verify_reads)


def _open_block_store(path: str, rows: int, layout: GroupLayout,
                      verify_reads: bool) -> Zrecord:
    """The block store at ``path``, checked to hold the full blocks of ``rows`` rows (more
    records than that is what an interrupted append left: never read)."""
    if os.path.islink(path) or not os.path.isdir(path) or not _schema.is_store(path):
        raise CorruptStoreError(f"{path}: the store of a column group is missing (or is a "
                                "link); the dataset directory is incomplete")
    z = Zrecord(path, verify_reads=verify_reads)
    need = rows // layout.block_rows
    have = len(z)
    if have < need:
        z.close()
        raise CorruptStoreError(f"{path}: the column group holds {have} blocks of "
                                f"{layout.block_rows} rows; the manifest says {rows} rows "
                                f"({need} blocks)")
    return z


#: Groups this process opened again for unpickled columns, so that the columns of one group
#: share it (and the loader reads it once a batch) in a worker process as in their loader's.
_REOPENED: weakref.WeakValueDictionary[tuple[Any, ...], ColumnGroup] = \
    weakref.WeakValueDictionary()
_REOPEN_LOCK = threading.Lock()


#: What a dataset directory's group ``index`` is now: ``(generation, rows, segments,
#: layout)``, from its manifest. Manifests are read a floor above this one:
#: :mod:`loaderx.intake.directory`, which imports this module, registers its reader.
GroupOpener = Callable[[str, int], tuple[str, int, list[tuple[str, int, bytes]], GroupLayout]]
_group_opener: GroupOpener | None = None


def register_group_opener(opener: GroupOpener) -> None:
    """Sets how a group is found again from its directory (see above)."""
    global _group_opener
    _group_opener = opener


def _reopen_group(key: tuple[Any, ...]) -> ColumnGroup:
    root, generation, index, rows, verify = key
    with _REOPEN_LOCK:
        group = _REOPENED.get(key)
        if group is not None and not group.closed:
            return group
        if _group_opener is None:
            raise StoreChangedError(f"{root}: dataset directories cannot be read here "
                                    "(loaderx.intake is not imported)")
        now, held, segments, layout = _group_opener(root, index)
        if now != generation or held < rows:
            raise StoreChangedError(
                f"{root} was written again or shrunk (generation {now!r}, {held} rows; the "
                f"loader was built on {generation!r}, {rows} rows): its rows may no longer be "
                "the rows this loader was given. Build the loader again on the dataset as it "
                "is now (open_dataset)")
        group = ColumnGroup(segments, layout, root, generation, index, verify_reads=verify,
                            pinned=rows)
        _REOPENED[key] = group
        return group


def _reopen_column(key: tuple[Any, ...], field: GroupField) -> GroupColumn:
    return GroupColumn(_reopen_group(key), field)


class GroupColumn:
    """One column of a :class:`ColumnGroup`: fixed-shape records read into NumPy arrays, as a
    :class:`~loaderx.dataset.DenseDataset` reads them (``ds[i]``, ``ds[idx]``, ``gather``,
    ``subset``, the dense-source protocol). ``len(ds)`` is the row count of the commit point
    the directory was opened at."""

    kind = "dense"
    view_digest = ""  # a whole column

    def __init__(self, group: ColumnGroup, field: GroupField) -> None:
        self.column_group = group
        self.field = field
        self.record_bytes = field.nbytes

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def path(self) -> str:
        """The dataset directory the column belongs to."""
        return self.column_group.root

    @property
    def dtype(self) -> np.dtype:
        return self.field.dtype

    @property
    def item_shape(self) -> tuple[int, ...]:
        return self.field.item_shape

    @property
    def verify_reads(self) -> bool:
        return self.column_group.verify_reads

    @property
    def closed(self) -> bool:
        return self.column_group.closed

    @property
    def recently_cold(self) -> bool:
        return self.column_group.recently_cold

    def __len__(self) -> int:
        return self.column_group.rows

    def take_field(self, rows: np.ndarray, dst: np.ndarray) -> None:
        """Copies this column's values out of the group rows ``rows`` (``(n, row_bytes)``
        uint8, as :meth:`ColumnGroup.read` gives them) into the uint8 buffer ``dst`` of ``n``
        records."""
        n = len(rows)
        src = _field_view(rows.reshape(-1), self.column_group.layout.row_bytes, self.field)
        np.copyto(dst.view(self.field.dtype).reshape(n, *self.field.item_shape), src)

    def gather_rows(self, idxs: npt.NDArray[np.uint64], dst: npt.NDArray[np.uint8],
                    shards: int | None = None,
                    rows: npt.NDArray[np.uint64] | None = None) -> None:
        """Writes record ``idxs[i]`` into row ``i`` (or ``rows[i]``) of the uint8 buffer
        ``dst`` of ``record_bytes``-byte rows (see :mod:`loaderx.source`)."""
        group_rows = self.column_group.read(idxs, shards)
        if rows is None:
            self.take_field(group_rows, dst)
            return
        tmp = np.empty(len(idxs) * self.record_bytes, np.uint8)
        self.take_field(group_rows, tmp)
        dst.reshape(-1, self.record_bytes)[rows.astype(np.intp)] = tmp.reshape(
            -1, self.record_bytes)

    @overload
    def __getitem__(self, idx: SupportsIndex | tuple[Any, ...]) -> Any: ...
    @overload
    def __getitem__(self, idx: slice | Sequence[int] | npt.NDArray[Any]) -> npt.NDArray[Any]: ...

    def __getitem__(self, idx: Any) -> Any:
        """As :meth:`loaderx.dataset.DenseDataset.__getitem__`."""
        return _dense_item(self, idx)

    def __getitems__(self, idxs: Sequence[int]) -> np.ndarray:
        return self.gather(_indices(idxs, len(self)).reshape(-1))

    def gather(self, idxs: Any, out: np.ndarray | None = None) -> np.ndarray:
        """As :meth:`loaderx.dataset.DenseDataset.gather`."""
        return _dense_gather(self, idxs, out)

    def subset(self, indices: Any) -> Any:
        return Subset(self, indices)

    def prefetch(self, idxs: Any) -> bool:
        return self.column_group.prefetch(idxs)

    def _pinned(self, rows: int) -> None:
        """Shows only the first ``rows`` rows (the group's, for all its columns)."""
        group = self.column_group
        if rows < group.rows:
            group.rows, group._check_pin = rows, True

    def close(self) -> None:
        """Closes the group's store (and so every column of the group)."""
        self.column_group.close()

    def __enter__(self) -> GroupColumn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen_column, (self.column_group.key(), self.field))

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"records={len(self)}"
        return (f"GroupColumn({self.path!r}, {self.field.name!r}, {state}, "
                f"dtype={self.dtype.str}, item_shape={self.item_shape})")

