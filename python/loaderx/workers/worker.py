"""The worker process: receives steps, builds their batches into shared memory, sends where
the arrays lie.

Messages from the consumer: ``("task", generation, step, ahead_start, ahead_stop, returned)``
-- build ``step``, start the reads of steps ``ahead_start:ahead_stop`` when the streams go to
the disk, and take back the segments ``returned`` (the consumer dropped their batches); and
``("job", pickled, entropy)`` -- another pass of the loader took this idle worker over
(:mod:`loaderx.workers.parking`): build its batches from now on, the generators reseeded,
answered by ``("ready",)``.
Replies: ``("batch", generation, step, skeleton, lent, fresh, retired, times)`` with the new
segments' descriptors -- ``("flat", generation, step, keys, refs, lent, fresh, retired,
times)`` for a dict of arrays, the common case, in plain tuples -- or
``("error", generation, step, pickled, kind, message, traceback)``. ``times`` is None unless
the loader keeps statistics; then it is ``(sample, read, transform, encode, sent, idle,
nbytes, cold)``: the batch's stages in nanoseconds (``sent``: how long the previous reply's
send took; ``idle``: how long the worker waited for this step), the bytes its gathers wrote
and whether its reads went to the device.
The worker ends when the consumer's end of the socket closes -- on ``close()``, and when the
consumer dies, however it dies.
"""

from __future__ import annotations

import gc
import importlib.abc
import importlib.util
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

from loaderx._loader import context
from loaderx._loader.batch import Builder
from loaderx._loader.stats import Clock
from loaderx.errors import LoaderxTypeError
from loaderx.workers import channel
from loaderx.workers.arena import Arena, BatchMemory
from loaderx.workers.layout import Flat, encode

__all__ = ["main"]

#: A reply whose batch took less than this to build may wait for the next step's reply when
#: that step is already waiting, to go in one message: the consumer then wakes once for two
#: batches (each wake-up costs it some 30 µs, a third of a fast batch's handoff). A batch that
#: takes longer goes at once -- the wait would add to its latency more than it saves.
_HOLD_SECONDS = 0.002


def main(sock: socket.socket, job: Any, forked: bool, close_fds: list[int],
         entropy: tuple[int, ...] = ()) -> None:
    """The worker's entry point; ``job`` is the pickled (or, forked, the inherited) tuple
    ``(streams, rows_of, job, mask_key, workers, keep, steps)``; ``entropy`` what this
    worker's process-global generators are seeded from (see :class:`GlobalSeeds`)."""
    context.mark_worker_process()  # ctx.seed_torch() may seed this process's generator
    # Ctrl-C reaches the whole process group: the consumer handles it and closes the loader.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    # The consumer's death ends the worker even inside a transform that never returns: the
    # socket's other end closing wakes this thread (the main one notices only between steps).
    threading.Thread(target=_exit_when_orphaned, args=(sock.fileno(),), daemon=True,
                     name="loaderx-worker-watch").start()
    for fd in close_fds:  # forked: the consumer's ends of the other workers' sockets
        try:
            os.close(fd)
        except OSError:
            pass
    if forked:
        # Objects inherited from the consumer stay out of the collector's passes, which would
        # otherwise write to (and so copy) every page that holds one.
        gc.freeze()
    try:
        builder, keep, steps, clock = _set_up(job, entropy)
    except BaseException as e:  # e.g. a transform this interpreter cannot import
        try:
            channel.send(sock, _failure(-1, -1, e))
        finally:
            sock.close()
        return
    arena = Arena(keep)
    inbox = channel.Inbox(sock)
    held = b""  # a reply kept back to go with the next one (see _HOLD_SECONDS)
    ns = time.perf_counter_ns
    sent = 0  # how long the last send took
    try:
        while True:
            waiting = ns()
            try:
                message, _ = inbox.recv()
            except (channel.Closed, OSError):
                return
            idle = ns() - waiting
            if message[0] == "job":
                # The loader's next pass took this worker over (loaderx.workers.parking): its
                # job replaces the last one; the segments stay, lent ones too.
                try:
                    builder, _, steps, clock = _set_up(message[1], message[2])
                except BaseException as e:
                    channel.send(sock, _failure(-1, -1, e))
                    return
                channel.send(sock, ("ready",))  # the consumer waits for it (see _reuse)
                sent = 0
                continue
            _, generation, step, ahead_start, ahead_stop, returned = message
            arena.returned(returned)
            if ahead_stop > ahead_start and builder.going_to_disk():
                builder.read_ahead(range(ahead_start, ahead_stop), steps)
            started = time.perf_counter()
            reply, fds = _build(builder, arena, generation, step, clock, idle, sent)
            try:
                if (not held and not fds and reply[0] == "flat" and not reply[7]
                        and time.perf_counter() - started < _HOLD_SECONDS
                        and inbox.waiting()):
                    # Quick to build, and the next step is already here: the two replies go
                    # together, so the consumer wakes once for both.
                    held = channel.frame_bytes(reply)
                    continue
                sending = ns()
                channel.send(sock, reply, fds, held)
                sent = ns() - sending
                arena.sent()
            except (channel.Closed, OSError):
                return
            except Exception as e:  # the output holds a value that does not pickle
                arena.not_handed_over()  # first: a segment retired below was never sent
                arena.returned(reply[-4])  # the segments it would have lent
                error = LoaderxTypeError(
                    f"the transform's output at step {step} cannot be sent to the consumer: "
                    f"{type(e).__name__}: {e}; return NumPy arrays, torch tensors, and values "
                    "that pickle (in dicts, lists or tuples)")
                channel.send(sock, _failure(generation, step, error), before=held)
            held = b""
    finally:
        sock.close()


