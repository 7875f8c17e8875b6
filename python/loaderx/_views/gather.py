"""Picking and gathering records, shared by every view (datasets, subsets, concatenations,
mixtures, packing plans): index normalisation with clear errors, the dense gather into a
checked or fresh buffer, and the back-to-back layout of ragged records as views of one buffer.
It uses only NumPy, the errors and the buffer pool's aligned allocation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from loaderx._views.recycle import aligned_empty
from loaderx.errors import LoaderxIndexError, LoaderxValueError

_U64 = np.dtype(np.uint64)


def _indices(idx: Any, n: int) -> np.ndarray:
    """A slice, int array, sequence of ints or boolean mask as uint64 record indices in
    ``range(n)`` (negative ones counted from the end), keeping the shape of an index array."""
    if isinstance(idx, slice):
        return np.arange(*idx.indices(n), dtype=np.uint64)
    arr = idx if isinstance(idx, np.ndarray) else np.asarray(idx)
    if arr.dtype == np.bool_:
        if arr.shape != (n,):
            raise LoaderxIndexError(f"boolean index of shape {arr.shape} does not match the "
                                    f"dataset's length {n}")
        return np.flatnonzero(arr).astype(np.uint64)
    if arr.size == 0:
        return np.empty(arr.shape, dtype=np.uint64)
    if arr.dtype.kind not in "iu":
        raise LoaderxIndexError(f"dataset indices must be integers, got {arr.dtype} "
                                f"({_short(idx)})")
    if arr.dtype.kind == "i":
        lo = int(arr.min())
        if lo < -n:
            raise LoaderxIndexError(f"index {lo} is out of range for a dataset of {n} records")
        if lo < 0:
            arr = np.where(arr < 0, arr + n, arr)
    hi = int(arr.max())
    if hi >= n:
        raise LoaderxIndexError(f"index {hi} is out of range for a dataset of {n} records")
    return arr.astype(np.uint64, copy=False)


def _one_index(idx: Any, n: int) -> int | None:
    """``idx`` as a record index when it is a single integer, else None."""
    if isinstance(idx, (bool, np.bool_)):
        raise LoaderxIndexError("a boolean is not a dataset index")
    if isinstance(idx, (int, np.integer)):
        i = int(idx)
        if not -n <= i < n:
            raise LoaderxIndexError(f"index {i} is out of range for a dataset of {n} records")
        return i + n if i < 0 else i
    if isinstance(idx, (float, np.floating)):
        raise LoaderxIndexError(f"dataset indices must be integers, got {idx!r}")
    return None


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) < 60 else text[:57] + "..."


#: Index arrays the shortest path of ``DenseDataset.__getitem__`` takes.
_BATCH_INDEX = (np.dtype(np.int64), _U64)
#: Below this many bytes a batch buffer need not be aligned to 64 bytes: ``copy_bytes``
#: copies records under 2 KiB with plain ``memcpy`` whatever their alignment.
_ALIGNED_FROM = 256 * 1024


def _shortest_batch(view: Any, gather_fixed: Callable[..., None], idx: np.ndarray,
                    row_bytes: int) -> np.ndarray | None:
    """The shortest path of a dense view's batch (``DenseDataset``, a dense
    ``ConcatDataset``): ``idx`` (1-D int64 or uint64) gathered by the native ``gather_fixed``
    into a new array, the engine checking the indices before it writes anything; None when it
    refuses them (a negative index, which counts from the end, or one out of range), for the
    general path to handle or report."""
    n = len(idx)
    raw = _batch_buffer(n * row_bytes)
    try:
        gather_fixed(idx.view(_U64), raw, row_bytes, None, None)
    except LoaderxIndexError:
        return None
    out: np.ndarray = raw.view(view.dtype).reshape((n, *view.item_shape))
    return out


def _batch_buffer(nbytes: int) -> np.ndarray:
    """A uint8 array for a batch: 64-byte aligned when large (see ``aligned_empty``)."""
    if nbytes < _ALIGNED_FROM:
        return np.empty(nbytes, np.uint8)
    return aligned_empty(nbytes)


def _dense_item(view: Any, idx: Any) -> Any:
    """``view[idx]`` of a dense view (a :class:`DenseDataset`, a column of a column group):
    one record for an integer (a NumPy scalar when records are scalars), an array of records
    for a slice, a list, an integer array or a boolean mask; a tuple indexes further into the
    records, as NumPy does."""
    if isinstance(idx, tuple):
        if not idx:
            raise LoaderxIndexError("an empty tuple is not a dataset index")
        head = view[idx[0]]
        rest = idx[1:]
        return head[rest] if _one_index(idx[0], len(view)) is not None \
            else head[(slice(None), *rest)]
    one = _one_index(idx, len(view))
    if one is not None:
        return view.gather(np.array([one], dtype=np.uint64))[0]
    flat = _indices(idx, len(view))
    out = view.gather(flat.reshape(-1))
    return out.reshape(flat.shape + view.item_shape)


def _dense_gather(view: Any, idxs: Any, out: np.ndarray | None) -> np.ndarray:
    """The ``gather`` of every dense view (a :class:`DenseDataset`, a dense
    :class:`~loaderx.concat.ConcatDataset`): checks the indices and ``out`` (or allocates it
    aligned), then fills it with the view's ``gather_rows``."""
    if not (isinstance(idxs, np.ndarray) and idxs.dtype == _U64 and idxs.ndim == 1):
        idxs = _indices(idxs, len(view)).reshape(-1)
    shape = (len(idxs), *view.item_shape)
    if out is None:
        out = _batch_buffer(len(idxs) * view.record_bytes).view(view.dtype).reshape(shape)
    elif not isinstance(out, np.ndarray):
        raise LoaderxValueError(f"out must be a NumPy array, got {type(out).__name__}")
    elif out.dtype != view.dtype or out.shape != shape:
        raise LoaderxValueError(f"out is {out.dtype}{out.shape}; this gather needs "
                                f"{view.dtype}{shape}")
    elif not out.flags.c_contiguous:
        raise LoaderxValueError("out must be C-contiguous")
    elif not out.flags.writeable:
        raise LoaderxValueError("out is read-only")
    if len(idxs):
        view.gather_rows(idxs, out.reshape(-1).view(np.uint8))
    return out


