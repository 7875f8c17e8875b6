"""The consumer's side of the worker processes: which worker builds which step, batches back in
step order, errors and deaths reported, everything stopped and reaped.

There is no thread of the loader's own in the consumer's process: the consumer hands out steps
as it takes its own (:meth:`ProcessPipeline._moved`), and reads the workers' replies while it
waits for its step (:meth:`ProcessPipeline._wait`), in one ``epoll`` wait on every worker's
socket, every worker's process sentinel -- a worker that dies is an error naming it and its
step, never a hang -- and a pipe through which ``close()`` from another thread wakes it. A
thread in between would cost each batch two thread hand-offs, which on a machine whose cores
the workers keep busy is a sixth of the throughput.

Reading on the consumer's thread means reading where a signal handler (Ctrl-C) may raise, at
any call or backward jump. So every change of state made for a reply or a step handed out is
*committed* by statements that call nothing, after everything that may be interrupted was
done, and what was done before the commit is redone -- harmlessly -- if it never came:
:class:`loaderx.workers.channel.Reader` keeps every byte read until its frame is committed, a
batch's :class:`Loan` gives nothing back unless the commit filed it, descriptors are
closed only after it, and a step's message records that it went out before the send
(``_Worker.outbox``), so that an interrupt after the send does not send it twice.

Several threads may consume one loader: one of them reads at a time (``pumper``), the others
wait on the condition.

A reply's arrays are wrapped in place over the consumer's mapping of the worker's segments
(:mod:`loaderx.workers.layout`); the segments go back to the worker, riding on its next step,
once nothing sees the batch any more. Replies for steps a ``seek`` abandoned are dropped and
their segments given straight back.
"""

from __future__ import annotations

import collections
import functools
import itertools
import multiprocessing
import multiprocessing.process
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from loaderx._loader.batch import Failure
from loaderx._loader.stats import Collector, Recorder
from loaderx._loader.window import Window
from loaderx.errors import LoaderClosedError, RemoteTraceback, WorkerError
from loaderx.workers import channel, server_preload, start, worker
from loaderx.workers.layout import Loan, Maps, decode, decode_flat
from loaderx.workers.mapping import Mapping
from loaderx.workers.parking import Parking

__all__ = ["ProcessPipeline", "parking"]

#: close() waits this long in all for the workers to leave on their own, then kills them.
_JOIN_SECONDS = 1.0

#: How long workers taken over from a finished pass may take to answer their new job (they
#: unpickle it and open its streams: milliseconds) before a fresh set starts instead.
_READY_SECONDS = 10.0
#: The steps to read ahead when readahead is off.
_NOTHING = range(0)

#: The consumer folds the timings replies brought once this many wait (see _fold_arrivals).
_FOLD_ARRIVALS = 32
_ns = time.perf_counter_ns

#: Every worker process this process started (weakly: a reaped worker goes from here too).
_started: weakref.WeakSet[Any] = weakref.WeakSet()


def _forget_the_parents_workers() -> None:
    """In a child made by ``os.fork()`` -- an asynchronous checkpoint writer, ``pty.fork``, a
    daemonising helper -- rather than by multiprocessing: the child inherits multiprocessing's
    set of the parent's children, and multiprocessing's exit hook, which runs when the child
    exits normally, SIGTERMs each daemonic one of them: the parent's workers. They are not the
    child's; it forgets them. (multiprocessing clears the set itself only in the children it
    starts. The set is private, but the same in every 3.x; without it nothing is done.)"""
    children = getattr(multiprocessing.process, "_children", None)
    if isinstance(children, set) and _started:
        children.difference_update(list(_started))
    _started.clear()


os.register_at_fork(after_in_child=_forget_the_parents_workers)
#: Runs an iterator to its end in C (no Python code runs, so no signal handler either).
_exhaust: Callable[[Iterable[Any]], object] = functools.partial(collections.deque,
                                                                maxlen=0)