def _set_up(job: Any, entropy: tuple[int, ...]) -> tuple[Builder, int, int | None,
                                                         Clock | None]:
    """The batch builder of ``job`` (pickled, or inherited by a forked worker), with the
    process-global generators seeded from ``entropy``; and the job's segment count, step
    count and, with statistics, the clock."""
    if isinstance(job, bytes):
        job = pickle.loads(job)
    seeds = GlobalSeeds(entropy)
    streams, rows_of, work, mask_key, workers, keep, steps, timed = job
    torch = sys.modules.get("torch")
    if torch is not None:  # as torch's own workers: one intra-op thread per worker
        torch.set_num_threads(1)
    seeds.seed()
    builder = Builder(streams, rows_of, work, workers, mask_key)
    return builder, keep, steps, Clock(None, None) if timed else None


class GlobalSeeds:
    """Seeds this worker's process-global generators -- Python's ``random``, NumPy's legacy
    ``np.random``, and torch's default generator -- from ``entropy`` (the loader's seed, pass,
    start step, shard and this worker's index), as torch's DataLoader seeds its workers.
    Without it, forked workers inherit the consumer's NumPy and torch state and forkserver
    workers the server's (torch starts from one fixed seed in every fresh process), so every
    worker would draw the same "random" augmentations in turn. torch is seeded when it is
    imported already, else as it is imported (a transform may import it lazily), before any
    draw. (Results that draw from ``ctx`` do not depend on this: they are exact whichever
    worker builds a step.)"""

    def __init__(self, entropy: tuple[int, ...]) -> None:
        import numpy as np  # loaded already: the builder needs it

        state = np.random.SeedSequence(list(entropy)).generate_state(3, np.uint64)
        self.python, self.numpy, self.torch = (int(v) for v in state)

    def seed(self) -> None:
        import random

        import numpy as np

        random.seed(self.python)
        np.random.seed(self.numpy % (1 << 32))
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "manual_seed"):
            self.seed_torch(torch)
        else:  # (a worker taken over by another pass replaces the hook its last one left)
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _SeedTorchOnImport)]
            sys.meta_path.insert(0, _SeedTorchOnImport(self))

    def seed_torch(self, torch: Any) -> None:
        torch.manual_seed(self.torch % (1 << 63))


class _SeedTorchOnImport(importlib.abc.MetaPathFinder):
    """Seeds torch's default generator right after ``import torch`` runs its module: finds
    torch's spec through the other finders once (then leaves ``sys.meta_path``) and wraps its
    loader's ``exec_module``."""

    def __init__(self, seeds: GlobalSeeds) -> None:
        self.seeds = seeds

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module
        seeds = self.seeds

        def exec_module(module: Any) -> None:
            run(module)
            seeds.seed_torch(module)

        loader.exec_module = exec_module
        return spec


def _exit_when_orphaned(fd: int) -> None:
    poller = select.poll()
    poller.register(fd, 0)  # hang-ups and errors are always reported
    while True:
        for _, events in poller.poll():
            if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                os._exit(0)


def _build(builder: Builder, arena: Arena, generation: int, step: int, clock: Clock | None,
           idle: int, sent: int) -> tuple[tuple[Any, ...], list[int]]:
    memory = BatchMemory(arena)
    timed = None if clock is None else clock.pick()  # (None: untimed, or statistics off)
    try:
        out = builder.produce(step, memory, timed)
        encoding = time.perf_counter_ns()
        skeleton, lent = encode(out, memory, arena)
        encoded = time.perf_counter_ns() - encoding
    except BaseException as e:  # every failure goes to the consumer, whatever its kind
        if memory.segment is not None and memory.segment.ident not in arena.lent:
            arena.give(memory.segment)
        return _failure(generation, step, e), []
    fresh, fds, retired = arena.handed_over()
    idents = [s.ident for s in lent]
    # The timings (statistics on, a timed batch); () for a batch built untimed, which the
    # consumer counts (see Clock.pick); None with statistics off.
    times: tuple[int, ...] | None = None
    if timed is not None:
        times = (timed.sample, timed.read, timed.transform, encoded, sent, idle, timed.nbytes,
                 timed.cold)
        timed.record(0, 0, timed.sample + timed.read + timed.transform + encoded + sent)
    elif clock is not None:
        times = ()
    if type(skeleton) is Flat:
        return ("flat", generation, step, skeleton.keys, skeleton.refs, idents, fresh,
                retired, times), fds
    return ("batch", generation, step, skeleton, idents, fresh, retired, times), fds


def _failure(generation: int, step: int, error: BaseException) -> tuple[Any, ...]:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        pickled: bytes | None = pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # an exception that does not pickle still reaches the consumer
        pickled = None
    kind = f"{type(error).__module__}.{type(error).__qualname__}"
    return ("error", generation, step, pickled, kind, str(error), text)
