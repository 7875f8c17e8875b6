"""Worker processes kept between the finite passes of one DataLoader.

Starting worker processes is the slow part of a pass that uses them: a fresh worker forks,
unpickles the streams and the transform, opens the stores, and a forkserver or spawn worker
first imports what the transform needs (torch, torchvision: a second or more). An evaluation
loop calls ``loader.epoch()`` again and again with the same streams and transform, so a pass
that ran to its end leaves its workers here, idle, and the loader's next pass sends them its
own job instead of starting new ones (see ``ProcessPipeline.finish``).

Only what is safe to reuse is parked: workers that received their job pickled (a forked
worker inherited its job, which may not pickle, so it is never parked), every one of them
alive, none holding a step. A worker that died while parked does not answer the next pass's
job, which then starts a fresh set (``pipeline._all_ready``). Closing the loader, dropping it,
or a second set arriving while one waits reaps them: at most one set per loader is ever kept.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Parking"]


class Parking:
    """At most one idle set of worker processes, keyed by the start method that made them.

    ``reap`` ends a set (closes its sockets, joins, kills what does not leave); it is called
    outside the lock."""

    def __init__(self, reap: Callable[[list[Any]], None]) -> None:
        self._reap = reap
        self._lock = threading.Lock()
        self._parked: tuple[str, list[Any]] | None = None
        self._closed = False
        self._pid = os.getpid()  # a forked child's copy holds the parent's workers: never used

    def put(self, method: str, workers: list[Any]) -> bool:
        """Keeps ``workers`` for the next pass; False (the caller reaps them) once closed, in
        another process, or when a set waits already."""
        with self._lock:
            if self._closed or self._pid != os.getpid() or self._parked is not None:
                return False
            self._parked = (method, workers)
            return True

    def take(self, method: str, count: int) -> list[Any] | None:
        """The parked set if it was made by ``method`` with ``count`` workers; None otherwise
        (a set that does not fit is reaped)."""
        with self._lock:
            parked, self._parked = self._parked, None
            if parked is None or self._pid != os.getpid():
                return None
        made_by, workers = parked
        if made_by == method and len(workers) == count:
            return workers
        self._reap(workers)
        return None

    def close(self) -> None:
        """Reaps the parked set, if any; nothing is parked afterwards."""
        with self._lock:
            self._closed = True
            parked, self._parked = self._parked, None
        if parked is not None and self._pid == os.getpid():
            self._reap(parked[1])

    @property
    def parked_pids(self) -> list[int]:
        """The pids of the parked workers (none when nothing waits)."""
        with self._lock:
            return [] if self._parked is None else [w.process.pid for w in self._parked[1]]
