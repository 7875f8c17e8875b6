"""Batch buffers that return to a pool once nothing can see them any more.

A fresh multi-megabyte array costs a page fault per 4 KiB the first time it is written -- on a
2-core machine about as long as the gather that fills it. The loader therefore hands out arrays
whose memory comes from a small pool of preallocated buffers and goes back to the pool only when
the consumer has dropped every reference to it.

How "every reference" is tracked: every array handed out is a view of a buffer the pool
allocated, and NumPy makes the array that owns the memory the ``base`` of every view, slice or
reshape of it (view chains collapse to the owner), so each array that can reach the memory -- and
each memoryview, torch tensor or other export of one, which holds the array -- holds a reference
to the owner. The pool keeps the owner's reference count as it was when nothing else held it; a
buffer whose count is back at that value is seen by nobody and is handed out again. Memory a
consumer can still see is never reused. (Counting references costs a tenth of a microsecond; an
owner object with a ``__del__`` behind ``__array_interface__`` cost about 2.5 µs a batch.)

Dense streams take fixed-size buffers from a :class:`BufferPool`; ragged streams, whose batches
differ in size, take them from a :class:`GrowingPool`, and every record of a ragged batch is a
view of its batch's leased array, so the buffer returns only when the consumer has dropped the
last record of the batch.

Free-threaded interpreters (3.13t, 3.14t) count an object's references in two fields: one its
creating thread updates alone, one every other thread updates atomically (biased reference
counting), and ``sys.getrefcount`` adds the two with two separate loads. A reference moving
from one field to the other between those loads (the creating thread takes a view of an array
another thread then drops) could read one short -- a buffer in use seen as free. So there the
owner is made on a short-lived helper thread that drops its own references while the pool holds
one: CPython then *merges* the counts for good (no owning thread; every count change is one
atomic update of one field), and the count the pool reads is exact. What remains is that
CPython defers a release by another thread of an object whose count sits in its creator's
field until the creator runs Python again (the consumer dropping a batch a worker built): a
buffer may look busy a little longer -- never free too early -- so a few more buffers rotate
(the pool still follows at most ``2 * keep``).
"""

from __future__ import annotations

import sys
import sysconfig
import threading
from collections.abc import Callable
from typing import TypeVar

import numpy as np

_T = TypeVar("_T")

#: Whether reference counts are biased (free-threaded build): see the module documentation.
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))

#: Byte alignment of the buffers handed out. Raw records sit in their chunk at offsets that are
#: multiples of their size, so with 64-byte-aligned rows source and destination are aligned alike
#: and the engine's copy takes ``memcpy``'s fastest path (see ``copy_bytes`` in the engine).
ALIGN = 64


def aligned_empty(nbytes: int, *, merged: bool = False) -> np.ndarray:
    """An uninitialized uint8 array of ``nbytes`` starting on an :data:`ALIGN`-byte boundary
    (NumPy's large arrays start 16 bytes into a page); with ``merged``, its owner's reference
    count is merged on a free-threaded build (see the module documentation)."""
    def make() -> np.ndarray:
        return np.empty(nbytes + ALIGN, dtype=np.uint8)

    raw = _merged(make) if merged and FREE_THREADED else make()
    skip = -raw.__array_interface__["data"][0] % ALIGN
    return raw[skip:skip + nbytes]


def _merged(make: Callable[[], _T]) -> _T:
    """``make()``, made on a helper thread that drops its references only after this thread
    holds one: CPython merges the object's two reference counts then (free-threaded builds).
    Where no thread can start (interpreter shutdown), ``make()`` on this thread."""
    box: list[_T] = []
    made, taken = threading.Event(), threading.Event()

    def helper() -> None:
        try:
            box.append(make())
        finally:
            made.set()
        taken.wait()
        box.clear()  # the helper's last reference: the counts merge (this thread holds one)

    thread = threading.Thread(target=helper, name="loaderx-buffer", daemon=True)
    try:
        thread.start()
    except RuntimeError:
        return make()
    made.wait()
    if not box:  # make() raised (MemoryError): raise it here
        taken.set()
        thread.join()
        return make()
    result = box[0]
    taken.set()
    thread.join()
    return result


