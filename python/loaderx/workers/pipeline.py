"""The consumer's side of the worker processes: which worker builds which step, batches back in
step order, errors and deaths reported, everything stopped and reaped.

The consumer keeps up to ``prefetch + workers`` steps of the current position handed out, each
to the worker with the fewest outstanding steps (at most a fair share of the window each, so a
``seek`` never queues more than one window of steps that are no longer wanted). There is no
thread: the workers build in the background, and ``next()`` hands out steps and reads replies.
It waits on every worker's socket, on every worker's process sentinel -- a worker that dies is
an error naming it and its step, never a hang -- and on a pipe through which ``close()`` from
another thread wakes it.

A reply's arrays are wrapped in place over the consumer's mapping of the worker's segments
(:mod:`loaderx.workers.layout`); the segments go back to the worker, riding on its next step,
once nothing sees the batch any more. Replies for steps a ``seek`` abandoned are dropped and
their segments given straight back.
"""

from __future__ import annotations

import collections
import mmap
import multiprocessing
import os
import pickle
import select
import signal
import socket
import threading
import time
import warnings
from typing import Any

import numpy as np

from loaderx._batch import Failure
from loaderx.errors import LoaderClosedError, RemoteTraceback, WorkerError
from loaderx.workers import channel, start, worker
from loaderx.workers.layout import Loan, Maps, decode

__all__ = ["ProcessPipeline"]

#: close() waits this long in all for the workers to leave on their own, then kills them.
_JOIN_SECONDS = 1.0


class _Worker:
    """One worker process as the consumer sees it."""

    def __init__(self, index: int, process: Any, sock: socket.socket) -> None:
        self.index = index
        self.process = process
        self.sock = sock
        self.reader = channel.Reader(sock)
        self.pending: collections.deque[tuple[int, int]] = collections.deque()
        # Segments whose batches the consumer dropped (appended by Loan.__del__, from any
        # thread: deque appends are atomic), sent back with the next step.
        self.returned: collections.deque[int] = collections.deque()
        self.maps: Maps = {}
        self.replied = False  # whether it sent anything: a death before that is at its start

    def give_back(self, idents: list[int]) -> None:
        self.returned.extend(idents)

    def take_returned(self) -> list[int]:
        out = []
        while self.returned:
            out.append(self.returned.popleft())
        return out


