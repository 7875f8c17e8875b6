"""Argument conversion shared by the Python API: indices, offsets and byte views.

Everything the native module receives has been through here, so it only ever sees
C-contiguous buffers of the right element type.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loaderx.errors import LoaderxIndexError, LoaderxValueError

_U64 = np.dtype(np.uint64)


def _as_u64(values: Any, error: type[Exception], not_int: str, negative: str) -> np.ndarray:
    """``values`` as a C-contiguous 1-D uint64 array. ``not_int`` and ``negative`` are the
    messages (formatted with ``dtype`` and ``value``) of the ``error`` raised otherwise."""
    if (isinstance(values, np.ndarray) and values.dtype == _U64 and values.ndim == 1
            and values.flags.c_contiguous):
        return values  # the hot path of a loader: nothing to check or convert
    if isinstance(values, (bool, np.bool_)):
        raise error(not_int.format(dtype="bool"))
    arr = np.asarray(values).reshape(-1)
    if arr.size == 0:
        return np.empty(0, dtype=np.uint64)
    if arr.dtype.kind not in "iu":
        raise error(not_int.format(dtype=arr.dtype))
    if arr.dtype.kind == "i" and arr.min() < 0:
        raise error(negative.format(value=int(arr.min())))
    return np.ascontiguousarray(arr, dtype=np.uint64)


def as_indices(idxs: Any) -> np.ndarray:
    """Record indices as a C-contiguous uint64 array.

    Accepts an int, a sequence of ints or an integer array. Negative, boolean and
    non-integer indices raise :class:`~loaderx.errors.LoaderxIndexError`.
    """
    return _as_u64(
        idxs,
        LoaderxIndexError,
        "record indices must be integers, got dtype {dtype}",
        "record index {value} is negative",
    )


def as_offsets(offsets: Any, what: str = "offsets") -> np.ndarray:
    """Byte offsets as a C-contiguous uint64 array; negative or non-integer ones are refused."""
    return _as_u64(
        offsets,
        LoaderxValueError,
        what + " must be integers, got dtype {dtype}",
        what + " must not be negative, got {value}",
    )


def source_bytes(src: Any, what: str = "src") -> Any:
    """A read-only byte view of ``src`` (bytes, bytearray, memoryview or a C-contiguous array
    of any dtype), without copying."""
    if isinstance(src, np.ndarray):
        if not src.flags.c_contiguous:
            raise LoaderxValueError(f"{what} must be C-contiguous (use np.ascontiguousarray)")
        return src.reshape(-1).view(np.uint8)
    try:
        view = memoryview(src)
    except TypeError:
        raise LoaderxValueError(
            f"{what} must be bytes-like or a NumPy array, got {type(src).__name__}"
        ) from None
    if not view.c_contiguous:
        raise LoaderxValueError(f"{what} must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def destination_bytes(dst: Any) -> np.ndarray:
    """A writable byte view of ``dst``, a C-contiguous, writable array of any dtype."""
    if not isinstance(dst, np.ndarray):
        try:
            dst = np.frombuffer(memoryview(dst), dtype=np.uint8)
        except TypeError:
            raise LoaderxValueError(
                f"destination must be a writable NumPy array, got {type(dst).__name__}"
            ) from None
    if not dst.flags.c_contiguous:
        raise LoaderxValueError("destination must be C-contiguous")
    if not dst.flags.writeable:
        raise LoaderxValueError("destination is read-only")
    return dst.reshape(-1).view(np.uint8)