class _Worker:
    """One worker process as the consumer sees it."""

    def __init__(self, index: int, process: Any, sock: socket.socket) -> None:
        self.index = index
        self.process = process
        self.sock = sock
        self.fd, self.sentinel = sock.fileno(), process.sentinel  # what epoll reports
        self.reader = channel.Reader(sock)
        # (generation, step) of the steps it was sent and has not answered, oldest first.
        self.pending: list[tuple[int, int]] = []
        # Segments to send back with the next step: those of replies dropped unseen, and those
        # of the loans in `loans` whose weak references are in `dropped` -- appended, by the
        # references' callback, from whichever thread let go of the batch's last array.
        self.returned: list[int] = []
        # By id of the weak reference (a dead one cannot be hashed), which the entry keeps.
        self.loans: dict[int, tuple[weakref.ref[Loan], list[int]]] = {}
        self.dropped: list[weakref.ref[Loan]] = []
        # (generation, step, entries of `returned`, entries of `dropped`, those entries) of a
        # step sent but not yet recorded: set just before the send, so that an interrupt right
        # after it is recorded, not resent.
        self.outbox: tuple[int, int, int, int, list[weakref.ref[Loan]]] | None = None
        self.maps: Maps = {}
        self.replied = False  # whether it sent anything: a death before that is at its start
        self.dead: BaseException | None = None  # the error its death is reported as

    def given_back(self) -> tuple[list[int], int, list[weakref.ref[Loan]]]:
        """What goes back with the next step: the segments, how many of them are in
        ``returned``, and the ended loans the others come from."""
        returned = self.returned[:]
        direct = len(returned)
        dropped = self.dropped[:]
        loans = self.loans
        for ref in dropped:
            filed = loans.get(id(ref))  # a loan never filed (interrupted) has none
            if filed is not None:
                returned += filed[1]
        return returned, direct, dropped

    def settle(self) -> None:
        """Records the step sent last (after an interrupted send, on the next call) as sent.
        The record calls nothing, so it cannot be interrupted half way."""
        if self.outbox is None:
            return
        generation, step, returned, count, dropped = self.outbox
        # The loans given back are forgotten by the commit's one C call (a loop could be cut
        # short by an interrupt, leaving stale entries behind).
        forget = map(self.loans.pop, [id(ref) for ref in dropped], itertools.repeat(None))
        self.pending += [(generation, step)]
        del self.returned[:returned]
        del self.dropped[:count]
        self.outbox = None
        _exhaust(forget)


