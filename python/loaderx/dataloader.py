"""The endless, step-based DataLoader.

``DataLoader(streams, batch_size=256, num_workers=4, prefetch_size=4, mode="cyclic", seed=42,
transform=identity, start_step=0)`` yields, forever, one batch per step: a dict
``{name: (batch_size, *item_shape) array}`` with every stream gathered at the same record
indices. Batch ``k`` is a pure function of ``(seed, mode, batch_size, dataset length, k)``, so

* batches come out in step order whatever ``num_workers`` is, and the same seed gives the same
  batches;
* ``loader.step`` is the index of the next batch, ``seek(step)`` or ``start_step=`` move it, and
  ``state_dict()`` / ``load_state_dict()`` resume a run exactly where a checkpoint left it.

>>> import numpy as np, tempfile, os
>>> from loaderx.converter import from_numpy
>>> from loaderx.dataset import DenseDataset
>>> root = tempfile.mkdtemp()
>>> _ = from_numpy(os.path.join(root, "x"), np.arange(40, dtype=np.float32).reshape(20, 2))
>>> _ = from_numpy(os.path.join(root, "y"), np.arange(20) % 3)
>>> streams = {"x": DenseDataset(os.path.join(root, "x")),
...            "y": DenseDataset(os.path.join(root, "y"))}
>>> with DataLoader(streams, batch_size=4, seed=0) as loader:
...     batch = next(loader)
...     state = loader.state_dict()
...     after = next(loader)
>>> batch["x"].shape, batch["y"].shape, bool((batch["x"][:, 0] // 2 % 3 == batch["y"]).all())
((4, 2), (4,), True)
>>> with DataLoader(streams, batch_size=4, seed=0) as resumed:
...     resumed.load_state_dict(state)
...     bool((next(resumed)["x"] == after["x"]).all())
True

Finite passes: ``loader.epoch(drop_last=False)`` is an iterator over every record exactly once,
in index order, in batches of ``batch_size`` and a last shorter one, built by the same workers
with the same transform; ``len()`` of it is the number of batches.

Several hosts: ``shard_index=i, shard_count=n`` make this process load only its contiguous
slice -- rows ``i * b : (i + 1) * b`` with ``b = batch_size // n`` -- of every global batch
(``batch_size`` stays the global batch size and must divide by ``n``). All processes draw the
same global sequence, so the slices of one step are disjoint and together form the global batch,
and a checkpoint resumes the same global batches on any number of processes or workers. The
``loaderx.sharding`` helpers read ``i`` and ``n`` from JAX or torch.distributed.

Modes (names, or the reference's integers): ``"sequential"`` (0), ``"iid"`` (1) and ``"cyclic"``
(2). The default is cyclic -- no record twice in a cycle, in a fresh order each cycle (a
cycle drops ``length % batch_size`` records, different ones each time) -- because
it keeps how often each sample is seen even, which sampling with replacement does not over any
short run. See :mod:`loaderx.sampler`.

Threads: ``num_workers`` prefetch threads each build whole batches (sample, gather every
stream, transform) for the steps they claim, up to ``prefetch_size`` batches ahead of the
consumer. ``num_workers=0`` builds each batch on the consumer's thread when ``next()`` asks for
it, as torch's ``num_workers=0`` does: the same batches, with the transform debuggable in
process (its exceptions propagate as raised, and the step is built again on the next call).
A gather releases the GIL and can be split across the store's native pool (one thread
per core, shared by every store in the process). So that the two do not oversubscribe the
cores, each worker splits its gathers into at most ``max(1, pool_threads // num_workers)``
blocks: with as many workers as cores every gather runs on its own worker thread, with fewer
workers each gather also uses the pool. ``loaderx._native.set_num_threads`` (or the
``LOADERX_NUM_THREADS`` variable) sets the pool size.

Readahead: batch ``k`` is known in advance for every ``k``, so when a worker claims a step it
also asks the kernel (``Zrecord.prefetch``) to start reading the records of the next
``readahead`` steps of every stream (default: ``prefetch_size + num_workers``, the window the
workers build ahead; ``0`` turns it off), as long as the streams' last reads went to the disk.
Over a store that does not stay in memory this keeps the disk busy while earlier batches are
built; over a cached store it costs one flag read per batch. It holds no memory of its own (the
pages are the page cache's), never blocks the consumer, and ``seek`` starts it again from the
new step.

Memory: the arrays of a batch come from a pool of buffers that are reused once the consumer
has dropped every reference to them (see ``loaderx._recycle``); steady state allocates nothing
and touches no fresh pages. Keeping a batch (or a view of it) simply keeps its buffer out of
the pool.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from loaderx import _native
from loaderx._recycle import BufferPool
from loaderx.errors import LoaderClosedError, LoaderxTypeError, LoaderxValueError
from loaderx.sampler import Mode, ModeLike, Sampler, _u64
from loaderx.source import DenseSource, is_dense_source

#: What a loader stream may be: anything that implements :class:`loaderx.source.DenseSource`
#: (a DenseDataset, or a dense ConcatDataset or Subset).
Stream = DenseSource

__all__ = ["DataLoader", "Pass", "Stream"]

_STATE_VERSION = 1
_JOIN_SECONDS = 1.0


def _identity(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return batch


class DataLoader:
    """Endless batches from one or more dense streams; see the module documentation.

    Parameters:

    * ``streams`` -- ``{name: dataset}``: :class:`~loaderx.dataset.DenseDataset` objects, or
      dense :class:`~loaderx.concat.ConcatDataset` / :class:`~loaderx.subset.Subset` views, all
      of one length; every batch gathers each stream at the same indices.
    * ``batch_size`` -- records per batch (the global batch when sharded).
    * ``num_workers`` -- prefetch threads; ``0`` builds each batch on the consumer's thread.
    * ``prefetch_size`` -- finished batches kept ready ahead of the consumer.
    * ``mode`` -- ``"cyclic"`` (default: a fresh permutation per cycle), ``"iid"`` (with
      replacement) or ``"sequential"``; also a :class:`~loaderx.sampler.Mode` or 0/1/2.
    * ``seed`` -- any int; the same seed gives the same batches.
    * ``transform`` -- ``batch dict -> anything``, run on the worker threads (the collate step).
    * ``start_step`` -- the first step to deliver (as ``seek``).
    * ``shard_index``, ``shard_count`` -- this process's contiguous slice of each global batch.
    * ``readahead`` -- steps whose reads start early while reads go to the disk (default
      ``prefetch_size + num_workers``; ``0`` off).

    ``transform`` (the collate step) takes the batch dict and returns what ``next()`` yields;
    it runs on the prefetch threads. An exception it raises reaches the consumer at that step
    and closes the loader; a ``StopIteration`` arrives as a ``RuntimeError`` (as PEP 479 has it
    for generators), since the data never runs out. The loader is an iterator; use it as a
    context manager or call :meth:`close` to stop its threads (the datasets stay open).
    """

    def __init__(
        self,
        streams: Mapping[str, Stream],
        *,
        batch_size: int = 256,
        num_workers: int = 4,
        prefetch_size: int = 4,
        mode: ModeLike = "cyclic",
        seed: Any = 42,
        transform: Callable[[dict[str, np.ndarray]], Any] = _identity,
        start_step: int = 0,
        shard_index: int = 0,
        shard_count: int = 1,
        readahead: int | None = None,
    ) -> None:
        if not isinstance(streams, Mapping) or not streams:
            raise LoaderxValueError("streams must be a non-empty dict of {name: DenseDataset}")
        for name, ds in streams.items():
            if isinstance(ds, (str, os.PathLike)):
                raise LoaderxTypeError(f"stream {name!r} is a path; open it first: "
                                       f"DenseDataset({os.fspath(ds)!r})")
            if not is_dense_source(ds):
                raise LoaderxTypeError(
                    f"stream {name!r} is a {type(ds).__name__}; the DataLoader reads dense "
                    "streams only (pad ragged records into a dense store first)")
        lengths = {name: len(ds) for name, ds in streams.items()}
        if len(set(lengths.values())) != 1:
            raise LoaderxValueError(f"streams must have the same length, got {lengths}")
        length = next(iter(lengths.values()))
        if length == 0:
            raise LoaderxValueError("the streams are empty")
        if not callable(transform):
            raise LoaderxTypeError(f"transform must be callable, got {type(transform).__name__}")
        self._streams = dict(streams)
        self._num_workers = _u64(num_workers, "num_workers", 0)
        self._prefetch = _u64(prefetch_size, "prefetch_size", 1)
        self._sampler = Sampler(length, batch_size, mode, seed)
        self._sampler.seek(_u64(start_step, "start_step", 0))
        self._shard = _shard_rows(self._sampler.batch_size, shard_index, shard_count)
        ahead = (self._prefetch + self._num_workers if readahead is None
                 else _u64(readahead, "readahead", 0))
        self._pipe = _Pipeline(self._streams, self._sampler, transform, self._num_workers,
                               self._prefetch, self._shard, ahead)
        # Stops the threads when the loader is dropped, and at interpreter exit (finalize's
        # atexit hook), so no prefetch thread is inside a gather while the interpreter ends.
        self._finalizer = weakref.finalize(self, self._pipe.stop)

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> DataLoader:
        return self

    def __next__(self) -> Any:
        return self._pipe.next()

    next = __next__

    def __len__(self) -> int:
        raise LoaderxTypeError("a DataLoader is endless and has no length; count steps instead, or "
                               "use loader.epoch(), a finite pass that has one")

    # -- finite passes -------------------------------------------------------------------------

    def epoch(self, *, drop_last: bool = False) -> Pass:
        """One finite pass over the streams: every record exactly once, in index order, in
        batches of ``batch_size`` and a last, shorter one (dropped with ``drop_last=True``),
        built by the same number of workers with the same transform, as evaluation and export
        loops want. ``len()`` is the number of batches. The endless position (``step``) is not
        touched. With shards, each process gets its contiguous part of every batch
        (``np.array_split`` of the batch into ``shard_count`` parts)."""
        return Pass(self, drop_last)

    # -- position and checkpoints --------------------------------------------------------------

    @property
    def step(self) -> int:
        """The step of the batch ``next()`` returns next."""
        return self._pipe.step

    def seek(self, step: int) -> None:
        """Makes ``step`` the next batch; prefetched batches are discarded."""
        self._pipe.seek(_u64(step, "step", 0))

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue with exactly the next batch: plain
        ints and strings, safe to store in any checkpoint."""
        state = {"version": _STATE_VERSION, **self._sampler.state_dict(), "step": self.step}
        view = self._view()
        if view:
            state["view"] = view
        return state

    def _view(self) -> str:
        """Which subsets the streams are ("" when every stream is a whole dataset)."""
        ids = [f"{name}={ds.view_digest}" for name, ds in sorted(self._streams.items())
               if ds.view_digest]
        return ",".join(ids)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes at ``state["step"]``. The state must come from a loader with the same seed,
        mode and batch size over streams of the same length, else ``ValueError``: resuming on
        changed data would silently give other batches."""
        if isinstance(state, Mapping) and "length" in state and \
                state["length"] != self._sampler.length:
            raise LoaderxValueError(
                f"the checkpoint was taken on streams of {state['length']} records, these hold "
                f"{self._sampler.length}; the data changed, so the checkpoint's batch sequence "
                "no longer exists")
        if isinstance(state, Mapping) and state.get("view", "") != self._view():
            raise LoaderxValueError(
                "the checkpoint was taken on other subsets of the data (view "
                f"{state.get('view', '') or 'whole datasets'!r}, these streams are "
                f"{self._view() or 'whole datasets'!r}); resuming would give other batches")
        # The sampler checks the rest (keys, seed, mode, batch size) and names what differs.
        plain = {k: v for k, v in state.items() if k != "view"} if isinstance(state, Mapping) \
            else state
        self._sampler.load_state_dict(plain)
        self.seek(state["step"])

    # -- configuration -------------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        return self._sampler.batch_size

    @property
    def mode(self) -> Mode:
        return self._sampler.mode

    @property
    def seed(self) -> int:
        return self._sampler.seed

    @property
    def readahead(self) -> int:
        """How many steps past the one a worker claims have their reads started early."""
        return self._pipe.readahead

    @property
    def num_workers(self) -> int:
        return self._num_workers

    @property
    def streams(self) -> dict[str, Stream]:
        return dict(self._streams)

    @property
    def shard_index(self) -> int:
        return self._shard[0]

    @property
    def shard_count(self) -> int:
        return self._shard[1]

    def batch_indices(self, step: int) -> np.ndarray:
        """The record indices this process loads at ``step`` (a uint64 array; its shard of the
        global batch), without loading them."""
        return self._pipe.rows(self._sampler.batch(step))

    def global_batch_indices(self, step: int) -> np.ndarray:
        """The record indices of the whole global batch ``step``, every shard's rows."""
        return self._sampler.batch(step)

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._pipe.closed

    def close(self) -> None:
        """Stops and joins the prefetch threads (within about a second); the datasets stay
        open. Closing twice is harmless."""
        self._pipe.stop()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self._sampler
        return (f"DataLoader(streams={list(self._streams)}, batch_size={s.batch_size}, "
                f"mode={s.mode.name.lower()!r}, seed={s.seed}, step={self.step}, "
                f"num_workers={self._num_workers}"
                + (f", shard={self.shard_index}/{self.shard_count}" if self.shard_count > 1
                   else "")
                + f"{', closed' if self.closed else ''})")


