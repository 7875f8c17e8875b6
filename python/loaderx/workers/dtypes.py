"""How a dtype travels between a worker and the consumer: as its string when that names it
exactly (every plain numeric dtype: cheaper to send and to look up than a pickled dtype), else
as the dtype itself; both ends keep what they looked up."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["dtype_of", "dtype_spec"]

#: Dtypes by their strings, on both sides.
_DTYPES: dict[str, np.dtype[Any]] = {}

#: What each dtype travels as, by dtype (on the worker's side).
_SPECS: dict[np.dtype[Any], np.dtype[Any] | str] = {}


def dtype_spec(dtype: np.dtype[Any]) -> np.dtype[Any] | str:
    """``dtype`` as it travels: its string when that names it exactly."""
    if dtype.metadata is not None:  # equal, and so hashed alike, to the dtype without it
        return dtype
    spec = _SPECS.get(dtype)
    if spec is None:
        exact = dtype.fields is None and dtype_of(dtype.str) == dtype
        spec = _SPECS[dtype] = dtype.str if exact else dtype
    return spec


def dtype_of(spec: np.dtype[Any] | str) -> np.dtype[Any]:
    """The dtype that :func:`dtype_spec` made ``spec`` of."""
    if isinstance(spec, str):
        dtype = _DTYPES.get(spec)
        if dtype is None:
            dtype = _DTYPES[spec] = np.dtype(spec)
        return dtype
    return spec
