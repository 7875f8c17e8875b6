"""The consumer's side of a window of steps, shared by the thread and the process pipelines.

Workers file finished batches under their step in ``ready`` -- the thread workers themselves,
the worker processes through the consumer, which reads their replies while it waits -- and the
consumer waits for the step it is at, takes it, and moves on. Taking a step must survive an
interrupt: Python runs a signal handler (Ctrl-C) after any call or at a backward jump, so a
KeyboardInterrupt can land while the lock is taken or released. :meth:`Window.take` then gives
the step back (and the lock, if the interrupt left it held), so the next call returns the step
and ``state_dict()`` still points at it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from loaderx._loader.batch import Failure
from loaderx._loader.stats import Collector
from loaderx.errors import LoaderClosedError

__all__ = ["RECHECK_SECONDS", "Window", "same_process"]

#: Forks survived by this process's line: a child's count is one more than its parent's, so a
#: pipeline knows it was made in another process by one integer compare (os.getpid() is a
#: system call, and the consumer asks on every step).
_forks = [0]


def _after_fork_in_child() -> None:
    _forks[0] += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


#: The longest a consumer or an idle thread worker waits before it looks at the loader's state
#: again (see Window._wait and Window.notify).
RECHECK_SECONDS = 0.1


def same_process(born: int) -> bool:
    """Whether the process that recorded ``born`` (``_forks[0]`` then) is this one."""
    return born == _forks[0]


class Window:
    """Steps from ``start_step`` on (``steps`` of them; None: endless). Subclasses start their
    workers in :meth:`_start`, say whether they did in :meth:`_started`, may raise a failure
    that ends the loader in :meth:`_check` while the consumer waits, hear of every move of the
    position in :meth:`_moved` (called under the lock), may do the waiting themselves in
    :meth:`_wait`, and stop everything in ``stop()``."""

    #: What ``next()`` says in a process the pipeline was not made in.
    forked_message = "this DataLoader was created in another process; create it here"

    def __init__(self, start_step: int, steps: int | None) -> None:
        self.steps = steps
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.ready: dict[int, Any] = {}
        self.next_step = start_step     # the consumer's position
        self.claim = start_step         # the next step a worker will build
        self.prefetched_to = start_step  # steps below this had their reads started
        self.generation = 0             # bumped by seek, so stale work is dropped
        self.closed = False
        self.notifying = False          # inside cond.notify_all (see notify)
        self.pid = os.getpid()
        self.born = _forks[0]           # see same_process
        self.collector: Collector | None = None  # statistics (None: off)

    @property
    def step(self) -> int:
        return self.next_step

    def _started(self) -> bool:
        raise NotImplementedError

    def _start(self) -> None:
        raise NotImplementedError

    def _check(self) -> None:
        return

    def _moved(self) -> None:
        return

    def _wait(self) -> None:
        """Waits, with the lock held, until something may have changed: by default until a
        worker notifies the condition, or a tenth of a second at most -- a close() from a
        signal handler that lands inside ``Condition.wait`` before it is listening (its
        notify then reaches nobody) costs that much, instead of a wait forever."""
        self.sleep(RECHECK_SECONDS)

    def sleep(self, timeout: float | None = None) -> None:
        """``cond.wait(timeout)``, with the lock held again if an interrupt lands inside it:
        ``Condition.wait`` is Python code, and an interrupt between its release of the lock
        and its taking it back would make the caller's ``with`` fail to release it, raising
        a RuntimeError in place of the KeyboardInterrupt."""
        cond = self.cond
        try:
            cond.wait(timeout)
        except BaseException:
            if not self.owns():
                cond.acquire()
            raise

    def stop(self) -> None:
        raise NotImplementedError

    def owns(self) -> bool:
        """Whether this thread holds the lock (at any depth). Only documented behaviour is used:
        ``Condition.notify`` raises RuntimeError in a thread that does not hold the lock, and
        wakes nobody when asked to wake none. (The lock's private ``_is_owned`` and
        ``_recursion_count`` are not in every interpreter: Debian 12's 3.11.2 has no
        ``_recursion_count``.)"""
        try:
            self.cond.notify(0)
        except RuntimeError:
            return False
        return True

    def notify(self) -> None:
        """Wakes every thread waiting on the condition (called with the lock held) -- unless this
        thread is already inside that call further out: a close() or seek() from a signal
        handler or a finalizer that landed inside ``Condition.notify_all``, whose walk of the
        waiters fails (IndexError, or RuntimeError on a released waiter) if a nested notify
        empties them under it. The outer call then wakes them all anyway, and every waiter (a
        consumer, an idle thread worker) looks at the loader's state again within
        ``RECHECK_SECONDS`` on its own. Only the lock's holder reads or writes ``notifying``."""
        if self.notifying:
            return
        self.notifying = True
        try:
            self.cond.notify_all()
        finally:
            self.notifying = False

    def take(self) -> Any:
        """The batch of the consumer's step, once it is ready; a worker's failure is raised
        here, at its step, and closes the pipeline."""
        if not same_process(self.born):
            raise LoaderClosedError(self.forked_message)
        collector = self.collector
        began = collector.begin() if collector is not None else None
        taken = False
        try:
            with self.cond:
                if self.closed:
                    raise LoaderClosedError("the DataLoader is closed")
                if self.steps is not None and self.next_step >= self.steps:
                    raise StopIteration
                if not self._started():
                    self._start()
                queued = len(self.ready)
                # Several threads may consume one loader: each takes whichever step is next
                # when it is ready, so the position is read again after every wait.
                while self.next_step not in self.ready:
                    self._check()
                    if self.closed:
                        raise LoaderClosedError("the DataLoader was closed while waiting")
                    self._wait()
                step, generation = self.next_step, self.generation
                item = self.ready[step]
                # No call from here to `taken = True`: a signal handler runs only after a call
                # or at a backward jump, so an interrupt cannot land between consuming the step
                # and recording that it was (dict.pop would open such a gap, and so did the
                # isinstance() that stood here before it moved below: a handler's close() as
                # it returned emptied `ready` under this frame, a KeyError seen under 3.13t).
                # From here to the return, every call is inside this try.
                del self.ready[step]
                self.next_step = step + 1
                taken = True
                failed = isinstance(item, Failure)
                self.notify()
                self._moved()
                if began is not None:  # (an interrupt in here gives the step back, as above)
                    self._record(began, queued)
                elif collector is not None:
                    collector.skipped()  # (an untimed call: counted only)
        except BaseException:
            # An interrupt (KeyboardInterrupt from a signal handler inside notify or the
            # condition's __enter__/__exit__, which are Python code) must neither lose a
            # consumed step nor leave the lock held.
            self._recover((step, generation, item) if taken else None)
            if began is not None and collector is not None:
                collector.abandon(began)
            raise
        if failed:
            self.stop()
            raise item.error
        return item

    def _record(self, began: tuple[int, Any], queued: int) -> None:
        """The consumer's ``next()`` that ``began`` got its batch, ``queued`` batches having
        been ready when it asked (called with the lock held)."""
        if self.collector is not None:
            self.collector.end(began, queued)

    def _recover(self, consumed: tuple[int, int, Any] | None) -> None:
        """Cleans up after an exception in :meth:`take`: releases the lock if an interrupt
        left it held, and puts back a step that was consumed but not delivered."""
        cond = self.cond
        # Held here only if the interrupt came inside __enter__ after it acquired the lock, or
        # inside __exit__ before it released it: then nothing else will release it.
        held = self.owns()
        if consumed is None:
            if held:
                cond.release()
            return
        if not held:
            cond.acquire()
        try:
            step, generation, item = consumed
            # Only if nothing moved since: no seek, no close, no other consumer took a step.
            if (not self.closed and self.generation == generation
                    and self.next_step == step + 1 and step not in self.ready):
                self.ready[step] = item
                self.next_step = step
                self.notify()  # another consumer may be waiting for this step
        finally:
            cond.release()

    def seek(self, step: int) -> None:
        with self.cond:
            self.generation += 1
            self.ready.clear()
            self.next_step = self.claim = self.prefetched_to = step
            self.notify()
            self._moved()

    def steps_ahead(self, step: int, readahead: int) -> range:
        """The steps after ``step`` whose reads nobody has started yet (up to ``readahead`` of
        them), now marked as started. Called under the lock."""
        ahead = range(max(self.prefetched_to, step + 1), step + 1 + readahead)
        self.prefetched_to = max(self.prefetched_to, ahead.stop)
        return ahead
