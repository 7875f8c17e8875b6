"""The consumer's side of the worker processes: which worker builds which step, batches back in
step order, errors and deaths reported, everything stopped and reaped.

All talk with the workers happens on one thread of the consumer's process, the *I/O thread*
(``loaderx-process-io``), never on the consumer's: a signal handler (Ctrl-C) runs only on the
main thread, at any bytecode, and a frame half read or half written when it raised would
corrupt the stream for good. The consumer only waits on a condition for its step, as the
thread loader does, and gives a consumed step back if an interrupt lands after it took it.

The I/O thread keeps up to ``prefetch + workers`` steps of the consumer's position handed
out, each to the worker with the fewest outstanding steps (at most a fair share of the window
each, so a ``seek`` never queues more than one window of steps no longer wanted). It waits in
one ``poll`` on every worker's socket, every worker's process sentinel -- a worker that dies is
an error naming it and its step, never a hang -- and a pipe through which the consumer wakes it
(a step taken, a seek, close()).

A reply's arrays are wrapped in place over the consumer's mapping of the worker's segments
(:mod:`loaderx.workers.layout`); the segments go back to the worker, riding on its next step,
once nothing sees the batch any more. Replies for steps a ``seek`` abandoned are dropped and
their segments given straight back.
"""

from __future__ import annotations

import collections
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

from loaderx._batch import Failure
from loaderx._window import Window
from loaderx.errors import RemoteTraceback, WorkerError
from loaderx.workers import channel, start, worker
from loaderx.workers.layout import Loan, Maps, decode
from loaderx.workers.mapping import Mapping
from loaderx.workers.start import IO_THREAD

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
        self.dead: BaseException | None = None  # the error its death is reported as

    def give_back(self, idents: list[int]) -> None:
        self.returned.extend(idents)

    def take_returned(self) -> list[int]:
        out = []
        while self.returned:
            out.append(self.returned.popleft())
        return out


