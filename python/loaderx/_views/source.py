"""The implementation behind :mod:`loaderx.source`, the public module, whose documentation
says what this does and why."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["DenseSource", "RaggedSource", "is_dense_source", "is_ragged_source"]


class _Source(Protocol):
    """What both kinds of stream have (see the module documentation)."""

    @property
    def kind(self) -> str: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    @property
    def item_shape(self) -> tuple[int, ...]: ...

    @property
    def recently_cold(self) -> bool: ...

    @property
    def view_digest(self) -> str: ...

    def __len__(self) -> int: ...

    def prefetch(self, idxs: Any) -> bool: ...


@runtime_checkable
class DenseSource(_Source, Protocol):
    """See the module documentation."""

    @property
    def record_bytes(self) -> int: ...

    def gather_rows(self, idxs: npt.NDArray[np.uint64], dst: npt.NDArray[np.uint8],
                    shards: int | None = None,
                    rows: npt.NDArray[np.uint64] | None = None) -> None: ...


def is_dense_source(obj: object) -> bool:
    """Whether ``obj`` implements the protocol with dense records."""
    return isinstance(obj, DenseSource) and obj.kind == "dense"


@runtime_checkable
class RaggedSource(_Source, Protocol):
    """See the module documentation."""

    def record_nbytes(self, idxs: npt.NDArray[np.uint64]) -> npt.NDArray[Any]: ...

    def gather_at(self, idxs: npt.NDArray[np.uint64], dst: npt.NDArray[np.uint8],
                  offsets: npt.NDArray[np.uint64]) -> None: ...


def is_ragged_source(obj: object) -> bool:
    """Whether ``obj`` implements the protocol with ragged records."""
    return isinstance(obj, RaggedSource) and obj.kind == "ragged"
