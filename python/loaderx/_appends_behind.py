"""One thread that runs a conversion's appends one chunk behind its reading.

A converter reads or packs chunk ``k + 1`` (a memory map's pages, a strided array's copy,
``from_iterator``'s concatenation) while the engine compresses and writes chunk ``k`` with the
GIL released. At most two chunks are in flight: the one being appended and the one being read;
:meth:`AppendsBehind.submit` waits for the append before it hands over the next chunk.

An append that fails is re-raised, as the very exception object (its type and traceback kept),
by the next :meth:`~AppendsBehind.submit` or by :meth:`~AppendsBehind.wait`; later chunks are
not appended. :meth:`~AppendsBehind.close` stops the thread once the append under way has
returned, so a conversion that fails in its source can undo what was appended without racing it.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Any

#: The append thread's name (the executor would number it), as tools and tracebacks show it.
THREAD_NAME = "loaderx-append"


def _name_thread() -> None:
    threading.current_thread().name = THREAD_NAME


class AppendsBehind:
    """Appends to ``store`` (a :class:`loaderx.zrecord.Zrecord`) on a thread of its own: a
    one-thread executor and the future of the append under way (once done, the executor drops
    its reference to the chunk)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._pool = cf.ThreadPoolExecutor(1, initializer=_name_thread)
        self._pending: cf.Future[None] | None = None

    def submit(self, src: Any, offsets: Any) -> None:
        """Appends ``src`` (records at ``offsets``) once the previous append is done; raises
        that append's exception if it failed (and then appends nothing more)."""
        self.wait()
        self._pending = self._pool.submit(self._store.append, src, offsets)

    def wait(self) -> None:
        """Waits for the append under way; raises its exception if it failed."""
        if self._pending is not None:
            self._pending.result()

    def close(self) -> None:
        """Stops the thread after the append under way (whose error is dropped: the caller is
        already failing, or has called :meth:`wait`)."""
        self._pool.shutdown(wait=True)