class _Buffer:
    """One buffer a pool made: the array that owns the memory, the aligned uint8 window of it
    that is handed out, and the owner's reference count while nobody else holds it."""

    __slots__ = ("owner", "view", "idle_refs")

    def __init__(self, nbytes: int, followed: bool = True) -> None:
        # Only a buffer the pool follows has its count read from other threads.
        self.view = aligned_empty(nbytes, merged=followed)
        self.owner = self.view.base if self.view.base is not None else self.view
        self.idle_refs = 0
        # Counted by the same call `free` makes, so that its own temporaries count alike.
        self.idle_refs = self.refs()

    def refs(self) -> int:
        return sys.getrefcount(self.owner)

    def free(self) -> bool:
        return self.refs() == self.idle_refs


class BufferPool:
    """Buffers of one fixed size; ``take`` returns an array over a buffer nobody sees any more
    when there is one and over a new one otherwise. The pool follows at most ``2 * keep``
    buffers, seen or not (so the consumer's batch and the ones in flight all come back); a
    buffer made while as many are in use is the consumer's to drop."""

    def __init__(self, nbytes: int, keep: int) -> None:
        self.nbytes = nbytes
        self.keep = keep
        self._buffers: list[_Buffer] = []
        self._lock = threading.Lock()
        self.allocated = 0  # buffers created, for tests and the benchmark
        self.closed = False

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """A ``shape``/``dtype`` array, and the raw uint8 buffer under it (to fill; do not keep
        it, or the buffer may be reused under you)."""
        with self._lock:  # the array is made under the lock: no other taker sees it free
            for b in self._buffers:
                if b.free():
                    return np.ndarray(shape, dtype, b.view), b.view
            follow = not self.closed and len(self._buffers) < 2 * self.keep
            b = _Buffer(self.nbytes, follow)
            self.allocated += 1
            if follow:
                self._buffers.append(b)
            return np.ndarray(shape, dtype, b.view), b.view

    def close(self) -> None:
        """Drops the pool's buffers; those still in use are freed when their arrays go."""
        with self._lock:
            self.closed = True
            self._buffers.clear()


class GrowingPool:
    """Buffers for batches of varying size (ragged streams): ``take(nbytes)`` returns a uint8
    array of ``nbytes`` bytes over a buffer nobody sees any more that is at least that large,
    or over a new one.

    A new buffer gets a quarter more than asked for and never less than the largest made
    before (its ``capacity``), so capacities grow geometrically while batches grow and then
    settle on one size that fits the batches seen: after a few batches every request is
    served from the pool. Buffers below the current capacity are dropped once nobody sees
    them, and the pool follows at most ``2 * keep`` buffers, seen or not, so it holds at most
    that many of the capacity."""

    #: The smallest buffer made, and the granularity of sizes (a page).
    GRAIN = 4096

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.capacity = 0
        self._buffers: list[_Buffer] = []
        self._lock = threading.Lock()
        self.allocated = 0  # buffers created, for tests and the benchmark
        self.closed = False

    def take(self, nbytes: int) -> np.ndarray:
        """A writable uint8 array of ``nbytes`` bytes (fill it, then take views of it: every
        view keeps the buffer from reuse)."""
        with self._lock:
            fits = max(nbytes, self.capacity)  # a buffer below the capacity is outgrown
            found = next((b for b in self._buffers if len(b.view) >= fits and b.free()), None)
            if found is None:
                grain = self.GRAIN
                want = -(-(nbytes + nbytes // 4) // grain) * grain or grain
                self.capacity = max(self.capacity, want)
                self.allocated += 1
            # Outgrown buffers go once nobody sees them; a new one takes a place left.
            self._buffers = [b for b in self._buffers
                             if len(b.view) >= self.capacity or not b.free()]
            if found is None:
                follow = not self.closed and len(self._buffers) < 2 * self.keep
                found = _Buffer(self.capacity, follow)
                if follow:
                    self._buffers.append(found)
            return found.view[:nbytes]

    def close(self) -> None:
        """Drops the pool's buffers; those still in use are freed when their arrays go."""
        with self._lock:
            self.closed = True
            self._buffers.clear()


