"""Batch buffers that return to a pool once nothing can see them any more.

A fresh multi-megabyte array costs a page fault per 4 KiB the first time it is written -- on a
2-core machine about as long as the gather that fills it. The loader therefore hands out arrays
whose memory comes from a small pool of preallocated buffers and goes back to the pool only when
the consumer has dropped every reference to it.

How "every reference" is tracked: each handed-out array is built with ``np.asarray`` over a
:class:`_Lease`, an object exposing the buffer through ``__array_interface__``. NumPy makes that
object the ``base`` of the array, and every view, slice or reshape of the array keeps the same
base (NumPy collapses view chains down to the first non-array owner). So the lease lives exactly
as long as some array can reach the memory; when the last one goes, the lease's ``__del__``
gives the buffer back. Memory a consumer can still see is never reused.

Dense streams take fixed-size buffers from a :class:`BufferPool`; ragged streams, whose batches
differ in size, take them from a :class:`GrowingPool`, and every record of a ragged batch is a
view of its batch's leased array, so the buffer returns only when the consumer has dropped the
last record of the batch.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

#: Byte alignment of the buffers handed out. Raw records sit in their chunk at offsets that are
#: multiples of their size, so with 64-byte-aligned rows source and destination are aligned alike
#: and the engine's copy takes ``memcpy``'s fastest path (see ``copy_bytes`` in the engine).
ALIGN = 64


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialized uint8 array of ``nbytes`` starting on an :data:`ALIGN`-byte boundary
    (NumPy's large arrays start 16 bytes into a page)."""
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    skip = -raw.__array_interface__["data"][0] % ALIGN
    return raw[skip:skip + nbytes]


class BufferPool:
    """Buffers of one fixed size; ``take`` returns an array over a recycled buffer when one is
    free and over a new one otherwise. At most ``keep`` free buffers are retained."""

    def __init__(self, nbytes: int, keep: int) -> None:
        self.nbytes = nbytes
        self.keep = keep
        self._free: list[tuple[np.ndarray, int]] = []
        self._lock = threading.Lock()
        self.allocated = 0  # buffers created, for tests and the benchmark
        self.closed = False

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """A leased ``shape``/``dtype`` array, and the raw uint8 buffer under it (to fill; do
        not keep it, or the buffer may be reused under you)."""
        with self._lock:
            item = self._free.pop() if self._free else None
        if item is None:
            buf = aligned_empty(self.nbytes)
            item = (buf, buf.__array_interface__["data"][0])
            self.allocated += 1
        return np.asarray(_Lease(self, item, shape, dtype.str)), item[0]

    def give(self, item: tuple[np.ndarray, int]) -> None:
        with self._lock:
            if not self.closed and len(self._free) < self.keep:
                self._free.append(item)

    def close(self) -> None:
        """Drops the free buffers; buffers still leased are freed when their arrays go."""
        with self._lock:
            self.closed = True
            self._free.clear()


class GrowingPool:
    """Buffers for batches of varying size (ragged streams): ``take(nbytes)`` returns a leased
    uint8 array of ``nbytes`` bytes over a free buffer at least that large, or over a new one.

    A new buffer gets a quarter more than asked for and never less than the largest made
    before (its ``capacity``), so capacities grow geometrically while batches grow and then
    settle on one size that fits the batches seen: after a few batches every request is
    served from the pool. Buffers smaller than the current capacity are dropped when they
    come back (and when a request finds none that fits), and at most ``keep`` free buffers are
    retained, so the pool holds at most ``keep`` buffers of the capacity."""

    #: The smallest buffer made, and the granularity of sizes (a page).
    GRAIN = 4096

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.capacity = 0
        self._free: list[tuple[np.ndarray, int]] = []
        self._lock = threading.Lock()
        self.allocated = 0  # buffers created, for tests and the benchmark
        self.closed = False

    def take(self, nbytes: int) -> np.ndarray:
        """A leased, writable uint8 array of ``nbytes`` bytes (fill it, then take views of
        it: every view keeps the lease)."""
        with self._lock:
            item = None
            for i, (buf, _) in enumerate(self._free):
                if len(buf) >= nbytes:
                    item = self._free.pop(i)
                    break
            if item is None:
                self._free.clear()  # all smaller than this request, so below the new capacity
                grain = self.GRAIN
                want = -(-(nbytes + nbytes // 4) // grain) * grain or grain
                self.capacity = max(self.capacity, want)
                self.allocated += 1
                size = self.capacity
        if item is None:
            buf = aligned_empty(size)
            item = (buf, buf.__array_interface__["data"][0])
        return np.asarray(_Lease(self, item, (nbytes,), "|u1"))

    def give(self, item: tuple[np.ndarray, int]) -> None:
        with self._lock:
            if (not self.closed and len(self._free) < self.keep
                    and len(item[0]) >= self.capacity):
                self._free.append(item)

    def close(self) -> None:
        """Drops the free buffers; buffers still leased are freed when their arrays go."""
        with self._lock:
            self.closed = True
            self._free.clear()


class _Lease:
    """Owner of one handed-out buffer (see the module documentation)."""

    __slots__ = ("_pool", "_item", "__array_interface__")

    def __init__(self, pool: BufferPool | GrowingPool, item: tuple[np.ndarray, int],
                 shape: tuple[int, ...], typestr: str) -> None:
        self._pool = pool
        self._item = item
        self.__array_interface__: dict[str, Any] = {
            "shape": shape, "typestr": typestr, "data": (item[1], False), "version": 3,
        }

    def __del__(self) -> None:
        self._pool.give(self._item)
