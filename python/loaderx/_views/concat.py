"""The implementation behind :mod:`loaderx.concat`, the public module, whose documentation
says what this does and why."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from loaderx import _native
from loaderx._views.dataset import (
    _BATCH_INDEX,
    DenseDataset,
    RaggedDataset,
    _dense_gather,
    _indices,
    _one_index,
    _ragged_layout,
    _ragged_views,
    _schema,
    _shortest_batch,
    _whole_rows,
    pinned_to,
)
from loaderx._views.group import GroupColumn
from loaderx.errors import (
    DatasetError,
    LoaderxIndexError,
    LoaderxTypeError,
    LoaderxValueError,
)

__all__ = ["ConcatDataset"]



def _open_part(part: Any, verify_reads: bool) -> DenseDataset | RaggedDataset | GroupColumn:
    if isinstance(part, (DenseDataset, RaggedDataset, GroupColumn)):
        return part
    if not isinstance(part, (str, os.PathLike)):
        if type(part).__name__ == "PackedDataset":
            raise LoaderxTypeError(
                "ConcatDataset takes stores, not packed views: concatenate the documents and "
                "pack once -- pack(ConcatDataset([RaggedDataset(a), RaggedDataset(b)]), "
                "seq_len) -- which mixes the corpora's documents into the same rows")
        raise LoaderxTypeError(f"a ConcatDataset part must be a dataset path, DenseDataset, "
                               f"RaggedDataset or a dataset directory's column, got "
                               f"{type(part).__name__}")
    path = os.fspath(part)
    kind = _schema.read(path).kind
    cls = DenseDataset if kind == "dense" else RaggedDataset
    return cls(path, verify_reads=verify_reads)


def _no_class_names(path: str, column: str | None = None) -> list[str] | None:
    return None


#: The class names of the labels in the store at a path when it is the store of a column of a
#: dataset directory whose manifest names them (``"classes"``), or of the column ``column`` of
#: the dataset directory at the path (a column of a column group); None otherwise. Manifests
#: are read a floor above this one: :mod:`loaderx.intake.directory`, which imports this
#: module, registers its reader when it is imported (``import loaderx`` imports it).
_class_names: Callable[[str, str | None], list[str] | None] = _no_class_names


def _part_class_names(part: Any) -> list[str] | None:
    if isinstance(part, GroupColumn):
        return _class_names(part.path, part.name)
    return _class_names(part.path, None)


def register_class_names(find: Callable[[str, str | None], list[str] | None]) -> None:
    """Sets how a part's class names are found (:mod:`loaderx.intake.directory` calls it)."""
    global _class_names
    _class_names = find


_APPEND_ADVICE = ("Append one dataset to the other with loaderx.intake.append_dataset(first, "
                  "second), which maps class names onto the first's numbering (new classes "
                  "numbered after its own)")


def check_class_maps(maps: Sequence[tuple[str, Any]], what: str = "a concatenation",
                     advice: str = _APPEND_ADVICE) -> None:
    """Refuses (DatasetError) ``maps`` -- ``(where, class names or None)`` of each dataset
    concatenated (or mixed) -- that number the classes differently: the same label would name
    another class in each. Datasets without class names are not compared."""
    named = [(where, names) for where, names in maps if names is not None]
    longest = named[0] if named else None
    for where, names in named[1:]:
        assert longest is not None
        first_where, first = longest
        m = min(len(names), len(first))
        if list(names[:m]) == list(first[:m]) and not set(names[m:]) & set(first[:m]) and \
                not set(first[m:]) & set(names[:m]):
            # One list extends the other: every class both name has one number.
            if len(names) > len(first):
                longest = (where, names)
            continue
        differ = [f"{k} is {a!r} there and {b!r} here"
                  for k, (a, b) in enumerate(zip(first, names, strict=False)) if a != b][:3]
        only = [n for n in names if n not in first][:5]
        lacks = [n for n in first if n not in names][:5]
        detail = "; ".join(filter(None, [
            "label " + ", label ".join(differ) if differ else "",
            f"only here: {only!r}" if only else "",
            f"only there: {lacks!r}" if lacks else ""]))
        raise DatasetError(
            f"{where} numbers its classes {_short(names)}, {first_where} {_short(first)} "
            f"({detail}); in {what} the same label would mean another class. {advice}")


