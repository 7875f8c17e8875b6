"""Argument conversion shared by the Python API: indices, offsets and byte views.

Everything the native module receives has been through here, so it only ever sees
C-contiguous buffers of the right element type.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loaderx.errors import ZrecordIndexError, ZrecordValueError

_U64 = np.dtype(np.uint64)


def as_indices(idxs: Any) -> np.ndarray:
    """Record indices as a C-contiguous uint64 array.

    Accepts an int, a sequence of ints or an integer array. Negative, boolean and
    non-integer indices raise :class:`~loaderx.errors.ZrecordIndexError`.
    """
    if isinstance(idxs, np.ndarray) and idxs.dtype == _U64 and idxs.ndim == 1 and idxs.flags.c_contiguous:
        return idxs  # the hot path of a loader: nothing to check or convert
    if isinstance(idxs, (bool, np.bool_)):
        raise ZrecordIndexError(f"record indices must be integers, got {idxs!r}")
    if isinstance(idxs, (int, np.integer)):
        if idxs < 0:
            raise ZrecordIndexError(f"record index {idxs} is negative")
        return np.array([idxs], dtype=np.uint64)
    arr = idxs if isinstance(idxs, np.ndarray) else np.asarray(idxs)
    if arr.size == 0:
        return np.empty(0, dtype=np.uint64)
    if arr.dtype.kind not in "iu":
        raise ZrecordIndexError(
            f"record indices must be integers, got an array of dtype {arr.dtype}"
        )
    arr = arr.reshape(-1)
    if arr.dtype.kind == "i":
        if arr.min() < 0:
            raise ZrecordIndexError(f"record index {int(arr.min())} is negative")
    return np.ascontiguousarray(arr, dtype=np.uint64)


def as_offsets(offsets: Any, what: str = "offsets") -> np.ndarray:
    """Byte offsets as a C-contiguous uint64 array; negative or non-integer ones are refused."""
    if isinstance(offsets, np.ndarray) and offsets.dtype == _U64 and offsets.ndim == 1 and offsets.flags.c_contiguous:
        return offsets
    arr = offsets if isinstance(offsets, np.ndarray) else np.asarray(offsets)
    if arr.size == 0:
        return np.empty(0, dtype=np.uint64)
    if arr.dtype.kind not in "iu":
        raise ZrecordValueError(f"{what} must be integers, got dtype {arr.dtype}")
    arr = arr.reshape(-1)
    if arr.dtype.kind == "i" and arr.min() < 0:
        raise ZrecordValueError(f"{what} must not be negative, got {int(arr.min())}")
    return np.ascontiguousarray(arr, dtype=np.uint64)


def source_bytes(src: Any, what: str = "src") -> Any:
    """A read-only byte view of ``src`` (bytes, bytearray, memoryview or a C-contiguous array
    of any dtype), without copying."""
    if isinstance(src, np.ndarray):
        if not src.flags.c_contiguous:
            raise ZrecordValueError(f"{what} must be C-contiguous (use np.ascontiguousarray)")
        return src.reshape(-1).view(np.uint8)
    try:
        view = memoryview(src)
    except TypeError:
        raise ZrecordValueError(
            f"{what} must be bytes-like or a NumPy array, got {type(src).__name__}"
        ) from None
    if not view.c_contiguous:
        raise ZrecordValueError(f"{what} must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def destination_bytes(dst: Any) -> np.ndarray:
    """A writable byte view of ``dst``, a C-contiguous, writable array of any dtype."""
    if not isinstance(dst, np.ndarray):
        try:
            dst = np.frombuffer(memoryview(dst), dtype=np.uint8)
        except TypeError:
            raise ZrecordValueError(
                f"destination must be a writable NumPy array, got {type(dst).__name__}"
            ) from None
    if not dst.flags.c_contiguous:
        raise ZrecordValueError("destination must be C-contiguous")
    if not dst.flags.writeable:
        raise ZrecordValueError("destination is read-only")
    return dst.reshape(-1).view(np.uint8)
