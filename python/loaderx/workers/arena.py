"""A worker process's shared memory: anonymous ``memfd`` segments, and a batch's place in one.

A segment is a ``memfd_create`` file mapped shared. It has no name in any file system, so
nothing of it can outlive the processes that map it: when the worker and the consumer are gone
-- closed, crashed or killed -- the kernel frees it. The worker sends each new segment's
descriptor to the consumer once; afterwards batches only name it.

A segment is *free* (the worker may write it), *in use* (the batch being built), or *lent*
(the consumer holds a batch in it, until it says the batch is gone). A segment the consumer gives
back is free only once nothing in the worker sees it either: a transform may keep a view of
its input for a later step (mixup against the previous batch, a memory bank, a cache of the
last batch), and such a segment is *held* until that view is gone -- as the thread loader's
buffers, by the reference count of the array that owns the mapping (every view's ``base``).
Sizes grow as
:class:`loaderx._views.recycle.GrowingPool`'s do: a quarter more than asked for and never less than
the largest made so far, so that after a few batches every batch fits a free segment; at most
``keep`` free segments are kept, smaller ones are retired first.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import numpy as np

from loaderx.errors import LoaderxValueError
from loaderx.workers.dtypes import dtype_spec
from loaderx.workers.mapping import Mapping

__all__ = ["Arena", "BatchMemory", "Segment"]

#: Offsets of the arrays in a segment are multiples of this (as the thread loader's buffers).
ALIGN = 64
#: Sizes are multiples of a page.
GRAIN = 4096


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class _Exposed:
    """A mapping as a NumPy array's owner."""

    __slots__ = ("__array_interface__", "_mapping")

    def __init__(self, mapping: Mapping) -> None:
        self._mapping = mapping
        self.__array_interface__ = {"shape": (mapping.size,), "typestr": "|u1",
                                    "data": (mapping.address, False), "version": 3}


