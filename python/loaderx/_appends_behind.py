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

import threading
from typing import Any


class AppendsBehind:
    """Appends to ``store`` (a :class:`loaderx.zrecord.Zrecord`) on a thread of its own."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._cond = threading.Condition()
        self._job: tuple[Any, Any] | None = None
        self._busy = False
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="loaderx-append", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._closed:
                    self._cond.wait()
                if self._job is None:
                    return
                job, self._job = self._job, None
            try:
                if self._error is None:
                    self._store.append(*job)
            except BaseException as e:  # handed to the converting thread, which raises it
                self._error = e
            finally:
                del job
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def submit(self, src: Any, offsets: Any) -> None:
        """Appends ``src`` (records at ``offsets``) once the previous append is done; raises
        that append's exception if it failed (and then appends nothing more)."""
        self.wait()
        with self._cond:
            self._job, self._busy = (src, offsets), True
            self._cond.notify_all()

    def wait(self) -> None:
        """Waits for the append under way; raises its exception if it failed."""
        with self._cond:
            while self._busy:
                self._cond.wait()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Stops the thread after the append under way (whose error is dropped: the caller is
        already failing, or has called :meth:`wait`)."""
        with self._cond:
            while self._busy:
                self._cond.wait()
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