class ProcessPipeline(Window):
    """The pipeline of ``worker_mode="process"``; the interface of the thread pipeline
    (``next``, ``seek``, ``stop``, ``step``, ``closed``) plus ``worker_pids``."""

    forked_message = ("this DataLoader was created in another process; its worker processes "
                      "belong to that one -- create it here")

    def __init__(self, streams: dict[str, Any], rows_of: Any, job: Any, mask_key: str | None,
                 start_step: int, workers: int, prefetch: int, readahead: int,
                 steps: int | None, start_method: str | None) -> None:
        super().__init__(start_step, steps)
        self.count = workers
        self.window = prefetch + workers
        self.share = -(-self.window // workers) + 1
        # Each worker keeps free segments for the steps it holds and two more.
        self.job = (streams, rows_of, job, mask_key, workers, self.share + 2, steps)
        self.transform = job.transform
        self.requested = start_method
        self.start_method: str | None = None
        self.readahead = readahead
        self.io: threading.Thread | None = None
        self.fatal: BaseException | None = None  # raised to the consumer: nothing can be built
        self.workers: list[_Worker] = []
        self.wake_read, self.wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # Every worker's socket and process sentinel, and the wake-up pipe.
        self.poller = select.poll()
        self.poller.register(self.wake_read, select.POLLIN)

    @property
    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self.workers]

    # -- consumer side (the rest is the Window's) ----------------------------------------------

    def next(self) -> Any:
        try:
            return self.take()
        except BaseException as e:
            if e is self.fatal:
                self.stop()
            raise

    def _started(self) -> bool:
        return self.io is not None

    def _check(self) -> None:
        if self.fatal is not None:
            raise self.fatal

    def _moved(self) -> None:
        self._wake()  # the I/O thread hands out the steps the move brought into the window

    def _wake(self) -> None:
        try:
            os.write(self.wake_write, b"x")
        except OSError:  # full (the thread has wake-ups to read already) or closed
            pass

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
        self.io = threading.Thread(target=self._serve, name=IO_THREAD, daemon=True)
        self.io.start()

    # -- the I/O thread ------------------------------------------------------------------------

    def _serve(self) -> None:
        """The I/O thread: hands out steps, takes in replies, reports deaths, until closed."""
        try:
            while True:
                with self.cond:
                    if self.closed or self.fatal is not None:
                        return
                    self._top_up()
                ready = {fd for fd, _ in self.poller.poll()}
                with self.cond:
                    if self.closed:
                        return
                    if self.wake_read in ready:
                        _drain(self.wake_read)
                    self._take_in(ready)
                    # Only what a consumer waits for (take()): its step, or the end. A wake-up
                    # for anything else costs it a thread switch for nothing.
                    if self.next_step in self.ready or self.fatal is not None:
                        self.cond.notify_all()
        except BaseException as e:  # a bug here must not leave the consumer waiting forever
            with self.cond:
                if self.fatal is None:
                    self.fatal = e
                self.cond.notify_all()

    def _top_up(self) -> None:
        """Hands out steps until the window of the consumer's position is covered."""
        while (self.claim < self.next_step + self.window
               and (self.steps is None or self.claim < self.steps)):
            live = [w for w in self.workers if w.dead is None]
            if not live:
                return
            w = min(live, key=lambda w: len(w.pending))
            if len(w.pending) >= self.share:
                return  # each worker has its share (stale steps of a seek count too)
            step = self.claim
            ahead = self.steps_ahead(step, self.readahead)
            message = ("task", self.generation, step, ahead.start, ahead.stop,
                       w.take_returned())
            try:
                channel.send(w.sock, message)
            except OSError:
                w.process.join(_JOIN_SECONDS)  # its end closed: it is exiting
                self._died(w)
                continue
            w.pending.append((self.generation, step))
            self.claim += 1

    def _take_in(self, ready: set[int]) -> None:
        """Files what the workers whose sockets or sentinels are in ``ready`` sent."""
        for w in list(self.workers):
            if w.dead is not None:
                continue
            if w.sock.fileno() in ready:
                self._receive(w)
            if w.process.sentinel in ready:
                self._receive(w)  # what it sent before it died still counts
                self._died(w)
        if self.workers and all(w.dead is not None for w in self.workers) \
                and self.next_step not in self.ready and self.fatal is None:
            self.fatal = next(w.dead for w in self.workers if w.dead is not None)

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
                w.maps[ident] = Mapping(fd, size)  # keeps no descriptor
            finally:
                os.close(fd)
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
            self.fatal = error
            return
        if w.pending:
            w.pending.popleft()
        if generation == self.generation and not self.closed:
            self.ready[step] = Failure(error)

    def _died(self, w: _Worker) -> None:
        """Worker ``w`` is gone while the loader runs: its error is filed at the step it held
        (or, at its start or while idle, raised to the consumer's next wait)."""
        # Its sentinel closes as it exits, a moment before its status can be read.
        w.process.join(_JOIN_SECONDS)
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
        w.dead = error
        for fd in (w.sock.fileno(), w.process.sentinel):
            try:
                self.poller.unregister(fd)
            except KeyError:
                pass
        if current and w.replied:
            # Delivered at its step, after the steps before it (other workers build those),
            # as a transform's exception would be.
            self.ready.setdefault(current[0], Failure(error))
        elif self.fatal is None:
            self.fatal = error

    # -- shutdown ------------------------------------------------------------------------------

    def stop(self) -> None:
        if self.closed:
            return
        if self.pid != os.getpid():
            # A forked child closing its copy: the workers, the pipe and the lock are the
            # parent's; touching them would disturb the parent's loader.
            self.closed = True
            return
        with self.cond:
            if self.closed:
                return
            self.closed = True
            self.ready.clear()
            self._wake()
            self.cond.notify_all()
        io = self.io
        if io is not None and io is not threading.current_thread():
            io.join(_JOIN_SECONDS)
        self._shutdown()

    def _shutdown(self) -> None:
        """Closes the sockets (each worker then leaves), reaps the workers, kills those that
        do not leave within the deadline. Only the process that started them does this."""
        self.closed = True
        self.ready.clear()
        workers, self.workers = self.workers, []
        if self.pid != os.getpid() or not workers:
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


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except OSError:  # empty (non-blocking) or closed
        return


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