class Pass:
    """A finite pass over a :class:`DataLoader`'s streams (:meth:`DataLoader.epoch`): an
    iterator of ``len(pass)`` batch dicts, each record once, in index order. It runs its own
    worker threads, stopped when it is exhausted, closed, or dropped."""

    def __init__(self, loader: DataLoader, drop_last: bool) -> None:
        length, b = loader._sampler.length, loader.batch_size
        steps = length // b if drop_last else -(-length // b)
        index, count = loader.shard_index, loader.shard_count

        def batch_of(step: int) -> np.ndarray:
            rows = np.arange(step * b, min((step + 1) * b, length), dtype=np.uint64)
            return np.array_split(rows, count)[index] if count > 1 else rows

        rows = -(-b // count)
        self._len = steps
        self._done = False
        self._pipe = _Pipeline(loader._streams, loader._sampler, loader._pipe.transform,
                               loader.num_workers, loader._prefetch, (0, count, rows),
                               loader.readahead, batch_of=batch_of, steps=steps)
        self._pipe.next_step = self._pipe.claim = self._pipe.prefetched_to = 0
        self._finalizer = weakref.finalize(self, self._pipe.stop)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Pass:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        try:
            return self._pipe.next()
        except StopIteration:
            self._done = True  # an exhausted iterator stays exhausted
            self._pipe.stop()
            raise

    @property
    def step(self) -> int:
        """The index of the batch ``next()`` returns next."""
        return self._pipe.step

    def close(self) -> None:
        """Stops the pass's threads; closing twice is harmless."""
        self._pipe.stop()

    def __enter__(self) -> Pass:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shard_rows(batch_size: int, index: Any, count: Any) -> tuple[int, int, int]:
    """(index, count, rows per shard), checked."""
    count = _u64(count, "shard_count", 1)
    index = _u64(index, "shard_index", 0)
    if index >= count:
        raise LoaderxValueError(f"shard_index must be in [0, {count}), got {index}")
    if batch_size % count:
        raise LoaderxValueError(
            f"batch_size {batch_size} (the global batch) does not divide into {count} shards; "
            f"use a multiple of {count}")
    return index, count, batch_size // count


class _Failure:
    """A worker's exception, carried to the consumer with its traceback."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _stop_iteration(error: StopIteration, stage: str, step: int) -> RuntimeError:
    """The RuntimeError a StopIteration from a worker's ``stage`` is delivered as."""
    wrapped = RuntimeError(f"{stage} raised StopIteration at step {step}; a DataLoader is "
                           "endless, so this is an error, not the end of the data")
    wrapped.__cause__ = error
    return wrapped


class _Pipeline:
    """The prefetch machinery. Kept apart from :class:`DataLoader` so that worker threads hold
    no reference to the loader: dropping the loader finalizes it and stops the threads."""

    def __init__(self, streams: dict[str, Stream], sampler: Sampler,
                 transform: Callable[..., Any], workers: int, prefetch: int,
                 shard: tuple[int, int, int], readahead: int = 0,
                 batch_of: Callable[[int], np.ndarray] | None = None,
                 steps: int | None = None) -> None:
        index, _, rows = shard
        self.first_row, self.rows_per_shard = index * rows, rows
        # The record indices of step k (this shard's rows), and how many steps there are (None:
        # endless). A finite pass has its own; batches may then be shorter than `rows`.
        self.batch_of = batch_of or (lambda step: self.rows(self.sampler.batch(step)))
        self.steps = steps
        self.streams = [(name, ds, ds.gather_rows, ds.record_bytes, (rows, *ds.item_shape),
                         ds.dtype)
                        for name, ds in streams.items()]
        self.sampler = sampler
        self.transform = transform
        self.workers = workers
        # Up to `prefetch` finished batches wait while `workers` more are being built.
        self.window = prefetch + workers
        keep = self.window + 2
        self.pools = [BufferPool(rows * ds.record_bytes, keep)
                      for _, ds, *_ in self.streams]
        self.cond = threading.Condition()
        self.ready: dict[int, Any] = {}
        self.next_step = sampler.step  # the consumer's position
        self.claim = self.next_step    # the next step a worker will build
        self.generation = 0            # bumped by seek, so stale work is dropped
        self.readahead = readahead
        self.prefetched_to = self.claim  # steps below this were asked for already
        self.threads: list[threading.Thread] = []
        self.closed = False
        self.pid = os.getpid()

    @property
    def step(self) -> int:
        return self.next_step

    # -- consumer side -------------------------------------------------------------------------

    def next(self) -> Any:
        if self.pid != os.getpid():
            raise LoaderClosedError("this DataLoader was created in another process; its "
                                    "threads do not survive fork -- create it in the child")
        if self.workers == 0:
            return self._next_in_process()
        taken = False
        try:
            with self.cond:
                if self.closed:
                    raise LoaderClosedError("the DataLoader is closed")
                if self.steps is not None and self.next_step >= self.steps:
                    raise StopIteration
                if not self.threads:
                    self._start()
                # Several threads may consume one loader: each takes whichever step is next
                # when it is ready, so the position is read again after every wait.
                while self.next_step not in self.ready:
                    if self.closed:
                        raise LoaderClosedError("the DataLoader was closed while waiting")
                    self.cond.wait()
                step, generation = self.next_step, self.generation
                item = self.ready[step]
                failed = isinstance(item, _Failure)
                # No call from here to `taken = True`: a signal handler runs only after a call
                # or at a backward jump, so an interrupt cannot land between consuming the step
                # and recording that it was (dict.pop would open such a gap). From here to the
                # return, every call is inside this try.
                del self.ready[step]
                self.next_step = step + 1
                taken = True
                self.cond.notify_all()
        except BaseException:
            # An interrupt (KeyboardInterrupt from a signal handler inside notify_all or the
            # condition's __enter__/__exit__, which are Python code) must neither lose a
            # consumed step nor leave the lock held.
            self._recover((step, generation, item) if taken else None)
            raise
        if failed:
            self.stop()
            raise item.error
        return item

    def _recover(self, consumed: tuple[int, int, Any] | None) -> None:
        """Cleans up after an exception in :meth:`next`: releases the lock if an interrupt
        left it held, and puts back a step that was consumed but not delivered, so the next
        call returns it and ``state_dict()`` still points at it."""
        cond = self.cond
        # Held here only if the interrupt came inside __enter__ after it acquired the lock, or
        # inside __exit__ before it released it: then nothing else will release it.
        held = cond._is_owned()  # type: ignore[attr-defined]  # private, but in every 3.x
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
                cond.notify_all()  # another consumer may be waiting for this step
        finally:
            cond.release()

    def seek(self, step: int) -> None:
        with self.cond:
            self.generation += 1
            self.ready.clear()
            self.next_step = self.claim = self.prefetched_to = step
            self.cond.notify_all()

    def _start(self) -> None:
        for i in range(self.workers):
            t = threading.Thread(target=self._work, name=f"loaderx-prefetch-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        with self.cond:
            if self.closed:
                return
            self.closed = True
            self.ready.clear()
            self.cond.notify_all()
            threads, self.threads = self.threads, []
        me = threading.current_thread()
        for t in threads:
            if t is not me and self.pid == os.getpid():
                t.join(_JOIN_SECONDS)
        for pool in self.pools:
            pool.close()

    # -- worker side ---------------------------------------------------------------------------

    def _work(self) -> None:
        cond = self.cond
        while True:
            with cond:
                while not self.closed and self.claim >= self.next_step + self.window:
                    cond.wait()
                if self.closed or (self.steps is not None and self.claim >= self.steps):
                    return
                step, generation = self.claim, self.generation
                self.claim += 1
                ahead = self._steps_ahead(step)
            if ahead and self._going_to_disk():
                self._read_ahead(ahead)
            try:
                item = self._produce(step)
            except BaseException as e:
                item = _Failure(e)
            with cond:
                if self.closed:
                    return
                if generation == self.generation:
                    self.ready[step] = item
                    cond.notify_all()

    def _produce(self, step: int) -> Any:
        """Batch ``step``, transformed."""
        stage = "building the batch"
        try:
            batch = self._build(step)
            stage = "transform"
            return self.transform(batch)
        except StopIteration as e:
            # Raised from next() it would silently end the consumer's `for` loop; made a
            # RuntimeError as PEP 479 does for generators.
            raise _stop_iteration(e, stage, step) from e

    def _next_in_process(self) -> Any:
        """``num_workers=0``: the consumer's own thread samples, gathers and transforms each
        step (what a debugger or a profiler needs to see), giving the batches any worker count
        gives. An exception propagates from here as raised and leaves the step unconsumed, so
        the next call builds it again; consumers on several threads take turns."""
        with self.cond:
            if self.closed:
                raise LoaderClosedError("the DataLoader is closed")
            step = self.next_step
            if self.steps is not None and step >= self.steps:
                raise StopIteration
            ahead = self._steps_ahead(step)
            if ahead and self._going_to_disk():
                self._read_ahead(ahead)
            item = self._produce(step)
            self.next_step = step + 1
            return item

    def _steps_ahead(self, step: int) -> range:
        """The steps after ``step`` that nobody has asked the kernel for yet, now marked as
        asked for. Called under the condition."""
        ahead = range(max(self.prefetched_to, step + 1), step + 1 + self.readahead)
        self.prefetched_to = max(self.prefetched_to, ahead.stop)
        return ahead

    def _going_to_disk(self) -> bool:
        """Whether the last reads of some stream found records not in memory: readahead runs
        only then, so a cached store pays nothing for it. Never raises: a closed or broken
        stream is the batch's gather to report."""
        try:
            return any(ds.recently_cold for _, ds, *_ in self.streams)
        except Exception:
            return False

    def _read_ahead(self, steps: range) -> None:
        """Asks every stream to start reading the records of ``steps`` (a hint: failures are
        left to the gather that needs the records)."""
        try:
            for step in steps:
                if self.steps is not None and step >= self.steps:
                    return
                idx = self.batch_of(step)
                for _, ds, *_ in self.streams:
                    ds.prefetch(idx)
        except Exception:
            return

    def rows(self, global_batch: np.ndarray) -> np.ndarray:
        """This shard's contiguous slice of a global batch."""
        return global_batch[self.first_row:self.first_row + self.rows_per_shard]

    def _build(self, step: int) -> dict[str, np.ndarray]:
        idx = self.batch_of(step)
        shards = max(1, _native.num_threads() // max(1, self.workers))
        batch = {}
        for (name, _, gather, row_bytes, shape, dtype), pool in zip(
                self.streams, self.pools, strict=True):
            out, raw = pool.take(shape, dtype)
            if len(idx) < shape[0]:  # the last batch of a finite pass
                out, raw = out[:len(idx)], raw[:len(idx) * row_bytes]
            if len(idx):
                gather(idx, raw, shards)
            batch[name] = out
        return batch

