"""Where a loader's time goes: per-stage timings, cheap enough to leave on, and a verdict.

Every batch a worker builds is timed in five stages -- ``sample`` (the step's record indices),
``read`` (every stream's gather and decode, companion arrays included), ``transform``,
``handoff`` (thread workers: filing the batch for the consumer; process workers: encoding it
into shared memory and sending its description, plus the consumer's decode of it) and
``idle`` (a worker waiting for a free slot of the prefetch window: thread workers for the
consumer to take a batch, process workers for their next step) -- and each ``next()`` of the
consumer in one, ``wait``: how long it waited for its batch (with ``num_workers=0``: how long
it took to build it). A stage keeps its exact count and total and a histogram of 16 buckets
per octave (bounded: under a thousand integers, whatever the run's length), from which its
p50 and p99 come within a few percent; histograms add up across workers and subtract between
two snapshots, so "since the start" and "since the last call" are both exact in their counts.

Sampling: a batch that takes :data:`TIME_ALL_ABOVE_NS` or more is always timed; faster ones
are timed one in about ``TIME_ALL_ABOVE_NS / duration`` (at random, at most one in
:data:`MAX_STRIDE`), each timed one weighted by the batches it stands for -- itself and the
untimed ones before it -- so that the recording costs well under 1% of any batch's time while
the totals remain unbiased estimates. Counts are exact (untimed batches are counted, and a
snapshot extrapolates the stages' totals over those not yet followed by a timed one); with
every batch timed (slow batches, or while a framework profiler records) so is everything else.
The consumer's ``next()`` calls are sampled the same way, by the time between them, and worker
processes sample their batches as threads do.

The hot path does a few clock reads and extends a list once per timed batch: each worker (thread
or, on the consumer's side, process) has its own :class:`Recorder`, which it writes only while
it holds the pipeline's lock -- which it holds at that moment anyway, to file its batch (the
consumer, to take one) -- and a snapshot folds the recorders into the histograms under that
lock too (a recorder also folds itself every :data:`FOLD_EVERY` batches). So nothing is
shared between threads outside a lock -- free-threaded interpreters included -- and the hot
path takes no lock of its own. Process workers send their timings in their replies (see
:mod:`loaderx.workers.worker`).

:class:`LoaderStats` is what ``loader.stats()`` returns; :meth:`LoaderStats.summary` is the
verdict in words (see :func:`judge` for its rules).

Framework traces: while torch's profiler records, or JAX's profiler traces, :func:`spans`
gives named ranges (``loaderx.next`` around each ``next()``,
``loaderx.sample`` / ``loaderx.read`` / ``loaderx.transform`` around the stages a thread
builds) on the thread that runs them.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loaderx._loader.host import gil_enabled, usable_cores

__all__ = ["BUILD_STAGES", "STAGES", "Collector", "LoaderStats", "Period", "Recorder", "Stage",
           "Verdict", "judge", "spans", "stats_default"]

#: The stages a worker's batch goes through, in order, then the consumer's.
BUILD_STAGES = ("sample", "read", "transform", "handoff", "idle")
STAGES = (*BUILD_STAGES, "wait")
#: What each stage is, in words (the table's row names).
STAGE_NAMES = {"sample": "index sampling", "read": "store read and decode",
               "transform": "transform", "handoff": "hand-off",
               "idle": "worker idle (no free slot)", "wait": "consumer wait in next()"}

#: A recorder folds its pending tuples into the histograms after this many batches.
FOLD_EVERY = 1024
#: Batches (and the consumer's calls) that take at least this long are all timed; faster ones
#: are sampled so that the recording of a timed one -- about 5 us on a 2-core guest -- costs
#: about 0.25% of their time.
TIME_ALL_ABOVE_NS = 2_000_000
#: At most one batch in this many goes untimed between two timed ones, on average.
MAX_STRIDE = 256
#: Histogram buckets: 0..15 ns one each, then 16 per octave up to 2**64 ns.
_BUCKETS = 16 + 60 * 16

_ns = time.perf_counter_ns

#: Verdict thresholds (see judge()).
INPUT_BOUND = 0.10      # the consumer waited at least this fraction of the time
CORES_BUSY = 0.80       # this fraction of the usable cores busy: the CPU is the limit
WORKERS_BUSY = 0.70     # workers busy at least this fraction of the time: they are the limit
FROM_DEVICE = 0.50      # at least this fraction of the batches read from the device
GIL_CORES = 1.30        # thread workers together on at most this many cores: the GIL
GIL_HELD_CORES = 0.60   # ... and at least this many: below, they wait with the GIL released
MACHINE_BUSY = 0.90     # the whole machine this busy (other processes too): the CPU is the limit


def stats_default() -> bool:
    """Whether statistics are on when the loader is not told (``LOADERX_STATS=0`` turns them
    off)."""
    return os.environ.get("LOADERX_STATS", "1").strip().lower() not in ("0", "false", "no",
                                                                         "off")


# -- histograms ----------------------------------------------------------------------------------


def _buckets_of(values: np.ndarray) -> np.ndarray:
    """The bucket of each value (int64 nanoseconds): the value itself below 16, else 16 per
    octave -- ``(s << 4) + (v >> s)`` with ``s = v.bit_length() - 5``."""
    v = np.maximum(values, 0)
    bits = np.frexp(v.astype(np.float64))[1]  # v.bit_length() (exact below 2**53 ns)
    shift = np.maximum(bits - 5, 0)
    index = np.where(v < 16, v, (shift << 4) + (v >> shift))
    return np.clip(index, 0, _BUCKETS - 1)


def _bounds(i: int) -> tuple[int, int]:
    """The lowest value of bucket ``i`` and its width."""
    if i < 16:
        return i, 1
    s = (i >> 4) - 1
    return (16 + (i & 15)) << s, 1 << s


class _Hist:
    """A stage's count, total, largest value and histogram (nanoseconds), and how many of
    its runs were timed (the others counted, and weighted into the histogram and total)."""

    __slots__ = ("buckets", "count", "largest", "timed", "total")

    def __init__(self) -> None:
        self.count = self.total = self.largest = self.timed = 0
        self.buckets = np.zeros(_BUCKETS, np.int64)

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Files ``values``, each standing for ``weights`` of them (1 each if None)."""
        if not len(values):
            return
        self.largest = max(self.largest, int(values.max()))
        self.timed += len(values)
        if weights is None:
            self.count += len(values)
            self.total += int(values.sum())
            self.buckets += np.bincount(_buckets_of(values), minlength=_BUCKETS)
            return
        self.count += int(weights.sum())
        self.total += int((values * weights).sum())
        self.buckets += np.bincount(_buckets_of(values), weights=weights,
                                    minlength=_BUCKETS).astype(np.int64)

    def extrapolated(self, more: int) -> _Hist:
        """A copy counting ``more`` untimed runs, their total estimated by the mean of those
        filed (the buckets, the sample the quantiles come from, unchanged)."""
        out = self.copy()
        if more > 0:
            if self.count > 0:
                out.total += round(self.total * more / self.count)
            out.count += more
        return out

    def merged(self, other: _Hist) -> _Hist:
        out = _Hist()
        out.count, out.total = self.count + other.count, self.total + other.total
        out.largest = max(self.largest, other.largest)
        out.timed = self.timed + other.timed
        out.buckets = self.buckets + other.buckets
        return out

    def minus(self, before: _Hist) -> _Hist:
        out = _Hist()
        # (extrapolated totals can overshoot what the next timed batch brings: not below 0)
        out.count, out.total = self.count - before.count, max(0, self.total - before.total)
        out.largest = self.largest  # (the largest since the start: an upper bound)
        out.timed = self.timed - before.timed
        out.buckets = self.buckets - before.buckets
        return out

    def copy(self) -> _Hist:
        out = _Hist()
        out.count, out.total, out.largest = self.count, self.total, self.largest
        out.timed = self.timed
        out.buckets = self.buckets.copy()
        return out

    def quantile(self, q: float) -> float:
        """The ``q`` quantile in nanoseconds (interpolated inside its bucket), 0 when empty."""
        if self.count <= 0:
            return 0.0
        cumulative = np.cumsum(self.buckets)
        if cumulative[-1] <= 0:
            return 0.0
        target = q * int(cumulative[-1])  # (the sample's: counts may include untimed runs)
        i = int(np.searchsorted(cumulative, target, side="left"))
        if i >= _BUCKETS:
            return float(self.largest)
        seen = int(cumulative[i - 1]) if i else 0
        n = int(self.buckets[i])
        low, width = _bounds(i)
        value = low + width * (max(0.0, min(1.0, (target - seen) / n)) if n > 0 else 0.0)
        return float(min(value, self.largest)) if self.largest else float(value)


