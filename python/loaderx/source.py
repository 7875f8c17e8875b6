"""The dense-source protocol: what a :class:`~loaderx.dataloader.DataLoader` stream provides.

A stream is anything whose records are fixed-shape arrays of one dtype, addressed ``0..len``,
that can write a batch of them straight into a caller's buffer. :class:`DenseDataset`, a dense
:class:`~loaderx.concat.ConcatDataset` and a dense :class:`~loaderx.subset.Subset` implement it;
the loader uses nothing else of a stream, so a new kind of view needs only these members:

* ``kind`` -- ``"dense"`` (a ragged view says ``"ragged"`` and is refused);
* ``dtype``, ``item_shape``, ``record_bytes`` -- what one record is (``record_bytes`` is
  ``dtype.itemsize * prod(item_shape)``);
* ``len(source)`` -- the number of records;
* ``gather_rows(idxs, dst, shards=None, rows=None)`` -- writes record ``idxs[i]`` (a uint64
  array, each below ``len``) into row ``i`` of ``dst`` (a writable, C-contiguous uint8 array of
  ``record_bytes``-byte rows), or into row ``rows[i]`` when ``rows`` (strictly increasing) is
  given; splits the work into at most ``shards`` parallel blocks; raises ``LoaderxIndexError``
  for an index out of range and ``CorruptStoreError`` for a record of another size, before
  writing anything;
* ``prefetch(idxs)`` and ``recently_cold`` -- start reading records into the page cache without
  waiting, and say whether the last read found records that were not cached (the loader reads
  ahead only then);
* ``view_digest`` -- ``""`` for a whole dataset, else a short digest of which records the view
  holds, so that a checkpoint taken on one view is refused on another.

Companion arrays (optional, any stream): a stream may add arrays of its own to every batch, as a
packed token stream adds segment ids and positions next to its tokens:

* ``companions(name, idxs) -> dict[str, array]`` -- called by the loader right after it
  gathered the stream's part of a batch into ``batch[name]`` (``idxs``: the uint64 record
  indices of this shard's rows, in row order; in a padded pass the padding rows' repeated
  records too), before the transform; the returned arrays are merged into the batch dict. It
  runs on the worker thread that builds the batch, in every path (threads, ``num_workers=0``,
  ``epoch()``, shards, after ``seek`` or ``load_state_dict``), so a pure function of ``idxs``
  keeps every loader promise. A name already in the batch (a stream, another companion, the
  mask) raises ``LoaderxValueError`` at that batch;
* ``companion_names(name) -> tuple[str, ...]`` -- the names ``companions`` will return for a
  stream called ``name``; when given, the loader refuses colliding names at construction (and
  ``epoch(pad=True)`` a ``mask_key`` among them).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["DenseSource", "is_dense_source"]


@runtime_checkable
class DenseSource(Protocol):
    """See the module documentation."""

    @property
    def kind(self) -> str: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    @property
    def item_shape(self) -> tuple[int, ...]: ...

    @property
    def record_bytes(self) -> int: ...

    @property
    def recently_cold(self) -> bool: ...

    @property
    def view_digest(self) -> str: ...

    def __len__(self) -> int: ...

    def gather_rows(self, idxs: npt.NDArray[np.uint64], dst: npt.NDArray[np.uint8],
                    shards: int | None = None,
                    rows: npt.NDArray[np.uint64] | None = None) -> None: ...

    def prefetch(self, idxs: Any) -> bool: ...


def is_dense_source(obj: object) -> bool:
    """Whether ``obj`` implements the protocol with dense records."""
    return isinstance(obj, DenseSource) and obj.kind == "dense"