class ProcessPipeline(Window):
    """The pipeline of ``worker_mode="process"``; the interface of the thread pipeline
    (``next``, ``seek``, ``stop``, ``step``, ``closed``) plus ``worker_pids``."""

    forked_message = ("this DataLoader was created in another process; its worker processes "
                      "belong to that one -- create it here")

    def __init__(self, streams: dict[str, Any], rows_of: Any, job: Any, mask_key: str | None,
                 start_step: int, workers: int, prefetch: int, readahead: int,
                 steps: int | None, start_method: str | None,
                 entropy: tuple[int, ...] = (), stats: bool = False,
                 parking: Parking | None = None) -> None:
        super().__init__(start_step, steps)
        # Where a pass that ran to its end leaves its idle workers, and the next one finds
        # them (see finish(); None: the workers end with the pipeline).
        self.parking = parking
        self.pickled = False  # whether the workers got the job pickled (only such are parked)
        self.entropy = entropy  # with a worker's index: what it seeds its global generators by
        self.count = workers
        self.window = prefetch + workers
        self.share = -(-self.window // workers) + 1
        # Each worker keeps free segments for the steps it holds and two more; with `stats`
        # it times its batches and sends the timings with them.
        self.job = (streams, rows_of, job, mask_key, workers, self.share + 2, steps, stats)
        # Statistics: the timings the replies brought, (worker, times, decode ns) -- filed by
        # a reply's commit, folded into the workers' recorders by _fold_arrivals.
        self.arrived: list[tuple[int, tuple[int, ...], int]] = []
        self.recorders: list[Recorder] = []
        if stats:
            self.collector = Collector("process", workers, self.window, self.lock,
                                       pids=functools.partial(_pids, weakref.ref(self)))
            self.recorders = self.collector.remote(workers)
            self.collector.before = self._fold_arrivals
        self.transform = job.transform
        self.requested = start_method
        self.start_method: str | None = None
        self.readahead = readahead
        self.started = False
        self.fatal: BaseException | None = None  # raised to the consumer: nothing can be built
        self.workers: list[_Worker] = []
        # The thread reading the workers' replies now (None: nobody), and whether the last
        # reading was cut short (by an interrupt, or an error raised to the consumer).
        self.pumper: int | None = None
        self.interrupted = False
        self.wake_read, self.wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # Every worker's socket and process sentinel, and the wake-up pipe.
        self.poller = select.epoll()  # registered once: cheaper per wait than poll()
        self.poller.register(self.wake_read, select.EPOLLIN)
        if start.likely_forkserver(start_method, self.transform):
            # Now rather than at the first next(): the server imports the transform's module
            # (torch, torchvision: seconds) while the caller builds the rest of its training,
            # and spawning it returns at once.
            _preload_forkserver(multiprocessing.get_context("forkserver"), self.transform)

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
        return self.started

    def _check(self) -> None:
        if self.fatal is not None:
            raise self.fatal

    def _record(self, began: tuple[int, Any], queued: int) -> None:
        if len(self.arrived) >= _FOLD_ARRIVALS:
            self._fold_arrivals()
        super()._record(began, queued)

    def _fold_arrivals(self) -> None:
        """Moves the timings the replies brought into the workers' recorders: a worker's
        stages, and as the hand-off its encoding and sending and the consumer's decoding."""
        with self.cond:
            arrived, self.arrived = self.arrived, []
            recorders = self.recorders
            for index, times, decoded in arrived:
                if not times:  # a batch the worker built untimed: counted
                    recorders[index].untimed += 1
                    continue
                sample, read, transform, encoded, sent, idle, nbytes, cold = times
                recorders[index].add((sample, read, transform, encoded + sent + decoded, idle,
                                      sample + read + transform + encoded + sent, nbytes,
                                      cold))

    def _moved(self) -> None:
        """The position moved (a step taken, a seek): the steps it brought into the window go
        out now."""
        self._top_up()

    def _wait(self) -> None:
        """Reads the workers' replies until something arrived (with the lock released while
        it waits in ``epoll``); another consumer thread's reading is waited for instead."""
        if self.pumper is not None:
            # Another thread reads; it notifies when it filed something or stopped reading. A
            # bound on the wait, in case an interrupt ended its reading before it could.
            self.sleep(0.05)
            return
        self._top_up()
        if self.interrupted:
            # The last reading did not finish: replies it read but did not file are in the
            # readers, and no wait reports them again.
            backlog = [w for w in self.workers if w.dead is None and w.reader.backlog()]
            for w in backlog:
                self._receive(w, read=False)
            self.interrupted = False  # (only once all of it is filed)
            if backlog:
                return
        self.pumper = threading.get_ident()
        try:
            try:
                self.cond.release()
                events = self.poller.poll()
            finally:
                self.cond.acquire()
            if not self.closed:
                self.interrupted = True
                self._take_in({fd for fd, _ in events})
                self.interrupted = False
        except Exception:
            if self.closed:  # close() ran in a signal handler: what it closed was in use
                raise LoaderClosedError("the DataLoader was closed while waiting") from None
            raise
        finally:
            self.pumper = None
            if self.closed and self.wake_read >= 0 and not self.workers:
                self._close_waiting()  # close() ran inside this wait (see _shutdown)
            if self.owns():  # not if an interrupt came before the lock was taken back
                self.notify()

    def _wake(self) -> None:
        try:
            os.write(self.wake_write, b"x")
        except OSError:  # full (the reader has wake-ups to read already) or closed
            pass

    def _start(self) -> None:
        method, payload = start.choose(self.requested, self.job, self.transform)
        self.pickled = payload is not None
        if payload is not None and self.parking is not None and self._reuse(method, payload):
            return
        context: Any = multiprocessing.get_context(method)
        if method == "forkserver":
            _preload_forkserver(context, self.transform)
        forked = method == "fork"
        # What a forked worker closes of the consumer's: the pipe, the epoll instance (shared
        # across fork) and the consumer's ends of the sockets made so far.
        parent_ends: list[int] = [self.wake_read, self.wake_write, self.poller.fileno()]
        try:
            for index in range(self.count):
                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                parent_ends.append(mine.fileno())
                args = (theirs, self.job if forked else payload, forked,
                        list(parent_ends) if forked else [], (*self.entropy, index))
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
                _started.add(process)
                self.workers.append(_Worker(index, process, mine))
                self.poller.register(mine.fileno(), select.EPOLLIN)
                self.poller.register(process.sentinel, select.EPOLLIN)
        except BaseException:
            # The loader stays as it was, not started: an interrupt here (Ctrl-C while the
            # workers start) must not close it, and the next call starts them again.
            self._reap()
            raise
        self.start_method = method
        self.started = True

    def _reuse(self, method: str, payload: bytes) -> bool:
        """Takes the workers a finished pass of the same loader parked, if any, and sends
        them this pipeline's job; False when there are none (or one died meanwhile: then
        they are all reaped and a fresh set starts)."""
        workers = self.parking.take(method, self.count) if self.parking is not None else None
        if workers is None:
            return False
        try:
            self.workers = workers  # from here on reaped with the pipeline, whatever happens
            for w in workers:
                self.poller.register(w.fd, select.EPOLLIN)
                self.poller.register(w.sentinel, select.EPOLLIN)
            for w in workers:
                w.sock.sendall(channel.frame_bytes(("job", payload, (*self.entropy, w.index))))
            ready = _all_ready(workers)
        except OSError:  # a worker went away between the check and the send
            ready = False
        except BaseException:
            self._reap()
            raise
        if not ready:
            self._reap()
            return False
        self.start_method = method
        self.started = True
        return True

    # -- handing out steps ---------------------------------------------------------------------

    def _top_up(self) -> None:
        """Hands out steps until the window of the consumer's position is covered. Called
        with the lock held."""
        if not self.started or self.closed:
            return
        workers = self.workers
        for each in workers:
            if each.outbox is not None:
                each.settle()
        while (self.claim < self.next_step + self.window and not self.closed
               and (self.steps is None or self.claim < self.steps)):
            fewest: _Worker | None = None  # the live worker with the fewest outstanding steps
            for each in workers:
                if each.dead is None and (fewest is None
                                          or len(each.pending) < len(fewest.pending)):
                    fewest = each
            if fewest is None:
                return
            w = fewest
            if len(w.pending) >= self.share:
                return  # each worker has its share (stale steps of a seek count too)
            step, generation = self.claim, self.generation
            ahead = self.steps_ahead(step, self.readahead) if self.readahead else _NOTHING
            returned, direct, dropped = w.given_back()
            frame = channel.frame_bytes(("task", generation, step, ahead.start, ahead.stop,
                                         returned))
            sent = (generation, step, direct, len(dropped), dropped)
            # Recorded as sent before the send, with no call in between, so that an interrupt
            # after it does not send it again (w.settle() completes the record); undone if the
            # send fails.
            self.claim = step + 1
            w.outbox = sent
            try:
                w.sock.sendall(frame)
            except OSError:
                w.outbox = None
                if self.closed:
                    return  # close() came from a signal handler: its socket is closed
                if self.claim == step + 1 and self.generation == generation:
                    self.claim = step  # another worker builds it
                w.process.join(_JOIN_SECONDS)  # its end closed: it is exiting
                self._died(w)
                continue
            w.settle()

    # -- replies -------------------------------------------------------------------------------

    def _take_in(self, ready: set[int]) -> None:
        """Files what the workers whose sockets or sentinels are in ``ready`` sent."""
        if self.wake_read in ready:
            _drain(self.wake_read)
        died = False
        for w in self.workers:
            if w.dead is not None:
                continue
            if w.fd in ready:
                self._receive(w)
            if w.sentinel in ready:
                self._receive(w)  # what it sent before it died still counts
                self._died(w)
                died = True
        if died and all(w.dead is not None for w in self.workers) \
                and self.next_step not in self.ready and self.fatal is None:
            self.fatal = next(w.dead for w in self.workers if w.dead is not None)

    def _receive(self, w: _Worker, read: bool = True) -> None:
        reader = w.reader
        if reader.closing:  # left by an interrupt after a commit
            reader.close_handled()
        if read:
            reader.fill()
        else:
            reader.settle()
        while reader.buf and not reader.closed:  # (close() may come from a signal handler)
            frame = reader.frame()
            if frame is None:
                return
            message, fds, end = frame
            w.replied = True
            if message[0] != "error":
                self._batch(w, message, fds, end)
            else:
                self._error(w, message, end)

    def _wanted(self, w: _Worker, generation: int, step: int) -> tuple[bool, bool]:
        """Whether the reply for ``step`` is one to file, and whether it answers the oldest
        step ``w`` was sent (a reply handled once already, then interrupted, does not)."""
        answers = bool(w.pending) and w.pending[0] == (generation, step)
        wanted = (answers and generation == self.generation and not self.closed
                  and step >= self.next_step and step not in self.ready)
        return wanted, answers

    def _batch(self, w: _Worker, message: tuple[Any, ...], fds: list[int], end: int) -> None:
        if message[0] == "flat":
            _, generation, step, keys, refs, lent, fresh, retired, times = message
        else:
            _, generation, step, skeleton, lent, fresh, retired, times = message
        # Redone in full if an interrupt lands before the commit below.
        for (ident, size), fd in zip(fresh, fds, strict=True):
            w.maps[ident] = Mapping(fd, size)  # keeps no descriptor
        for ident in retired:
            w.maps.pop(ident, None)  # arrays over it keep the mapping until they go
        wanted, answers = self._wanted(w, generation, step)
        loan = Loan()
        watch = weakref.ref(loan, w.dropped.append)
        key = id(watch)
        batch = None
        decoded = 0
        if wanted:
            began = _ns()
            batch = (decode_flat(keys, refs, w.maps, loan) if message[0] == "flat"
                     else decode(skeleton, w.maps, loan))
            if times:  # (the decode counts with a timed batch's hand-off)
                decoded = _ns() - began
        timed = None if times is None else (w.index, times, decoded)
        reader, count = w.reader, len(fds)
        # The commit: nothing from here to the end of it calls anything.
        if reader.closed:
            return  # close() ran in a signal handler meanwhile: it closed the descriptors
        if timed is not None:
            self.arrived += [timed]
        if wanted:
            w.loans[key] = (watch, lent)
            self.ready[step] = batch
        else:
            w.returned += lent
        if answers:
            del w.pending[0]
        del reader.buf[:end]
        del reader.fds[:count]
        reader.closing += fds
        # Committed.
        reader.close_handled()

    def _error(self, w: _Worker, message: tuple[Any, ...], end: int) -> None:
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
        failure = Failure(error)
        wanted, answers = self._wanted(w, generation, step)
        reader = w.reader
        # The commit, calling nothing.
        if step < 0:  # the worker could not start: nothing can be built
            if self.fatal is None:
                self.fatal = error
        elif wanted:
            self.ready[step] = failure
        if answers:
            del w.pending[0]
        del reader.buf[:end]

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
            where = f"before it delivered step {current[0]}"  # (built, or being built)
        else:
            where = f"while the loader was at step {self.next_step}"
        hint = (" (SIGKILL is often the kernel's out-of-memory killer: see `dmesg`; fewer "
                "workers or a smaller prefetch_size use less memory)" if code == -9 else "")
        error = WorkerError(f"loader worker {w.index} (pid {w.process.pid}) {how} {where}"
                            f"{hint}; the DataLoader is closed")
        failure = Failure(error)
        at = current[0] if current and w.replied else -1
        # The commit, calling nothing: the death is filed at most once.
        if w.dead is None:
            w.dead = error
            if at >= 0:
                # Delivered at its step, after the steps before it (other workers build
                # those), as a transform's exception would be.
                if at not in self.ready:
                    self.ready[at] = failure
            elif self.fatal is None:
                self.fatal = error
        self._unwatch(w)

    def _unwatch(self, w: _Worker) -> None:
        """Takes ``w``'s socket and sentinel out of the wait (again: no harm)."""
        for fd in (w.fd, w.sentinel):
            try:
                self.poller.unregister(fd)
            except (OSError, ValueError):
                pass

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
            self.notify()
            # Another thread reading the replies (the pipe woke it) leaves before the
            # descriptors it waits on are closed. If close() came from a signal handler inside
            # this thread's own reading, that reading files nothing more, and the wake-up pipe
            # (closed as it leaves) ends its wait at once.
            deadline = time.monotonic() + _JOIN_SECONDS
            while self.pumper is not None and self.pumper != threading.get_ident() \
                    and time.monotonic() < deadline:
                self.sleep(0.05)
        self._shutdown()

    def _shutdown(self) -> None:
        """Ends the workers (see :meth:`_reap`) and closes the wake-up pipe. Only the process
        that started them does this."""
        self.closed = True
        self.ready.clear()
        if self.pid != os.getpid():
            self.workers = []
            return
        self._reap()
        if self.pumper is None:
            self._close_waiting()
        # else close() came from a signal handler or a finalizer inside this thread's own wait:
        # the wait, which the wake-up pipe ends at once, closes them as it leaves.

    def _close_waiting(self) -> None:
        """Closes what the consumer waits on: the wake-up pipe and the epoll instance."""
        for fd in (self.wake_read, self.wake_write):
            try:
                os.close(fd)
            except OSError:
                pass
        self.wake_read = self.wake_write = -1
        self.poller.close()

    def _reap(self) -> None:
        """Closes the workers' sockets (each worker then leaves), reaps them, kills those that
        do not leave within the deadline."""
        workers, self.workers = self.workers, []
        for w in workers:
            self._unwatch(w)
        end_workers(workers)

    def finish(self) -> None:
        """Stops the pipeline of a pass that ran to its end: its workers, idle now, are
        parked for the loader's next pass when that is safe (:mod:`loaderx.workers.parking`),
        and reaped otherwise, as :meth:`stop` does."""
        if self.parking is None or self.closed or self.pid != os.getpid():
            self.stop()
            return
        with self.cond:
            if self.closed or self.pumper is not None or not self._idle():
                parked = None  # stopped as stop() stops it
            else:
                self.closed = True
                self.ready.clear()
                for w in self.workers:
                    self._unwatch(w)
                parked = self.parking.put(self.start_method or "", self.workers)
                if parked:
                    self.workers = []  # the parking's now
        if parked is None:
            self.stop()
        elif parked:
            self._close_waiting()
        else:
            self._shutdown()  # closed already: reaps them, closes the wake-up pipe

    def _idle(self) -> bool:
        """Whether every worker is alive, got its job pickled, and holds nothing: no step
        sent and unanswered, no reply half read, no send half recorded."""
        return (self.started and self.pickled and self.fatal is None and not self.interrupted
                and bool(self.workers)
                and all(w.dead is None and not w.pending and w.outbox is None
                        and not w.reader.backlog() and not w.reader.buf and not w.reader.fds
                        and not w.reader.closing and w.process.exitcode is None
                        for w in self.workers))


def parking() -> Parking:
    """Where a loader's finished passes leave their idle workers (one per DataLoader)."""
    return Parking(end_workers)


def _all_ready(workers: list[_Worker]) -> bool:
    """Waits until every worker of a reused set answers its new job with ``("ready",)``;
    False, at once, if one dies or answers otherwise (its job failed), or if they do not all
    answer within ``_READY_SECONDS``. This is the one check of a parked set's health: a
    worker that died while parked cannot answer (and the kernel releases a killed process's
    socket a little after its threads end, so no look before the hand-over would be sure)."""
    deadline = time.monotonic() + _READY_SECONDS
    waiting = {w.fd: w for w in workers}
    sentinels = {w.sentinel for w in workers}
    probe = select.poll()
    for w in workers:
        probe.register(w.fd, select.POLLIN)
        probe.register(w.sentinel, select.POLLIN)
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        for fd, events in probe.poll(left * 1000):
            one = waiting.get(fd)
            if fd in sentinels or one is None or events & (select.POLLHUP | select.POLLERR):
                return False  # a death, or a second message from one that answered
            one.reader.fill()
            frame = one.reader.frame()
            if frame is None:
                continue  # (a part of the answer)
            message, fds, end = frame
            del one.reader.buf[:end]
            if fds or message != ("ready",):
                return False
            del waiting[fd]
            probe.unregister(fd)
    return True


def end_workers(workers: list[_Worker]) -> None:
    """Closes the sockets of ``workers`` (each then leaves), reaps them, and kills those that
    do not leave within the deadline."""
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


def _pids(pipeline: weakref.ref[ProcessPipeline]) -> list[int]:
    """The worker processes' pids of ``pipeline`` (none once it is gone)."""
    alive = pipeline()
    return [] if alive is None else alive.worker_pids


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except OSError:  # empty (non-blocking) or closed
        return


def _preload_forkserver(context: Any, transform: Any) -> None:
    """Starts the fork server with NumPy, loaderx and the module the transform lives in (and
    so what that imports: torch, torchvision, a tokenizer) imported once, so that each worker
    forked from it starts with them and shares their pages with the server, instead of
    importing them again, each, in parallel (see :mod:`loaderx.workers.server_preload`) --
    unless the server already runs, or the application chose its own preload list.

    Whether either holds is read from multiprocessing's private server object (in every 3.x
    so far). A Python whose ``multiprocessing.forkserver`` lacks any of it gets no preload:
    the server starts at the first worker, as multiprocessing starts it, and each worker
    imports what it needs itself."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    running = getattr(server, "_forkserver_pid", _ABSENT)
    preload = getattr(server, "_preload_modules", _ABSENT)
    ensure_running = getattr(forkserver, "ensure_running", None)
    if running is _ABSENT or preload is _ABSENT or not callable(ensure_running):
        return  # another forkserver than the one this was written against: no preload
    if running is not None or preload != ["__main__"]:
        return
    context.set_forkserver_preload(["__main__", "numpy", "loaderx",
                                    "loaderx.workers.server_preload"])
    os.environ[server_preload.PRELOAD_VARIABLE] = server_preload.describe(
        _modules_of(transform))
    try:
        ensure_running()  # the server reads the variable as it starts
    finally:
        os.environ.pop(server_preload.PRELOAD_VARIABLE, None)


#: What :func:`_preload_forkserver` reads of a private attribute that is not there.
_ABSENT = object()


def _modules_of(transform: Any) -> list[str]:
    """The importable module a transform (a function, a callable object, a partial) is defined
    in; none for ``__main__`` (preloaded as the main module) or a builtin."""
    target = getattr(transform, "func", transform)  # functools.partial
    module = getattr(target, "__module__", None)
    if not isinstance(module, str):
        module = getattr(type(target), "__module__", None)
    if not isinstance(module, str) or module in ("__main__", "builtins") \
            or module not in sys.modules:
        return []
    return [module]
