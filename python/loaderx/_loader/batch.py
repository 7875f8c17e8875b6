"""How one step's batch is built: sample its rows, gather every stream, add the streams'
companion arrays and the pass's mask, run the transform.

Shared by the loader's two kinds of worker: the prefetch threads (:mod:`loaderx.dataloader`)
and the worker processes (:mod:`loaderx.workers`). They differ only in where a batch's memory
comes from, which :class:`Builder` asks a *memory* object for: recycled process-local
buffers for the threads, a shared-memory segment for a process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np

from loaderx import _native
from loaderx._loader.context import BatchContext
from loaderx._loader.private_transform import private_transform
from loaderx._loader.stats import Clock
from loaderx._views.gather import _ragged_layout, _ragged_views
from loaderx.errors import LoaderxTypeError, LoaderxValueError

__all__ = ["Builder", "ContextMaker", "EndlessRows", "Failure", "Job", "Memory", "PassRows", "Rows",
           "stop_iteration"]

_ns = time.perf_counter_ns


class Rows(NamedTuple):
    """This shard's rows of one step: their positions in the global batch (int64), their
    record indices (uint64), and which are real records (None: all of them, no mask)."""

    positions: np.ndarray
    indices: np.ndarray
    valid: np.ndarray | None


class Job(NamedTuple):
    """The transform, and the maker of its ``ctx`` (None: it takes none)."""

    transform: Callable[..., Any]
    context: Callable[[int, np.ndarray, np.ndarray], BatchContext] | None


class Failure:
    """A worker's exception, carried to the consumer with its traceback."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Memory(Protocol):
    """Where a batch's arrays live. ``reserve`` gets the byte size of every stream's part of
    the batch before any is asked for; ``dense`` then returns the leased array of stream ``i``
    and the raw uint8 buffer under it (to fill), ``ragged`` the leased uint8 buffer of a ragged
    stream's records."""

    def reserve(self, sizes: list[int]) -> None: ...

    def dense(self, i: int, shape: tuple[int, ...], dtype: np.dtype[Any],
              rows: int) -> tuple[np.ndarray, np.ndarray]: ...

    def ragged(self, i: int, nbytes: int) -> np.ndarray: ...


def stop_iteration(error: StopIteration, stage: str, step: int) -> RuntimeError:
    """The RuntimeError a StopIteration from a worker's ``stage`` is delivered as."""
    wrapped = RuntimeError(f"{stage} raised StopIteration at step {step}; a DataLoader is "
                           "endless, so this is an error, not the end of the data")
    wrapped.__cause__ = error
    return wrapped


class Stream(NamedTuple):
    """One stream as the builder reads it."""

    name: str
    ds: Any
    ragged: bool
    record_bytes: int     # dense: bytes per record; ragged: 0
    item_shape: tuple[int, ...]
    dtype: np.dtype[Any]