# -- recording -----------------------------------------------------------------------------------


#: The fields of a batch's entry in a Recorder.
_FIELDS = 9


def next_stride(duration: int, rng: random.Random) -> int:
    """How many runs from this one to the next timed one (1: the next), after a timed run
    that took ``duration`` ns: 1 from :data:`TIME_ALL_ABOVE_NS` up, else drawn uniformly
    from ``stride +- stride // 2``, ``stride = TIME_ALL_ABOVE_NS / duration`` rounded up (at
    most :data:`MAX_STRIDE`) -- at random, so that a pattern in the batches (every fourth one
    slow) cannot hide from it, and no wider, so that the weights vary little."""
    if duration >= TIME_ALL_ABOVE_NS:
        return 1
    stride = min(MAX_STRIDE, -(-TIME_ALL_ABOVE_NS // max(1, duration)))
    half = stride >> 1
    return stride - half + int(rng.random() * (2 * half + 1))


class Recorder:
    """The timings of the batches one worker built (a thread worker's own, or a worker
    process's as its replies report them). A timed batch is the 9 integers ``(sample, read,
    transform, handoff, idle, busy, nbytes, cold, weight)`` -- nanoseconds, then the bytes its
    gathers wrote, whether its reads went to the device, and how many batches it stands for
    (itself and the ``untimed`` ones before it) -- appended to the flat list ``pending`` (one
    C call) and folded into the histograms later. Every method is called with the
    collector's lock (the pipeline's) held."""

    __slots__ = ("busy", "cold", "hists", "nbytes", "pending", "untimed")

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.hists = [_Hist() for _ in BUILD_STAGES]
        self.busy = self.nbytes = self.cold = 0
        self.untimed = 0  # batches built since the last timed one

    def add(self, entry: tuple[int, ...]) -> None:
        """Files a timed batch's first 8 fields (a thread's clock's, or a worker process's as
        its reply brought them), weighted by itself and the ``untimed`` ones before it."""
        pending = self.pending
        pending.extend(entry)
        pending.append(self.untimed + 1)
        self.untimed = 0
        if len(pending) >= FOLD_EVERY * _FIELDS:
            self._fold()

    def _fold(self) -> None:
        """Moves the pending batches into the histograms."""
        pending = self.pending
        if not pending:
            return
        self.pending = []
        columns = np.array(pending, np.int64).reshape(-1, _FIELDS).T
        weights = columns[8]
        for hist, values in zip(self.hists, columns[:5], strict=True):
            hist.add(values, weights)
        self.busy += int((columns[5] * weights).sum())
        self.nbytes += int((columns[6] * weights).sum())
        self.cold += int(weights[columns[7] != 0].sum())

    def totals(self) -> _Totals:
        """The figures so far, the batches built since the last timed one included (their
        times, bytes and cold reads estimated by the means of the timed ones)."""
        self._fold()
        more = self.untimed
        hists = [h.extrapolated(more) for h in self.hists]
        busy, nbytes, cold = self.busy, self.nbytes, self.cold
        filed = self.hists[0].count  # the batches the figures above stand for
        if more and filed:
            busy += round(busy * more / filed)
            nbytes += round(nbytes * more / filed)
            cold += round(cold * more / filed)
        return _Totals(hists, busy, nbytes, cold)


class Clock:
    """What :meth:`loaderx._loader.batch.Builder.produce` measured of the batch it built last, for
    the one thread that builds with it; whether to time the next batch (:meth:`pick`), and to
    trace it (see :func:`spans`). A worker process's clock has neither collector nor recorder:
    it samples its batches the same way and sends the timed ones' timings (and a mark for
    each untimed one) with them, and traces nothing (the profiler that records is the
    consumer's)."""

    __slots__ = ("cold", "collector", "finish", "left", "nbytes", "profilers", "read",
                 "recorder", "rng", "sample", "start", "tracing", "transform")

    def __init__(self, collector: Collector | None, recorder: Recorder | None) -> None:
        self.collector = collector
        self.recorder = recorder
        self.sample = self.read = self.transform = self.nbytes = 0
        self.start = self.finish = 0  # when the build began and ended (perf_counter_ns)
        self.cold = False
        self.tracing: Callable[[str], Any] | None = None  # the batch's maker of named ranges
        self.left = 1  # runs from the next one to the next timed one (1: the next is timed)
        self.profilers = False  # whether a profiler's module was loaded at the last timed one
        self.rng = random.Random()

    def pick(self) -> Clock | None:
        """This clock if the next batch is to be timed (see :func:`next_stride`; every batch
        while a framework profiler records), else None, the batch then counted as built
        untimed (by the building thread, the recorder's only writer of ``untimed`` outside
        the lock; :meth:`uncount` if it fails). Whether a profiler's module is loaded is
        looked up again at each timed batch: one imported later is seen within a stride."""
        if self.profilers:
            tracing = self.tracing = spans()
            if tracing is not None:
                return self
        left = self.left
        if left > 1:
            self.left = left - 1
            recorder = self.recorder
            if recorder is not None:
                recorder.untimed += 1
            return None
        if not _profilers_loaded():
            self.profilers, self.tracing = False, None
        elif not self.profilers:
            self.profilers = True
            self.tracing = spans()
        return self

    def record(self, handoff: int, idle: int, busy: int) -> None:
        """Files the timed batch just built, with its hand-off, idle and busy times (called
        with the pipeline's lock held), and draws when to time the next (all a worker
        process's clock does: it has no recorder). Never raises: a worker must not die of its
        statistics."""
        try:
            recorder = self.recorder
            if recorder is not None:
                recorder.add((self.sample, self.read, self.transform, handoff, idle, busy,
                              self.nbytes, self.cold))
            self.left = next_stride(busy, self.rng)
        except Exception:
            pass

    def uncount(self) -> None:
        """Takes back the count of an untimed batch whose build failed."""
        recorder = self.recorder
        if recorder is not None and recorder.untimed > 0:
            recorder.untimed -= 1


def _profilers_loaded() -> bool:
    """Whether torch's or JAX's profiler module is loaded (whether :func:`spans` can give
    ranges at all)."""
    modules = sys.modules
    return "torch.autograd.profiler" in modules or "jax.profiler" in modules


class _Totals:
    """A recorder's (or several recorders') cumulative figures."""

    __slots__ = ("busy", "cold", "hists", "nbytes")

    def __init__(self, hists: list[_Hist], busy: int, nbytes: int, cold: int) -> None:
        self.hists, self.busy, self.nbytes, self.cold = hists, busy, nbytes, cold

    @staticmethod
    def empty() -> _Totals:
        return _Totals([_Hist() for _ in BUILD_STAGES], 0, 0, 0)

    def merged(self, other: _Totals) -> _Totals:
        return _Totals([a.merged(b) for a, b in zip(self.hists, other.hists, strict=True)],
                       self.busy + other.busy, self.nbytes + other.nbytes,
                       self.cold + other.cold)


class _Consumer:
    """The consumer's ``next()`` calls: each timed one's wait, how many batches were ready when
    it asked, and how many calls it stands for (itself and the ``untimed`` ones before it).
    The first call (the workers' start) is kept apart. Written and read with the collector's
    lock held (several consumer threads may share a loader)."""

    __slots__ = ("first_end", "hist", "last_end", "pending", "queue", "startup", "untimed")

    def __init__(self, capacity: int) -> None:
        self.pending: list[int] = []  # (wait ns, batches ready, weight) per timed call, flat
        self.hist = _Hist()
        self.queue = np.zeros(capacity + 2, np.int64)  # how many calls found n batches ready
        self.startup: int | None = None
        self.first_end = 0
        self.last_end = 0  # when the last timed call returned
        self.untimed = 0

    def fold(self) -> None:
        pending = self.pending
        if not pending:
            return
        self.pending = []
        columns = np.array(pending, np.int64).reshape(-1, 3).T
        weights = columns[2]
        self.hist.add(columns[0], weights)
        top = len(self.queue) - 1
        self.queue += np.bincount(np.minimum(columns[1], top), weights,
                                  minlength=top + 1).astype(np.int64)

    def wait(self) -> _Hist:
        """The waits so far, the untimed calls since the last timed one included."""
        self.fold()
        return self.hist.extrapolated(self.untimed)


@dataclass(frozen=True)
class _Cumulative:
    at: int
    workers: _Totals
    wait: _Hist
    queue: np.ndarray
    cpu: int
    worker_cpu: int | None
    machine: tuple[int, int] | None = None  # /proc/stat: busy and all ticks of every core
    pool_cpu: int | None = None  # this process's read threads (loaderx's pools)


class Collector:
    """A pipeline's statistics: its workers' recorders, the consumer's, and the snapshots.

    ``mode`` is ``"thread"`` or ``"process"``, ``workers`` their count (0: the consumer
    builds), ``capacity`` the prefetch window, ``lock`` the pipeline's lock (reentrant), which
    the hot path holds whenever it records; ``pids`` gives the worker processes' pids (to read
    their CPU time), ``before`` is called, with the lock held, before each snapshot (the
    process pipeline files the timings its replies brought)."""

    def __init__(self, mode: str, workers: int, capacity: int, lock: Any,
                 pids: Callable[[], list[int]] | None = None) -> None:
        self.mode, self.workers, self.capacity = mode, workers, capacity
        self.cores = usable_cores()
        self.lock = lock
        self.recorders: list[Recorder] = []
        self.threads: list[int] = []  # the worker threads' native ids
        self.consumer = _Consumer(capacity)
        self.left = 1  # the consumer's calls from the next one to the next timed one
        self.profilers = False  # whether a profiler's module was loaded at the last timed one
        self.rng = random.Random()
        self.pids = pids
        self.before: Callable[[], None] | None = None
        self.base: _Cumulative | None = None   # at the end of the first next()
        self.last: _Cumulative | None = None   # at the last snapshot
        # The workers' CPU time (ns) as last read, by /proc path: a thread or process that
        # ended keeps its last reading.
        self.cpu_seen: dict[str, int] = {}
        self.pool_seen: dict[str, int] = {}  # the same for this process's read threads

    # -- workers -----------------------------------------------------------------------------

    def clock(self, native_id: int | None = None) -> Clock:
        """A new recorder for one building thread (registered here), and its clock."""
        recorder = Recorder()
        with self.lock:
            self.recorders.append(recorder)
            if native_id is not None:
                self.threads.append(native_id)
        return Clock(self, recorder)

    def remote(self, count: int) -> list[Recorder]:
        """Recorders for ``count`` worker processes, fed from their replies."""
        recorders = [Recorder() for _ in range(count)]
        with self.lock:
            self.recorders.extend(recorders)
        return recorders

    # -- the consumer ------------------------------------------------------------------------

    def begin(self) -> tuple[int, Any] | None:
        """A ``next()`` starts: its start time and its trace range (or None), or None if this
        call goes untimed (see :func:`next_stride`) -- the caller then reports it with
        :meth:`skipped`. Several consumer threads may race on the countdown: it only decides
        which calls are timed, the counting is done under the lock."""
        trace = spans() if self.profilers else None
        if trace is None:
            left = self.left
            if left > 1:
                self.left = left - 1
                return None
            self.profilers = _profilers_loaded()  # (looked up again at each timed call)
            if not self.profilers:
                return _ns(), None
            trace = spans()
            if trace is None:
                return _ns(), None
        span = trace("loaderx.next")
        span.__enter__()
        return _ns(), span

    def end(self, began: tuple[int, Any], ready: int) -> None:
        """The ``next()`` that ``began`` returns a batch, having found ``ready`` ready (called
        with the lock held)."""
        start, span = began
        now = _ns()
        consumer = self.consumer
        if consumer.startup is not None:
            weight = consumer.untimed + 1
            consumer.untimed = 0
            pending = consumer.pending
            pending.extend((now - start, ready, weight))
            if len(pending) >= 3 * FOLD_EVERY:
                consumer.fold()
            # The calls' mean period since the last timed one sets when to time the next.
            self.left = next_stride((now - consumer.last_end) // weight, self.rng)
        else:
            consumer.startup = now - start
            consumer.first_end = now
            self._mark_start(now)
        consumer.last_end = now
        if span is not None:
            span.__exit__(None, None, None)

    def skipped(self) -> None:
        """Counts a ``next()`` that went untimed and returned a batch (called with the lock
        held)."""
        self.consumer.untimed += 1

    def abandon(self, began: tuple[int, Any]) -> None:
        """The ``next()`` that ``began`` raised."""
        span = began[1]
        if span is not None:
            span.__exit__(None, None, None)

    def _mark_start(self, now: int) -> None:
        pool = self._pool_cpu()  # (the parts before the whole: see _cpu)
        cpu, workers = self._cpu()
        with self.lock:
            if self.base is None:
                self.base = _Cumulative(now, _Totals.empty(), _Hist(),
                                        np.zeros_like(self.consumer.queue), cpu, workers,
                                        _machine(), pool)

    # -- snapshots ---------------------------------------------------------------------------

    def _cpu(self) -> tuple[int, int | None]:
        """CPU time so far (ns): of this process and the worker processes; and of the
        workers alone (threads or processes; None with no workers or where unknown). The
        process's own time is read last: it then covers every thread's reading before it."""
        if self.workers == 0:
            return time.process_time_ns(), None
        if self.mode == "process":
            roots = [f"/proc/{pid}" for pid in (self.pids() if self.pids is not None else [])]
        else:
            with self.lock:
                roots = [f"/proc/self/task/{tid}" for tid in self.threads]
        readings = [(root, _task_cpu(root)) for root in roots]
        own = time.process_time_ns()
        with self.lock:
            seen = self.cpu_seen
            for root, value in readings:
                if value is not None:
                    seen[root] = max(value, seen.get(root, 0))
            if not seen:
                return own, None
            spent = sum(seen.values())
        return (own + spent if self.mode == "process" else own), spent

    def _pool_cpu(self) -> int | None:
        """CPU time so far (ns) of this process's read threads -- loaderx's pools, which do
        the gathers of thread workers and of the consumer -- or None for process workers
        (their pools are counted with them) or where the system does not tell."""
        if self.mode == "process":
            return None
        readings = [(root, _task_cpu(root)) for root in _pool_threads()]
        with self.lock:
            seen = self.pool_seen
            for root, value in readings:
                if value is not None:
                    seen[root] = max(value, seen.get(root, 0))
            return sum(seen.values()) if seen else None

    def _cumulative(self) -> _Cumulative:
        with self.lock:
            if self.before is not None:
                self.before()
            totals = _Totals.empty()
            for r in self.recorders:
                totals = totals.merged(r.totals())
            consumer = self.consumer
            wait, queue = consumer.wait(), consumer.queue.copy()
        pool = self._pool_cpu()  # (the parts before the whole: see _cpu)
        cpu, workers = self._cpu()
        return _Cumulative(_ns(), totals, wait, queue, cpu, workers, _machine(), pool)

    def snapshot(self) -> LoaderStats:
        """Everything since the start, and since the last snapshot."""
        now = self._cumulative()
        with self.lock:
            base, last = self.base, self.last
            self.last = now
            startup = self.consumer.startup
        def period(before: _Cumulative | None) -> Period:
            return _period(before, now, mode=self.mode, workers=self.workers,
                           cores=self.cores, capacity=self.capacity)

        if base is None:  # no batch delivered yet
            empty = period(None)
            return LoaderStats(True, self.mode, self.workers, None, empty, empty)
        since_start = period(base)
        since_last = period(last if last is not None and last.at > base.at else base)
        return LoaderStats(True, self.mode, self.workers,
                           None if startup is None else startup / 1e9, since_start, since_last)


def _machine() -> tuple[int, int] | None:
    """The machine's busy and total CPU ticks so far, all cores (``/proc/stat``; steal time
    counts as busy: those cycles are not this machine's to use), or None where unknown."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(fields) < 8:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


#: What loaderx's native pools call their threads (``zrecord::pool``: ``loaderx-<i>`` and
#: ``loaderx-io-<i>``).
POOL_THREAD_PREFIX = "loaderx-"


def _pool_threads() -> list[str]:
    """The ``/proc`` roots of this process's read threads, found by name."""
    roots: list[str] = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return roots
    for tid in tids:
        root = f"/proc/self/task/{tid}"
        try:
            with open(f"{root}/comm") as f:
                if f.read().startswith(POOL_THREAD_PREFIX):
                    roots.append(root)
        except OSError:
            continue  # (a thread that ended)
    return roots


def _task_cpu(root: str) -> int | None:
    """A process's or thread's CPU time in ns (``schedstat``, else ``stat``), None if gone."""
    try:
        with open(f"{root}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"{root}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // ticks
    except (OSError, ValueError, IndexError):
        return None


# -- what a snapshot shows -----------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """One stage over a period: how many times it ran, its total, mean, median, 99th
    percentile and largest duration, in seconds (``largest`` is since the start), and
    ``timed``: how many of the ``count`` runs were timed -- all of them when runs take
    :data:`TIME_ALL_ABOVE_NS` or more, else a random sample that the total, mean and
    percentiles are estimated from (see :mod:`loaderx._loader.stats`)."""

    count: int
    total: float
    mean: float
    p50: float
    p99: float
    largest: float
    timed: int = 0

    @staticmethod
    def of(hist: _Hist) -> Stage:
        n = hist.count
        return Stage(n, hist.total / 1e9, hist.total / n / 1e9 if n else 0.0,
                     hist.quantile(0.5) / 1e9, hist.quantile(0.99) / 1e9,
                     hist.largest / 1e9 if n else 0.0, hist.timed)


@dataclass(frozen=True)
class Period:
    """The loader over one period: since the first batch, or since the last ``stats()``.

    * ``seconds`` -- its wall time; ``batches`` -- batches the consumer took (the first
      ``next()`` of the loader, which starts the workers, is not counted: see
      ``LoaderStats.startup``); ``built`` -- batches the workers built (seeks drop some);
      ``batches_per_second``.
    * ``stages`` -- :class:`Stage` per stage name (``sample``, ``read``, ``transform``,
      ``handoff``, ``idle``, ``wait``; see :mod:`loaderx._loader.stats`).
    * ``bytes_read`` -- bytes the gathers wrote; ``from_device`` -- batches whose reads went
      to the device rather than the page cache (as the stores' ``recently_cold`` tells).
      Like the stages' totals, both are estimated from the timed batches when fast batches
      are sampled (``stages["read"].timed < built``), and exact otherwise.
    * ``waited`` -- the fraction of the wall time the consumer spent waiting in ``next()``.
    * ``queue_mean`` -- batches ready, on average, when ``next()`` was called (process
      workers: those whose replies were read); ``queue_empty`` -- the fraction of calls that
      found none; ``queue_capacity`` -- the prefetch window.
    * ``workers``, ``busy`` -- the workers' mean busy fraction (building or handing over,
      not waiting for a slot); None without workers.
    * ``cores``, ``cores_busy`` -- the usable cores and how many were busy on average (this
      process and its worker processes); ``worker_cores`` -- those of the workers alone;
      ``pool_cores`` -- those of this process's read threads (loaderx's pools: the gathers of
      thread workers and of the consumer; None with worker processes, whose own count them);
      ``machine_busy`` -- the fraction of the whole machine's CPU time that was busy, every
      process counted (None where the system does not tell).
    """

    seconds: float
    batches: int
    built: int
    stages: dict[str, Stage]
    bytes_read: int
    from_device: int
    waited: float
    queue_mean: float
    queue_empty: float
    queue_capacity: int
    workers: int
    busy: float | None
    cores: int
    cores_busy: float | None
    worker_cores: float | None
    mode: str = "thread"
    machine_busy: float | None = None
    pool_cores: float | None = None

    @property
    def batches_per_second(self) -> float:
        return self.batches / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "stages"}
        out["batches_per_second"] = self.batches_per_second
        out["stages"] = {name: dict(stage.__dict__) for name, stage in self.stages.items()}
        return out


def _period(before: _Cumulative | None, now: _Cumulative, *, mode: str, workers: int,
            cores: int, capacity: int) -> Period:
    if before is None:
        stages = {name: Stage.of(_Hist()) for name in STAGES}
        return Period(0.0, 0, 0, stages, 0, 0, 0.0, 0.0, 0.0, capacity, workers, None, cores,
                      None, None, mode, None)
    seconds = max(1e-9, (now.at - before.at) / 1e9)
    hists = [a.minus(b) for a, b in zip(now.workers.hists, before.workers.hists, strict=True)]
    wait = now.wait.minus(before.wait)
    stages = {name: Stage.of(h) for name, h in zip(BUILD_STAGES, hists, strict=True)}
    stages["wait"] = Stage.of(wait)
    queue = [int(n) for n in now.queue - before.queue]
    calls = sum(queue)
    busy = None
    if workers:
        busy = min(1.0, (now.workers.busy - before.workers.busy) / 1e9 / (workers * seconds))
    cores_busy = max(0.0, (now.cpu - before.cpu) / 1e9 / seconds)
    worker_cores = None
    if now.worker_cpu is not None and before.worker_cpu is not None:
        worker_cores = max(0.0, (now.worker_cpu - before.worker_cpu) / 1e9 / seconds)
    pool_cores = None
    if now.pool_cpu is not None:
        pool_cores = max(0.0, (now.pool_cpu - (before.pool_cpu or 0)) / 1e9 / seconds)
    machine = None
    if now.machine is not None and before.machine is not None \
            and now.machine[1] > before.machine[1]:
        machine = min(1.0, max(0.0, (now.machine[0] - before.machine[0])
                               / (now.machine[1] - before.machine[1])))
    return Period(
        seconds=seconds, batches=wait.count, built=hists[0].count, stages=stages,
        bytes_read=now.workers.nbytes - before.workers.nbytes,
        from_device=now.workers.cold - before.workers.cold,
        waited=min(1.0, wait.total / 1e9 / seconds),
        queue_mean=sum(n * c for n, c in enumerate(queue)) / calls if calls else 0.0,
        queue_empty=queue[0] / calls if calls else 0.0, queue_capacity=capacity,
        workers=workers, busy=busy, cores=cores, cores_busy=cores_busy,
        worker_cores=worker_cores, mode=mode, machine_busy=machine, pool_cores=pool_cores)


# -- the verdict ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """``input_bound``: whether the consumer waited for its batches (at least
    :data:`INPUT_BOUND` of the time); ``limit``: the stage that took most of the workers'
    time when it did (``"sample"``, ``"read"``, ``"transform"``, ``"handoff"``), else None;
    ``advice``: the change to make (``"raise num_workers"``, ...), ``text``: all of it in
    words."""

    input_bound: bool | None
    limit: str | None
    advice: str
    text: str


_ADVICE = {
    "transform": "make the transform cheaper, or move its work onto the device",
    "read": "store the data raw (no decode) or in fewer, larger records",
    "sample": "use larger batches (sampling costs per batch)",
    "handoff": "return fewer, larger arrays from the transform, or use worker_mode='thread' "
               "if the transform releases the GIL",
}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _cores_busy(p: Period) -> tuple[bool, str]:
    """Whether the cores are busy -- by this loader's processes, or by the machine as a
    whole (other processes take cores too) -- and how busy, in words."""
    own = p.cores_busy
    words = "" if own is None else f"{own:.1f} of {p.cores} cores busy"
    machine = p.machine_busy
    if machine is not None and machine >= MACHINE_BUSY and (own is None
                                                            or own < CORES_BUSY * p.cores):
        return True, (f"the machine {_pct(machine)} busy"
                      + (f", {own:.1f} of {p.cores} by this process" if own is not None
                         else ""))
    return own is not None and own >= CORES_BUSY * p.cores, words


#: A dense record under this many bytes is *narrow*: its read is mostly the fixed cost of a
#: record (a table entry, about 0.1 us), not its bytes.
NARROW_RECORD_BYTES = 256


def read_advice(streams: Any) -> str:
    """What to change when reading ``streams`` (``{name: dataset}``) is the limit: keep narrow
    columns together when several are read a record a value (the per-record cost), store the
    data raw when some is compressed, else read fewer bytes -- never "raw" for raw data."""
    narrow = [name for name, ds in streams.items()
              if getattr(ds, "kind", None) == "dense" and getattr(ds, "column_group", None) is None
              and 0 < getattr(ds, "record_bytes", NARROW_RECORD_BYTES) < NARROW_RECORD_BYTES]
    if len(narrow) >= 2:
        return (f"the per-record cost is the limit: {len(narrow)} columns of records under "
                f"{NARROW_RECORD_BYTES} bytes are each read a record a value; keep narrow "
                "columns together in a column group (from_arrow does so by default; "
                "'loaderx upgrade DIR' rewrites a directory of a store per column)")
    codecs = set()
    for ds in streams.values():
        schema = getattr(ds, "schema", None)
        if isinstance(schema, dict):
            codecs.add(schema.get("codec"))
    if codecs - {"raw", None}:
        return "store the data raw (no decode) or in fewer, larger records"
    return ("read fewer bytes a batch (fewer or smaller columns); the data is stored raw "
            "already, so the copy itself is the cost")


def judge(p: Period, read: str | None = None) -> Verdict:
    """The verdict on period ``p``, by these rules:

    1. Fewer than 3 batches: too few to judge.
    2. The consumer waited less than :data:`INPUT_BOUND` of the wall time: not input-bound.
    3. Otherwise input-bound, and ``limit`` is the worker stage (sample, read, transform,
       hand-off) with the largest total. Then, the first that applies:

       a. ``num_workers=0``: the consumer builds its own batches -- use workers;
       b. the workers were busy less than half the time: they wait for the consumer's
          requests (a bursty consumer: a larger ``prefetch_size``);
       c. the limit is the read and at least :data:`FROM_DEVICE` of the batches came from the
          device: the storage is the limit (more workers keep more reads in flight);
       d. the cores are busy -- at least :data:`CORES_BUSY` of them by this process and its
          workers, or the whole machine :data:`MACHINE_BUSY` busy: the limit's stage is the
          limit (make it cheaper; for the read, ``read`` says how, from the streams: see
          :func:`read_advice`);
       e. thread workers (2 or more) with the GIL on, together on :data:`GIL_HELD_CORES` to
          :data:`GIL_CORES` cores, the transform the limit: the transform holds the GIL -- use
          ``worker_mode="process"``;
       f. else the cores are not all busy: raise ``num_workers`` (a transform that waits --
          sleeps, the network, a device -- with the GIL released, its threads on almost no
          core, is said to wait: more threads keep more waits in flight).
    """
    if p.batches < 3:
        return Verdict(None, None, "", f"too few batches to judge ({p.batches} since the "
                       "first one)")
    waited = f"the consumer waited {_pct(p.waited)} of the time"
    if p.waited < INPUT_BOUND:
        extra = ""
        if p.busy is not None and p.busy < 0.5:
            extra = f"; the workers were busy {_pct(p.busy)} of the time (fewer would do)"
        return Verdict(False, None, "", f"not input-bound: {waited}{extra}")
    totals = {name: p.stages[name].total for name in ("sample", "read", "transform",
                                                      "handoff")}
    limit = max(totals, key=lambda k: totals[k])
    spent = sum(totals.values())
    if p.workers == 0:
        share = totals[limit] / spent if spent > 0 else 0.0
        advice = "use num_workers > 0"
        text = (f"input-bound: {waited}, building each batch itself (num_workers=0; the "
                f"{STAGE_NAMES[limit]} takes {_pct(share)} of it): {advice}")
        return Verdict(True, limit, advice, text)
    share = totals[limit] / (p.workers * p.seconds)
    what = f"the {STAGE_NAMES[limit]} takes {_pct(min(1.0, share))} of the workers' time"
    head = f"input-bound: {waited}; "
    if p.busy is not None and p.busy < 0.5:
        advice = "raise prefetch_size"
        text = (f"{head}the workers were busy only {_pct(p.busy)} of the time ({what}): the "
                f"consumer's demand is bursty or the hand-off is slow; {advice}")
        return Verdict(True, limit, advice, text)
    built = max(1, p.built)
    if limit == "read" and p.from_device / built >= FROM_DEVICE:
        advice = "raise num_workers (more reads in flight) or use faster storage"
        text = (f"{head}{what} and {_pct(p.from_device / built)} of the batches were read from "
                f"the device: the storage is the limit; {advice}")
        return Verdict(True, limit, advice, text)
    busy, cores = _cores_busy(p)
    if busy:
        advice = read if limit == "read" and read else _ADVICE[limit]
        text = (f"{head}{what} and the cores are busy ({cores}): the {limit} is the limit; "
                f"{advice}")
        return Verdict(True, limit, advice, text)
    if (p.mode == "thread" and p.workers >= 2 and limit == "transform" and p.cores >= 2
            and p.worker_cores is not None
            and GIL_HELD_CORES <= p.worker_cores <= GIL_CORES and gil_enabled()):
        advice = "use worker_mode='process'"
        text = (f"{head}{what}, but {p.workers} threads used {p.worker_cores:.1f} cores: the "
                f"transform holds the GIL; {advice}")
        return Verdict(True, limit, advice, text)
    advice = "raise num_workers"
    if limit == "transform" and p.worker_cores is not None and p.workers and \
            p.worker_cores < GIL_HELD_CORES:
        text = (f"{head}{what}, but {p.workers} worker(s) used {p.worker_cores:.1f} cores: the "
                f"transform waits (sleep, I/O) rather than computes; {advice} -- more "
                "workers keep more waits in flight")
        return Verdict(True, limit, advice, text)
    text = f"{head}{what}; {cores or 'the cores are not all busy'}: {advice}"
    return Verdict(True, limit, advice, text)


# -- the snapshot --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoaderStats:
    """A snapshot of a loader's (or a pass's) statistics: ``since_start`` and ``since_last``
    (:class:`Period` s: since the first batch, and since the previous ``stats()`` call --
    the first call's is since the first batch), ``startup`` (seconds the first ``next()``
    took: the workers' start) and the configuration. ``summary()`` is the verdict on
    ``since_last`` in words, ``verdict`` the same as fields, ``print(stats)`` a table and
    the verdict."""

    enabled: bool
    worker_mode: str
    num_workers: int
    startup: float | None
    since_start: Period
    since_last: Period
    notes: tuple[str, ...] = field(default=())
    #: What to change when the read is the limit (:func:`read_advice` of the loader's streams).
    read_advice: str | None = None
    #: How the worker processes started (``"fork"``, ``"forkserver"``, ``"spawn"``); None for
    #: threads, or before they start.
    start_method: str | None = None

    @staticmethod
    def off(mode: str, workers: int) -> LoaderStats:
        empty = _period(None, _Cumulative(0, _Totals.empty(), _Hist(), np.zeros(1, np.int64),
                                          0, None),
                        mode=mode, workers=workers, cores=1, capacity=0)
        return LoaderStats(False, mode, workers, None, empty, empty)

    @property
    def verdict(self) -> Verdict:
        if not self.enabled:
            return Verdict(None, None, "", "statistics are off (DataLoader(stats=False) or "
                           "LOADERX_STATS=0)")
        return judge(self.since_last, self.read_advice)

    def summary(self) -> str:
        """The verdict in a line or two: whether the loop is input-bound, and what to
        change."""
        return self.verdict.text

    def as_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "worker_mode": self.worker_mode,
                "num_workers": self.num_workers, "start_method": self.start_method,
                "startup": self.startup,
                "since_start": self.since_start.as_dict(),
                "since_last": self.since_last.as_dict(), "summary": self.summary()}

    def __str__(self) -> str:
        if not self.enabled:
            return self.summary()
        return format_period(self.since_last, self.since_start, self.worker_mode,
                             self.num_workers, self.startup) + "\n" + self.summary()


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.3f}"


def format_period(p: Period, total: Period, mode: str, workers: int,
                  startup: float | None) -> str:
    """The table ``print(stats)`` shows."""
    who = "the consumer's thread" if workers == 0 else f"{workers} {mode} worker" + \
        ("s" if workers != 1 else "")
    lines = [f"loaderx stats ({who}): {p.batches} batches in {p.seconds:.2f} s since the last "
             f"call ({p.batches_per_second:.1f}/s); {total.batches} in {total.seconds:.2f} s "
             "since the first"
             + (f" (which took {startup:.3f} s)" if startup is not None else "")]
    lines.append(f"  {'stage':<30}{'count':>8}{'timed':>8}{'total s':>10}{'mean ms':>10}"
                 f"{'p50 ms':>10}{'p99 ms':>10}")
    for name in STAGES:
        s = p.stages[name]
        lines.append(f"  {STAGE_NAMES[name]:<30}{s.count:>8}{s.timed:>8}{s.total:>10.3f}"
                     f"{_ms(s.mean):>10}{_ms(s.p50):>10}{_ms(s.p99):>10}")
    mib = p.bytes_read / 2**20
    lines.append(f"  read {mib:.1f} MiB ({mib / p.seconds if p.seconds else 0:.1f} MiB/s); "
                 f"{p.from_device} of {p.built} batches from the device")
    lines.append(f"  queue: {p.queue_mean:.1f} of {p.queue_capacity} batches ready on "
                 f"average, none ready at {_pct(p.queue_empty)} of the calls; consumer waited "
                 f"{_pct(p.waited)} of the time")
    busy = "" if p.busy is None else f"workers busy {_pct(p.busy)}; "
    cores = "" if p.cores_busy is None else f"{p.cores_busy:.1f} of {p.cores} cores busy"
    by = []
    if p.worker_cores is not None:
        by.append(f"{p.worker_cores:.1f} by the workers")
    if p.pool_cores is not None and p.cores_busy is not None:
        by.append(f"{p.pool_cores:.1f} by the read threads")
    if by:
        cores += f" ({', '.join(by)})"
    if busy or cores:
        lines.append(f"  {busy}{cores}")
    return "\n".join(lines)


# -- framework traces ----------------------------------------------------------------------------


class _Ranges:
    """Enters and leaves several context managers as one."""

    __slots__ = ("managers",)

    def __init__(self, managers: list[Any]) -> None:
        self.managers = managers

    def __enter__(self) -> _Ranges:
        for m in self.managers:
            m.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for m in reversed(self.managers):
            try:
                m.__exit__(*exc)
            except Exception:
                pass


#: JAX's TraceAnnotation and its ``is_enabled``, found once ``jax.profiler`` is imported.
_jax: list[Any] = []


def _jax_on() -> Any:
    """JAX's TraceAnnotation while JAX's profiler traces, else None (JAX not imported: None)."""
    if not _jax:
        profiler = sys.modules.get("jax.profiler")
        if profiler is None:
            return None
        annotation = getattr(profiler, "TraceAnnotation", None)
        _jax[:] = [annotation, getattr(annotation, "is_enabled", None)]
    annotation, enabled = _jax
    if enabled is None:
        return None
    try:
        return annotation if enabled() else None
    except Exception:
        return None


def _torch_on() -> Any:
    """torch's ``record_function`` while torch's profiler records, else None. The check is
    torch's own process-wide flag (``torch.autograd._profiler_enabled()`` is per thread, and
    False on every thread when the profiler records all of them)."""
    profiler = sys.modules.get("torch.autograd.profiler")
    if profiler is None:
        return None
    enabled = getattr(profiler, "_is_profiler_enabled", None)
    if enabled is None:
        try:
            enabled = sys.modules["torch"].autograd._profiler_enabled()
        except Exception:
            return None
    return getattr(profiler, "record_function", None) if enabled else None


def spans() -> Callable[[str], Any] | None:
    """A maker of named ranges (``maker("loaderx.read")`` is a context manager) while torch's
    profiler records or JAX's profiler traces; None otherwise, which is what the hot path
    checks. The ranges are on the thread that runs them: JAX records every thread, torch the
    thread that started the profiler -- and every thread with
    ``experimental_config=torch.profiler._ExperimentalConfig(profile_all_threads=True)``."""
    record_function = _torch_on()
    jax_annotation = _jax_on()
    if record_function is None and jax_annotation is None:
        return None

    def maker(name: str) -> _Ranges:
        managers = []
        if record_function is not None:
            managers.append(record_function(name))
        if jax_annotation is not None:
            managers.append(jax_annotation(name))
        return _Ranges(managers)

    return maker