def _ragged_layout(nbytes: npt.NDArray[Any]) -> tuple[npt.NDArray[np.uint64], int]:
    """Where records of ``nbytes`` bytes go in one buffer, back to back: their byte offsets
    (uint64) and the buffer's size."""
    ends = np.cumsum(nbytes, dtype=np.uint64)
    total = int(ends[-1]) if len(ends) else 0
    ends -= nbytes.astype(np.uint64, copy=False)  # now the starts
    return ends, total


def _ragged_views(buf: npt.NDArray[np.uint8], offsets: npt.NDArray[np.uint64],
                 nbytes: npt.NDArray[Any], dtype: np.dtype[Any],
                 item_shape: tuple[int, ...]) -> list[npt.NDArray[Any]]:
    """The records laid out by :func:`_ragged_layout` in ``buf`` as ``(n_i, *item_shape)``
    arrays of ``dtype``: views of ``buf``, so they keep it (and whatever owns it) alive."""
    row = dtype.itemsize * int(np.prod(item_shape, dtype=np.int64))
    if row == 0:  # rows of no bytes: the row count is unknowable, as for ``pad``-free reads
        return [buf[o:o].view(dtype).reshape((0, *item_shape)) for o in offsets.tolist()]
    # Every record is whole rows, back to back: the buffer is viewed as rows once, and each
    # record is a slice of that (one slice a record; a view and a reshape each cost 3x more).
    total = int(offsets[-1] + nbytes[-1]) if len(offsets) else 0
    rows = buf[:total].view(dtype).reshape((total // row, *item_shape))
    first = (offsets // row).tolist()
    last = ((offsets + nbytes.astype(np.uint64, copy=False)) // row).tolist()
    return [rows[a:b] for a, b in zip(first, last, strict=True)]