def class_names_of(ds: Any) -> list[str] | None:
    """The class names a dataset's manifest gives its labels (a column of a dataset
    directory, a concatenation of such columns, a subset of one), or None."""
    if isinstance(ds, (DenseDataset, RaggedDataset, GroupColumn)):
        return _part_class_names(ds)
    if isinstance(ds, ConcatDataset):
        return max((c for c in ds._classes if c is not None), key=len, default=None)
    base = getattr(ds, "_base", None)  # a Subset names its dataset's classes
    return class_names_of(base) if base is not None else None


def _short(names: Sequence[Any]) -> str:
    names = list(names)
    return repr(names) if len(names) <= 8 else \
        repr(names[:8])[:-1] + f", ...] ({len(names)} classes)"


class ConcatDataset:
    """The records of ``parts`` (dataset paths, or open datasets) one after another.

    All parts must have the same kind, dtype and item shape (``DatasetError`` otherwise).
    ``verify_reads`` is passed to the parts opened from paths.

    Parts that are the label columns of dataset directories whose manifests name the classes
    differently (an image folder's ``label``: each folder numbers its own classes) are refused
    with a DatasetError naming the classes that differ -- the same number would mean another
    class in each part. :func:`loaderx.intake.append_dataset` appends one dataset to another
    with the class names mapped onto one numbering. Parts with the same class names, lists
    that extend one another (``['cat', 'dog']`` and ``['cat', 'dog', 'emu']``: every class
    both name has one number), or without any, concatenate as they are.

    A part may be a :class:`~loaderx.subset.Subset` of a dataset (or of a concatenation):
    ``ConcatDataset([RaggedDataset(a), RaggedDataset(b).subset(idx)])`` is then the
    :class:`~loaderx.subset.Subset` of the concatenation of the whole datasets that holds the
    parts' records in order -- what ``pack()``, ``split()`` and the loader read like any subset.
    """

    def __new__(cls, parts: Sequence[Any] = (), *args: Any, **kwargs: Any) -> Any:
        from loaderx._views.subset import Subset

        if not isinstance(parts, (str, os.PathLike)) and \
                any(isinstance(p, Subset) for p in parts):
            return _of_subsets(list(parts), bool(kwargs.get("verify_reads", False)))
        return super().__new__(cls)

    def __init__(self, parts: Sequence[Any], *, verify_reads: bool = False,
                 _classes: Sequence[Any] | None = None) -> None:
        if isinstance(parts, (str, os.PathLike)) or not len(parts):
            raise LoaderxValueError(
                "ConcatDataset needs a non-empty list of dataset paths or datasets")
        self._verify_reads = bool(verify_reads)
        # (each part reads as its kind does: a store's dataset, or a grouped column)
        self._parts: list[Any] = [_open_part(p, self._verify_reads) for p in parts]
        first = self._parts[0]
        for p in self._parts[1:]:
            if (p.kind, p.dtype, p.item_shape) != (first.kind, first.dtype, first.item_shape):
                raise DatasetError(
                    f"{_where(p)} holds {p.kind} {p.dtype.str}{p.item_shape} records, "
                    f"{_where(first)} holds {first.kind} "
                    f"{first.dtype.str}{first.item_shape}; a concatenation needs one schema")
        # The class names of each part (given by open_dataset, which read them already).
        self._classes = list(_classes) if _classes is not None and \
            len(_classes) == len(self._parts) else [_part_class_names(p) for p in self._parts]
        check_class_maps([(_where(p), c) for p, c in zip(self._parts, self._classes,
                                                          strict=True)], "a ConcatDataset")
        self.kind = first.kind
        lengths = np.array([len(p) for p in self._parts], dtype=np.uint64)
        self._starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint64)
        self._len = int(self._starts[-1])
        self.record_bytes = first.record_bytes if self.kind == "dense" else 0
        # One native call per batch, with the batch's own indices: the engine locates each
        # record's part and reads each part's records through its own store. Columns of a
        # column group (rows of blocks, not records of a store) are read part by part.
        self._across: Any = None if any(isinstance(p, GroupColumn) for p in self._parts) else \
            _native.Across([p._store._native for p in self._parts], self._starts)

    # -- what the datasets share ------------------------------------------------------------------

    @property
    def parts(self) -> list[DenseDataset | RaggedDataset | GroupColumn]:
        return list(self._parts)

    @property
    def dtype(self) -> np.dtype:
        return self._parts[0].dtype

    @property
    def item_shape(self) -> tuple[int, ...]:
        return self._parts[0].item_shape

    @property
    def path(self) -> str:
        return os.pathsep.join(p.path for p in self._parts)

    @property
    def closed(self) -> bool:
        return any(p.closed for p in self._parts)

    def __len__(self) -> int:
        return self._len

    def close(self) -> None:
        for p in self._parts:
            p.close()

    def __enter__(self) -> ConcatDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # The parts themselves: each pickles with its own absolute path and settings (a part
        # opened by the caller keeps its verify_reads, whatever this view's flag says).
        return (_reopen, (self._parts, self._verify_reads, self._classes,
                          [int(n) for n in np.diff(self._starts)]))

    @property
    def verify_reads(self) -> bool:
        """The ``verify_reads`` given for the parts opened from paths."""
        return self._verify_reads

    def __repr__(self) -> str:
        return (f"ConcatDataset({len(self._parts)} parts, records={self._len}, kind={self.kind}, "
                f"dtype={self.dtype.str}, item_shape={self.item_shape})")

    # -- reading ---------------------------------------------------------------------------------

    def _locate(self, idxs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each global index's part and index within it."""
        part = np.searchsorted(self._starts, idxs, side="right") - 1
        return part, idxs - self._starts[part]

    def __getitem__(self, idx: Any) -> Any:
        if (self.kind == "dense" and type(idx) is np.ndarray and idx.ndim == 1
                and idx.dtype in _BATCH_INDEX):
            out = self._batch(idx)
            if out is not None:
                return out
        one = _one_index(idx, self._len)
        if one is not None:
            part, local = self._locate(np.array([one], dtype=np.uint64))
            return self._parts[int(part[0])][int(local[0])]
        flat = _indices(idx, self._len)
        if self.kind == "ragged":
            return self._ragged(flat.reshape(-1))
        return self.gather(flat.reshape(-1)).reshape(flat.shape + self.item_shape)

    def _batch(self, idx: np.ndarray) -> np.ndarray | None:
        if self._across is None:
            return None
        return _shortest_batch(self, self._across.gather_fixed, idx, self.record_bytes)

    def __getitems__(self, idxs: Sequence[int]) -> Any:
        flat = _indices(idxs, self._len).reshape(-1)
        return self._ragged(flat) if self.kind == "ragged" else self.gather(flat)

    def gather(self, idxs: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Dense views: records ``idxs`` as one ``(len(idxs), *item_shape)`` array (into ``out``
        when given), each part's records read straight into their rows."""
        if self.kind != "dense":
            raise DatasetError("gather() is for dense views; index a ragged view instead")
        return _dense_gather(self, idxs, out)

    def subset(self, indices: Any) -> Any:
        """The records ``indices`` as a :class:`~loaderx.subset.Subset` view (nothing is
        copied); see :func:`loaderx.subset.split` for train/validation splits."""
        from loaderx._views.subset import Subset

        return Subset(self, indices)

    def prefetch(self, idxs: Any) -> bool:
        """Starts reading records ``idxs`` of every part into the page cache without waiting;
        says whether any read was asked for."""
        flat = np.asarray(idxs, dtype=np.uint64).reshape(-1)
        flat = flat[flat < self._len]
        part, local = self._locate(flat)
        asked = [self._parts[int(k)].prefetch(local[part == k]) for k in np.unique(part)]
        return any(asked)

    @property
    def recently_cold(self) -> bool:
        """Whether the last read of any part found records that were not in memory."""
        return any(p.recently_cold for p in self._parts)

    @property
    def view_digest(self) -> str:
        """``""`` when every part is a whole dataset, else the parts' digests."""
        digests = [getattr(p, "view_digest", "") for p in self._parts]
        return "+".join(digests) if any(digests) else ""

    def gather_rows(self, idxs: np.ndarray, dst: np.ndarray, shards: int | None = None,
                    rows: np.ndarray | None = None) -> None:
        """Dense views: each part's records of the batch go straight to their rows of ``dst``
        (see :mod:`loaderx.source`); an index out of range is refused before any is read."""
        if self._across is not None:
            self._across.gather_fixed(idxs, dst, self.record_bytes, shards, rows)
            return
        idxs = np.asarray(idxs, dtype=np.uint64)
        if len(idxs) and int(idxs.max()) >= self._len:
            raise LoaderxIndexError(f"index {int(idxs.max())} is out of range for a "
                                    f"ConcatDataset of {self._len} records")
        part, local = self._locate(idxs)
        at = np.arange(len(idxs), dtype=np.uint64) if rows is None else \
            np.asarray(rows, dtype=np.uint64)
        for k in np.unique(part):
            mine = part == k
            self._parts[int(k)].gather_rows(local[mine], dst, shards, at[mine])

    def record_nbytes(self, idxs: np.ndarray) -> np.ndarray:
        """Ragged views: each record's byte length (uint64), from its part's record table (see
        :mod:`loaderx.source`)."""
        nbytes = np.empty(len(idxs), dtype=np.uint32)
        self._across.lengths(idxs, nbytes)
        _whole_rows(nbytes, self._parts[0]._schema.item_bytes, lambda k: self._where(idxs[k]))
        return nbytes.astype(np.uint64)

    def _where(self, index: Any) -> tuple[int, str]:
        """Record ``index`` of the view as (its index in its part, the part's path)."""
        part, local = self._locate(np.array([index], dtype=np.uint64))
        return int(local[0]), self._parts[int(part[0])].path

    def gather_at(self, idxs: np.ndarray, dst: np.ndarray, offsets: np.ndarray) -> None:
        """Ragged views: each part's records of the batch go straight to their offsets in
        ``dst``, in one native call (see :mod:`loaderx.source`)."""
        self._across.gather(idxs, dst, offsets)

    def _ragged(self, idxs: np.ndarray) -> list[np.ndarray]:
        """The records as a ragged dataset reads them: lengths, one buffer, each part's
        records gathered into their places, then one view per record."""
        # Records that are not whole rows are refused there (CorruptStoreError naming them).
        nbytes = self.record_nbytes(idxs) if len(idxs) else np.zeros(0, np.uint64)
        offsets, total = _ragged_layout(nbytes)
        buf = np.empty(total, dtype=np.uint8)
        if len(idxs):
            self.gather_at(idxs, buf, offsets)
        return _ragged_views(buf, offsets, nbytes, self.dtype, self.item_shape)


def _where(part: Any) -> str:
    """A part as errors name it: its path, and a grouped column's name."""
    return f"column {part.name!r} of {part.path}" if isinstance(part, GroupColumn) else part.path


def _of_subsets(parts: list[Any], verify_reads: bool) -> Any:
    """``ConcatDataset(parts)`` where some parts are subsets: the subset, in the parts' order,
    of the concatenation of the whole datasets under them."""
    from loaderx._views.subset import Subset

    whole: list[Any] = []
    index: list[np.ndarray] = []
    start = 0
    for part in parts:
        base, idx = (part.dataset, part.indices) if isinstance(part, Subset) else (part, None)
        inner = base.parts if isinstance(base, ConcatDataset) else [base]
        opened = [_open_part(p, verify_reads) for p in inner]
        whole.extend(opened)
        n = sum(len(p) for p in opened)
        index.append(np.arange(start, start + n, dtype=np.uint64) if idx is None
                     else idx.astype(np.uint64) + np.uint64(start))
        start += n
    return Subset(ConcatDataset(whole, verify_reads=verify_reads), np.concatenate(index))


def _reopen(parts: list[Any], verify_reads: bool, classes: list[Any] | None = None,
            lengths: list[int] | None = None) -> ConcatDataset:
    if lengths is not None:  # the parts as long as this view was built on
        parts = [pinned_to(p, n, f"part {i} of a ConcatDataset")
                 for i, (p, n) in enumerate(zip(parts, lengths, strict=True))]
    return ConcatDataset(parts, verify_reads=verify_reads, _classes=classes)