class Builder:
    """Builds step ``step``'s batch: ``rows_of(step)`` gives its rows, ``job`` the transform,
    ``mask_key`` the name of a padded pass's mask (None: no mask), and ``workers`` how many
    builders share the native pool (each splits its gathers into that share of it)."""

    def __init__(self, streams: Mapping[str, Any], rows_of: Callable[[int], Rows], job: Job,
                 workers: int, mask_key: str | None = None) -> None:
        self.rows_of = rows_of
        self.transform, self.context = job
        # A worker thread's own copy of the transform (see private_transform), where it took one.
        self._own = threading.local()
        self.mask_key = mask_key
        self.workers = workers
        self.streams = [
            Stream(name, ds, True, 0, ds.item_shape, ds.dtype) if ds.kind == "ragged"
            else Stream(name, ds, False, ds.record_bytes, ds.item_shape, ds.dtype)
            for name, ds in streams.items()]
        self.names = frozenset(streams)
        # Columns of one column group (loaderx._views.group) are read together: one gather of
        # the group's rows a batch, then each column's values taken out of them.
        self.grouped: dict[int, Any] = {}
        for i, s in enumerate(self.streams):
            group = getattr(s.ds, "column_group", None)
            if group is not None and not s.ragged:
                self.grouped[i] = group
        # The streams' companion arrays (see loaderx.source), merged into each batch.
        self.companions = [getattr(ds, "companions", None) for ds in streams.values()]

    def produce(self, step: int, memory: Memory, clock: Clock | None = None) -> Any:
        """Batch ``step``, transformed. With a ``clock`` (statistics on: see
        :mod:`loaderx._loader.stats`), each stage is timed into it -- and traced as a named range
        while a framework profiler records."""
        if clock is not None:
            return self._produce_timed(step, memory, clock)
        stage = "building the batch"
        try:
            rows = self.rows_of(step)
            batch = self.build(rows.indices, memory)
            if rows.valid is not None and self.mask_key is not None:
                batch[self.mask_key] = rows.valid
            stage = "transform"
            transform = getattr(self._own, "transform", None) or self.transform
            if self.context is None:
                out = transform(batch)
            else:
                out = transform(batch, ctx=self.context(step, rows.positions, rows.indices))
        except StopIteration as e:
            # Raised from next() it would silently end the consumer's `for` loop; made a
            # RuntimeError as PEP 479 does for generators.
            raise stop_iteration(e, stage, step) from e
        return self._masked(out, rows)

    def take_private_transform(self) -> None:
        """Runs this thread's batches with a copy of the transform from a private copy of its
        module, made here, on a free-threaded interpreter (see
        :mod:`loaderx._loader.private_transform`); elsewhere, or for a transform that is not
        a module-level function, nothing changes."""
        own = private_transform(self.transform)
        if own is not None:
            self._own.transform = own

    def _masked(self, out: Any, rows: Rows) -> Any:
        if rows.valid is not None and self.mask_key is not None and isinstance(out, dict) \
                and self.mask_key not in out:
            out[self.mask_key] = rows.valid  # a collate that built a new dict keeps the mask
        return out

    def _produce_timed(self, step: int, memory: Memory, clock: Clock) -> Any:
        """:meth:`produce`, each stage timed into ``clock`` (and traced while a profiler
        records): a few clock reads per batch."""
        ns = _ns
        trace = clock.tracing
        sizes: list[int] = []
        stage = "building the batch"
        try:
            t0 = ns()
            if trace is None:
                rows = self.rows_of(step)
                t1 = ns()
                batch = self.build(rows.indices, memory, sizes)
            else:
                with trace("loaderx.sample"):
                    rows = self.rows_of(step)
                t1 = ns()
                with trace("loaderx.read"):
                    batch = self.build(rows.indices, memory, sizes)
            t2 = ns()
            if rows.valid is not None and self.mask_key is not None:
                batch[self.mask_key] = rows.valid
            stage = "transform"
            transform = getattr(self._own, "transform", None) or self.transform
            ctx = (None if self.context is None
                   else self.context(step, rows.positions, rows.indices))
            if trace is None:
                out = transform(batch) if ctx is None else transform(batch, ctx=ctx)
            else:
                with trace("loaderx.transform"):
                    out = transform(batch) if ctx is None else transform(batch, ctx=ctx)
            t3 = ns()
        except StopIteration as e:
            raise stop_iteration(e, stage, step) from e
        clock.sample, clock.read, clock.transform = t1 - t0, t2 - t1, t3 - t2
        clock.start, clock.finish = t0, t3
        clock.nbytes = sum(sizes)
        clock.cold = self.going_to_disk()
        return self._masked(out, rows)

    def build(self, idx: np.ndarray, memory: Memory,
              sizes: list[int] | None = None) -> dict[str, Any]:
        """Every stream gathered at ``idx`` into ``memory``, plus their companion arrays;
        ``sizes``, if given, gets the byte size of every stream's part."""
        shards = max(1, _native.num_threads() // max(1, self.workers))
        n = len(idx)
        # Ragged streams: the records' lengths first (one call each), so that the whole
        # batch's size is known before any memory is taken.
        layouts: list[tuple[np.ndarray, np.ndarray, int] | None] = []
        if sizes is None:
            sizes = []
        for s in self.streams:
            if s.ragged:
                nbytes = s.ds.record_nbytes(idx)
                offsets, total = _ragged_layout(nbytes)
                layouts.append((nbytes, offsets, total))
                sizes.append(total)
            else:
                layouts.append(None)
                sizes.append(n * s.record_bytes)
        memory.reserve(sizes)
        batch: dict[str, Any] = {}
        group_rows: dict[int, np.ndarray] = {}
        for i, (s, layout, companions) in enumerate(
                zip(self.streams, layouts, self.companions, strict=True)):
            if layout is not None:
                nbytes, offsets, total = layout
                buf = memory.ragged(i, total)
                if n:
                    s.ds.gather_at(idx, buf, offsets)
                batch[s.name] = _ragged_views(buf, offsets, nbytes, s.dtype, s.item_shape)
            else:
                out, raw = memory.dense(i, (n, *s.item_shape), s.dtype, n)
                group = self.grouped.get(i)
                if n and group is not None:
                    rows = group_rows.get(id(group))
                    if rows is None:
                        rows = group_rows[id(group)] = group.read(idx, shards)
                    s.ds.take_field(rows, raw)
                elif n:
                    s.ds.gather_rows(idx, raw, shards)
                batch[s.name] = out
            if companions is not None:
                self._merge(batch, s.name, companions(s.name, idx))
        return batch

    def _merge(self, batch: dict[str, Any], name: str, extra: Any) -> None:
        """Adds the companion arrays stream ``name`` returned for this batch, refusing a name
        that is taken (a stream, another companion, the mask)."""
        if not isinstance(extra, Mapping):
            raise LoaderxTypeError(f"stream {name!r}'s companions() returned "
                                   f"{type(extra).__name__}, not a dict of arrays")
        for key, value in extra.items():
            if key in self.names or key in batch or key == self.mask_key:
                raise LoaderxValueError(
                    f"stream {name!r} adds a companion array {key!r}, a name the batch "
                    "already has (a stream, another companion array or the mask); rename "
                    "the stream or pass another mask_key=...")
            batch[key] = value

    def going_to_disk(self) -> bool:
        """Whether the last reads of some stream found records not in memory: readahead runs
        only then, so a cached store pays nothing for it. Never raises: a closed or broken
        stream is the batch's gather to report."""
        try:
            for s in self.streams:  # a loop, not any() of a generator: asked every step
                if s.ds.recently_cold:
                    return True
        except Exception:
            return False
        return False

    def read_ahead(self, steps: range, last: int | None) -> None:
        """Asks every stream to start reading the records of ``steps`` below ``last`` (None:
        no end) -- a hint: failures are left to the gather that needs the records."""
        try:
            for step in steps:
                if last is not None and step >= last:
                    return
                idx = self.rows_of(step).indices
                for s in self.streams:
                    s.ds.prefetch(idx)
        except Exception:
            return


class EndlessRows:
    """The rows of the endless loader's step: this shard's part of the sampler's batch (an
    object rather than a closure, so that worker processes can be sent it)."""

    def __init__(self, sampler: Any, positions: np.ndarray, refusal: str) -> None:
        self.sampler = sampler
        self.positions = positions
        self.refusal = refusal
        # The shard's rows are contiguous: a slice of the sampler's batch, not a gather of it
        # (none at all for the whole batch).
        self.first, self.last = ((int(positions[0]), int(positions[-1]) + 1) if len(positions)
                                 else (0, 0))
        self.whole = sampler is not None and (self.first, self.last) == (0, sampler.batch_size)

    def __call__(self, step: int) -> Rows:
        if self.sampler is None:
            raise LoaderxValueError(self.refusal)
        batch = self.sampler.batch(step)
        return Rows(self.positions, batch if self.whole else batch[self.first:self.last], None)


class PassRows:
    """The rows of a finite pass's batch ``step``: records ``step * batch_size`` on, this
    shard's contiguous part; a padded pass repeats records from the start to fill its last
    batch and marks the real rows."""

    def __init__(self, length: int, batch_size: int, shard_index: int, per_shard: int,
                 full: int, last: int, pad: bool) -> None:
        self.length, self.batch_size, self.index = length, batch_size, shard_index
        self.per_shard, self.full, self.last, self.pad = per_shard, full, last, pad

    def __call__(self, step: int) -> Rows:
        n = self.per_shard if self.pad or step < self.full else self.last
        positions = np.arange(self.index * n, (self.index + 1) * n, dtype=np.int64)
        records = step * self.batch_size + positions
        indices = (records % self.length).astype(np.uint64)
        return Rows(positions, indices, records < self.length if self.pad else None)


class ContextMaker:
    """Builds the :class:`~loaderx.context.BatchContext` of a step for a ``ctx`` transform."""

    def __init__(self, seed: int, pass_id: int | None, shard_index: int,
                 shard_count: int) -> None:
        self.seed, self.pass_id = seed, pass_id
        self.shard_index, self.shard_count = shard_index, shard_count

    def __call__(self, step: int, rows: np.ndarray, indices: np.ndarray) -> BatchContext:
        return BatchContext(step=step, seed=self.seed, pass_id=self.pass_id,
                            shard_index=self.shard_index, shard_count=self.shard_count,
                            rows=rows, indices=indices)