class ProcessPipeline:
    """The pipeline of ``worker_mode="process"``; the interface of the thread pipeline
    (``next``, ``seek``, ``stop``, ``step``, ``closed``) plus ``worker_pids``."""

    def __init__(self, streams: dict[str, Any], rows_of: Any, job: Any, mask_key: str | None,
                 start_step: int, workers: int, prefetch: int, readahead: int,
                 steps: int | None, start_method: str | None) -> None:
        self.steps = steps
        self.count = workers
        self.window = prefetch + workers
        self.share = -(-self.window // workers) + 1
        # Each worker keeps free segments for the steps it holds and two more.
        self.job = (streams, rows_of, job, mask_key, workers, self.share + 2, steps)
        self.transform = job.transform
        self.requested = start_method
        self.start_method: str | None = None
        self.readahead = readahead
        self.lock = threading.RLock()
        self.ready: dict[int, Any] = {}
        self.next_step = start_step
        self.claim = start_step
        self.prefetched_to = start_step
        self.generation = 0
        self.workers: list[_Worker] = []
        self.closed = False
        self.pid = os.getpid()
        self.wake_read, self.wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # Every worker's socket and process sentinel, and the wake-up pipe.
        self.poller = select.poll()
        self.poller.register(self.wake_read, select.POLLIN)

    @property
    def step(self) -> int:
        return self.next_step

    @property
    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self.workers]

    # -- consumer side -------------------------------------------------------------------------

    def next(self) -> Any:
        if self.pid != os.getpid():
            raise LoaderClosedError("this DataLoader was created in another process; its "
                                    "worker processes belong to that one -- create it here")
        with self.lock:
            if self.closed:
                raise LoaderClosedError("the DataLoader is closed")
            if self.steps is not None and self.next_step >= self.steps:
                raise StopIteration
            if not self.workers:
                self._start()
            self._top_up()
            while self.next_step not in self.ready:
                self._wait()
                self._top_up()
            step = self.next_step
            item = self.ready[step]
            del self.ready[step]
            self.next_step = step + 1
            self._top_up()
        if isinstance(item, Failure):
            self.stop()
            raise item.error
        return item

    def seek(self, step: int) -> None:
        with self.lock:
            self.generation += 1
            self.ready.clear()
            self.next_step = self.claim = self.prefetched_to = step

    def _start(self) -> None:
        method, payload = start.choose(self.requested, self.job, self.transform)
        context: Any = multiprocessing.get_context(method)
        if method == "forkserver":
            _preload_forkserver(context)
        forked = method == "fork"
        parent_ends: list[int] = [self.wake_read, self.wake_write]
        try:
            for index in range(self.count):
                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                parent_ends.append(mine.fileno())
                args = (theirs, self.job if forked else payload, forked,
                        list(parent_ends) if forked else [])
                process = context.Process(target=worker.main, args=args, daemon=True,
                                          name=f"loaderx-worker-{index}")
                try:
                    with warnings.catch_warnings():
                        # Python >= 3.12 warns on any fork of a process with native threads;
                        # start.choose forks only when no other Python thread runs.
                        warnings.filterwarnings("ignore", "This process .* is multi-threaded",
                                                DeprecationWarning)
                        process.start()
                finally:
                    theirs.close()
                self.workers.append(_Worker(index, process, mine))
                self.poller.register(mine.fileno(), select.POLLIN)
                self.poller.register(process.sentinel, select.POLLIN)
        except BaseException:
            self._shutdown()
            raise
        self.start_method = method

    def _top_up(self) -> None:
        """Hands out steps until the window of the current position is covered."""
        while (self.claim < self.next_step + self.window
               and (self.steps is None or self.claim < self.steps)):
            w = min(self.workers, key=lambda w: len(w.pending))
            if len(w.pending) >= self.share:
                return  # each worker has its share (stale steps of a seek count too)
            step = self.claim
            ahead = range(max(self.prefetched_to, step + 1), step + 1 + self.readahead)
            message = ("task", self.generation, step, ahead.start, ahead.stop,
                       w.take_returned())
            try:
                channel.send(w.sock, message)
            except OSError:
                self._died(w)
            self.prefetched_to = max(self.prefetched_to, ahead.stop)
            w.pending.append((self.generation, step))
            self.claim += 1

    def _wait(self) -> None:
        """Waits for a reply, a death or close(), and takes in what arrived."""
        ready = {fd for fd, _ in self.poller.poll()}
        if self.closed:
            raise LoaderClosedError("the DataLoader was closed while waiting")
        for w in list(self.workers):
            if w.sock.fileno() in ready:
                self._receive(w)
            if w.process.sentinel in ready:
                self._receive(w)  # what it sent before it died still counts
                self._died(w)

    def _receive(self, w: _Worker) -> None:
        try:
            frames = w.reader.poll()
        except channel.Closed:
            return  # the worker went away: its sentinel reports it
        for message, fds in frames:
            w.replied = True
            if message[0] == "batch":
                self._batch(w, message, fds)
            else:
                self._error(w, message)

    def _batch(self, w: _Worker, message: tuple[Any, ...], fds: list[int]) -> None:
        _, generation, step, skeleton, lent, fresh, retired = message
        for (ident, size), fd in zip(fresh, fds, strict=True):
            try:
                mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            array = np.frombuffer(mapping, dtype=np.uint8)
            w.maps[ident] = (array, array.ctypes.data)
        for ident in retired:
            w.maps.pop(ident, None)  # arrays over it keep the mapping until they go
        if w.pending:
            w.pending.popleft()
        if generation == self.generation and not self.closed:
            self.ready[step] = decode(skeleton, w.maps, Loan(w.give_back, lent))
        else:
            w.give_back(lent)

    def _error(self, w: _Worker, message: tuple[Any, ...]) -> None:
        _, generation, step, pickled, kind, text, trace = message
        error: BaseException | None = None
        if pickled is not None:
            try:
                error = pickle.loads(pickled)
            except Exception:  # a class the consumer cannot rebuild
                error = None
        if not isinstance(error, BaseException):
            error = WorkerError(
                f"loader worker {w.index} (pid {w.process.pid}) raised {kind}: {text} "
                f"{'while starting' if step < 0 else f'at step {step}'}; the exception could "
                "not be sent to this process (it does not pickle), its traceback is the cause")
        error.__cause__ = RemoteTraceback(trace)
        if step < 0:  # the worker could not start: nothing can be built
            self._shutdown()
            raise error
        if w.pending:
            w.pending.popleft()
        if generation == self.generation and not self.closed:
            self.ready[step] = Failure(error)

    def _died(self, w: _Worker) -> None:
        """Worker ``w`` is gone while the loader runs: stops the rest and raises."""
        w.process.join(0)
        code = w.process.exitcode
        if code is not None and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        current = [s for g, s in w.pending if g == self.generation]
        if not w.replied:
            where = (f"while starting, before it built a batch (with start method "
                     f"{self.start_method!r} a worker imports the main module again: a script "
                     "needs its `if __name__ == '__main__':` guard; the worker's own traceback, "
                     "if any, is on stderr)")
        elif current:
            where = f"while building step {current[0]}"
        else:
            where = f"while the loader was at step {self.next_step}"
        hint = (" (SIGKILL is often the kernel's out-of-memory killer: see `dmesg`; fewer "
                "workers or a smaller prefetch_size use less memory)" if code == -9 else "")
        error = WorkerError(f"loader worker {w.index} (pid {w.process.pid}) {how} {where}"
                            f"{hint}; the DataLoader is closed")
        self._shutdown()
        raise error

    # -- shutdown ------------------------------------------------------------------------------

    def stop(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            os.write(self.wake_write, b"x")  # a next() waiting on another thread returns
        except OSError:
            pass
        with self.lock:
            self._shutdown()

    def _shutdown(self) -> None:
        """Closes the sockets (each worker then leaves), reaps the workers, kills those that
        do not leave within the deadline. Only the process that started them does this."""
        self.closed = True
        self.ready.clear()
        workers, self.workers = self.workers, []
        if self.pid != os.getpid():
            return
        for w in workers:
            w.reader.close()
        deadline = time.monotonic() + _JOIN_SECONDS
        for w in workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
        for w in workers:
            if w.process.exitcode is None:
                w.process.kill()
                w.process.join()
            w.process.close()
        for fd in (self.wake_read, self.wake_write):
            try:
                os.close(fd)
            except OSError:
                pass
        self.wake_read = self.wake_write = -1


def _preload_forkserver(context: Any) -> None:
    """Has the fork server import NumPy and loaderx once, so that each worker forked from it
    starts with them imported -- unless the server already runs, or the application chose its
    own preload list."""
    try:
        from multiprocessing import forkserver

        server: Any = forkserver._forkserver  # private, but in every 3.x
        if server._forkserver_pid is None and server._preload_modules == ["__main__"]:
            context.set_forkserver_preload(["__main__", "numpy", "loaderx"])
    except AttributeError:
        return