class Segment:
    """One memfd segment, mapped read-write and shared. Its descriptor is kept only until the
    consumer has it (:meth:`sent`): a worker may hold many segments."""

    def __init__(self, ident: int, size: int) -> None:
        self.ident = ident
        self.size = size
        self.fd = os.memfd_create(f"loaderx-batch-{ident}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            mapping = Mapping(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.array: np.ndarray = np.asarray(_Exposed(mapping))
        self.address: int = mapping.address
        # Every view of the segment holds `array` (NumPy collapses view chains to it): its
        # count above this one means something in this process still sees the memory.
        self.idle_refs = 0
        self.idle_refs = self.refs()

    def refs(self) -> int:
        return sys.getrefcount(self.array)

    def seen(self) -> bool:
        """Whether an array (or a tensor, a memoryview) in this process still sees it."""
        return self.refs() > self.idle_refs

    def sent(self) -> None:
        """The consumer has the descriptor now (or never will need it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        self.sent()
        # The mapping goes with the last array over it.
        del self.array


class Arena:
    """The worker's segments: hands out free ones, tracks lent ones, retires extras."""

    def __init__(self, keep: int) -> None:
        self.keep = max(2, keep)
        self.free: list[Segment] = []
        self.lent: dict[int, Segment] = {}
        self.held: list[Segment] = []  # given back, but still seen here (see the module doc)
        self.capacity = 0
        self.next_ident = 0
        self.fresh: list[Segment] = []  # made since the last batch was sent: their fds go with it
        self.retired: list[int] = []    # dropped since the last batch was sent
        self.last_handed: tuple[list[Segment], list[int]] = ([], [])

    def take(self, nbytes: int) -> Segment:
        """A free segment of at least ``nbytes`` (a new one if none fits)."""
        if self.held:
            self._release_held()
        # The smallest that fits; of equal ones the last given back, whose pages the caches
        # are most likely to still hold (a batch of 3 MiB nearly fills a core's L2).
        best = None
        for k in range(len(self.free) - 1, -1, -1):
            size = self.free[k].size
            if size >= nbytes and (best is None or size < self.free[best].size):
                best = k
        if best is not None:
            return self.free.pop(best)
        want = -(-(nbytes + nbytes // 4) // GRAIN) * GRAIN or GRAIN
        self.capacity = max(self.capacity, want)
        # Free segments smaller than the new capacity would only be taken for smaller batches:
        # retire them, so the arena settles on one size.
        for small in [s for s in self.free if s.size < self.capacity]:
            self._retire(small)
        segment = Segment(self.next_ident, self.capacity)
        self.next_ident += 1
        self.fresh.append(segment)
        return segment

    def give(self, segment: Segment) -> None:
        """``segment`` is not the consumer's any more (built into but not sent, or given back):
        free, unless something here still sees it."""
        if segment.seen():
            self.held.append(segment)
            return
        self._free(segment)

    def _release_held(self) -> None:
        """Frees the held segments nothing sees any more (a reference count each)."""
        still = [s for s in self.held if s.seen()]
        if len(still) < len(self.held):
            released = [s for s in self.held if s not in still]
            self.held = still
            for segment in released:
                self._free(segment)

    def _free(self, segment: Segment) -> None:
        if segment.size < self.capacity or len(self.free) >= self.keep:
            self._retire(segment)
        else:
            self.free.append(segment)

    def lend(self, segment: Segment) -> None:
        self.lent[segment.ident] = segment

    def returned(self, idents: list[int]) -> None:
        """The consumer dropped every batch in these segments."""
        for ident in idents:
            segment = self.lent.pop(ident, None)
            if segment is not None:
                self.give(segment)

    def _retire(self, segment: Segment) -> None:
        if segment in self.free:
            self.free.remove(segment)
        if segment in self.fresh:  # never sent: the consumer does not know it
            self.fresh.remove(segment)
        else:
            self.retired.append(segment.ident)
        segment.close()

    def handed_over(self) -> tuple[list[tuple[int, int]], list[int], list[int]]:
        """What the next message must tell the consumer: the new segments (ident, size) and
        their fds, and the retired idents -- then forgotten."""
        fresh, retired = self.fresh, self.retired
        self.fresh, self.retired = [], []
        self.last_handed = (fresh, retired)
        return [(s.ident, s.size) for s in fresh], [s.fd for s in fresh], retired

    def sent(self) -> None:
        """The message of the last :meth:`handed_over` reached the consumer: the new
        segments' descriptors are closed here."""
        for segment in self.last_handed[0]:
            segment.sent()
        self.last_handed = ([], [])

    def not_handed_over(self) -> None:
        """The message of the last :meth:`handed_over` could not be sent: the next one tells
        the consumer instead."""
        fresh, retired = self.last_handed
        self.fresh, self.retired = fresh + self.fresh, retired + self.retired
        self.last_handed = ([], [])


class BatchMemory:
    """The :class:`loaderx._loader.batch.Memory` of one batch in a worker: every stream's part of
    the batch at an aligned offset of one segment. The dense arrays it makes are ``known``: by
    ``id``, the array and where it lies (a :meth:`loaderx.workers.layout.Ref.fields` tuple),
    so that a transform that returns them as they are costs no look at their addresses."""

    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        self.segment: Segment | None = None
        self.offsets: list[int] = []
        self.known: dict[int, tuple[np.ndarray, tuple[Any, ...]]] = {}

    def reserve(self, sizes: list[int]) -> None:
        offsets, end = [], 0
        for size in sizes:
            offsets.append(end)
            end = _aligned(end + size)
        self.offsets = offsets
        self.segment = self.arena.take(max(end, 1))

    def _view(self, i: int, nbytes: int) -> np.ndarray:
        if self.segment is None:
            raise LoaderxValueError("a batch's memory was used before it was reserved")
        start = self.offsets[i]
        view: np.ndarray = self.segment.array[start:start + nbytes]
        return view

    def dense(self, i: int, shape: tuple[int, ...], dtype: np.dtype[Any],
              rows: int) -> tuple[np.ndarray, np.ndarray]:
        nbytes = math.prod(shape) * dtype.itemsize
        raw = self._view(i, nbytes)
        out = np.ndarray(shape, dtype, buffer=raw)
        if nbytes and self.segment is not None:
            self.known[id(out)] = (out, (self.segment.ident, self.offsets[i], shape,
                                         out.strides, dtype_spec(dtype), False))
        return out, raw

    def ragged(self, i: int, nbytes: int) -> np.ndarray:
        return self._view(i, nbytes)
