"""The endless, step-based DataLoader.

``DataLoader(streams, batch_size=256, num_workers=4, prefetch_size=4, mode="cyclic", seed=42,
transform=identity, start_step=0)`` yields, forever, one batch per step: a dict
``{name: (batch_size, *item_shape) array}`` with every stream gathered at the same record
indices -- for a ragged stream (a :class:`~loaderx.dataset.RaggedDataset`, or a ragged subset
or concatenation) a list of ``batch_size`` arrays of shape ``(n_i, *item_shape)``, one per
record, for the transform to decode, crop or pad. Batch ``k`` is a pure function of ``(seed,
mode, batch_size, dataset length, k)``, so

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
with the same transform; ``len()`` of it is the number of batches. ``epoch(pad=True)`` makes
every batch full -- ``batch_size`` rows globally, ``batch_size // shard_count`` per shard, the
missing rows filled with records repeated from the start of the data (record ``r % length`` at
pass position ``r``: real records, which any transform takes and no model turns into NaN) --
and adds ``batch["mask"]``, a boolean array that is True for the rows that are real (the name is
``mask_key=``; a stream of that name is refused): static shapes for compiled steps and
multi-host evaluation, where ``(metric * mask).sum()`` counts each record once. A pass needs no
sampling, so a cyclic loader whose ``batch_size`` exceeds the data serves ``epoch()`` (one short
batch, or one padded batch) even though its endless ``next()`` refuses.

Several hosts: ``shard_index=i, shard_count=n`` make this process load only its contiguous
slice -- rows ``i * b : (i + 1) * b`` with ``b = batch_size // n`` -- of every global batch
(``batch_size`` stays the global batch size and must divide by ``n``). All processes draw the
same global sequence, so the slices of one step are disjoint and together form the global batch,
and a checkpoint resumes the same global batches on any number of processes or workers. The
``loaderx.sharding`` helpers read ``i`` and ``n`` from JAX or torch.distributed. A pass splits
its last, short batch into ``n`` equal contiguous parts; when that batch does not divide by
``n`` (20 rows on one host, 19 on the next would give each host arrays of another shape),
``epoch()`` refuses and names ``pad=True`` (or ``drop_last=True``).

Random augmentation that resumes: a transform with a parameter named ``ctx`` is called as
``transform(batch, ctx=ctx)`` with a :class:`~loaderx.context.BatchContext`: the step, the
shard, each row's position in the global batch, and NumPy generators derived from the seed and
the step alone (``ctx.rng`` for the batch, ``ctx.record_rngs()`` / ``ctx.record_seeds`` per
row). A resumed, re-sharded or differently threaded run then augments every record exactly as
the uninterrupted one.

Checkpoints: ``state_dict()`` holds only Python ints (version, length, batch size, the mode's
integer, the seed as a signed 64-bit value, step, and ``view``, a signed 64-bit digest of which
subsets the streams are, 0 for whole datasets), so Orbax's ``StandardSave``, ``torch.save``,
JSON and msgpack all take it as is; ``load_state_dict`` also takes version-1 checkpoints (mode
and view as strings) and integers restored as NumPy scalars or 0-d arrays.

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

Processes: ``worker_mode="process"`` builds the batches in ``num_workers`` worker processes
instead (see :mod:`loaderx.workers`), for transforms that run Python per sample and so hold
the GIL: threads serialize on it, processes do not. Each worker opens the streams itself and
builds whole batches -- sample, gather, transform -- straight into anonymous shared memory that
the consumer maps, so arrays (in dicts, lists and tuples; CPU torch tensors too) arrive
without a copy or a pickle; anything else is pickled. The batches, their order, ``seek``,
checkpoints, passes and shards are those of the thread loader. A worker's exception reaches
the consumer with its type and message and the worker's traceback as its ``__cause__``; a
worker that dies (killed, out of memory) is a :class:`~loaderx.errors.WorkerError` naming it
and its step. ``start_method`` picks how workers start (default: ``"fork"`` when forking is
safe -- no other Python thread, no CUDA context -- else ``"forkserver"``; see
:mod:`loaderx.workers.start`; ``loader.start_method`` and ``stats()`` say which ran). For a
transform that releases the GIL (NumPy on whole batches, a gather alone, Pillow's decode)
threads cost less: the process handoff costs tens of microseconds per batch.

``num_workers=None`` (the default) is ``min(4, cores)`` threads or one process per core; on a
free-threaded interpreter (3.13t, 3.14t, the GIL off) one thread per core, and threads are then
the answer to a Python-heavy transform too: they run it in parallel without a handoff between
processes (``worker_mode="process"`` stays available).

Readahead: batch ``k`` is known in advance for every ``k``, so when a step is claimed the
loader can also ask the kernel (``Zrecord.prefetch``) to start reading the records of the next
``readahead`` steps of every stream, as long as the streams' last reads went to the disk. It
holds no memory of its own (the pages are the page cache's), and ``seek`` starts it again from
the new step. The default is ``prefetch_size`` steps with ``num_workers=0``, whose batches are
built on the consumer's thread only when asked for, so that the disk works while the consumer
computes; and off with workers, whose window of ``prefetch_size + num_workers`` steps already
keeps that many batches' reads in flight: over a dataset larger than memory, readahead on top
of the workers read 0.75x of fio's rate on the same file, against 0.86x without
(``scripts/bench_cold.py``, the loader rows; its page-cache reads compete with the workers'
own ``pread`` s on the device and, on 2 cores, for the CPU). Pass ``readahead=N`` to set it.

Memory: the arrays of a batch come from a pool of buffers that are reused once the consumer
has dropped every reference to them (see ``loaderx._views.recycle``); steady state allocates nothing
and touches no fresh pages. Keeping a batch (or a view of it) simply keeps its buffer out of
the pool. A ragged stream's batch is read the same way: the records' lengths from the record
table (one call), then one native gather of them all, back to back, into one buffer leased
from a pool of growing buffers, each record a view of it -- so keeping one record keeps its
batch's buffer, and the buffer returns once no record of the batch is seen any more.

Streams may also add arrays of their own to each batch (``companions``, see
:mod:`loaderx.source`), as a packed token stream adds its segment ids and positions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from loaderx._loader.batch import Builder, ContextMaker, EndlessRows, Failure, Job, PassRows
from loaderx._loader.stats import (
    Clock,
    Collector,
    LoaderStats,
    Period,
    Stage,
    Verdict,
    read_advice,
    stats_default,
)
from loaderx._loader.window import RECHECK_SECONDS, Window, same_process
from loaderx._views.mixture import ordered_streams
from loaderx._views.recycle import BufferPool, GrowingPool
from loaderx._views.source import DenseSource, RaggedSource, is_dense_source, is_ragged_source
from loaderx.errors import LoaderClosedError, LoaderxTypeError, LoaderxValueError
from loaderx.sampler import (
    _MAX_BATCH,
    Mode,
    ModeLike,
    Sampler,
    _integer,
    _mode,
    _u64,
    normalize_seed,
)
from loaderx.workers import Parking, ProcessPipeline, default_workers, parking
from loaderx.workers.start import METHODS

#: What a loader stream may be: anything that implements :class:`loaderx.source.DenseSource`
#: (a DenseDataset, or a dense ConcatDataset or Subset) or
#: :class:`loaderx.source.RaggedSource` (a RaggedDataset, or a ragged ConcatDataset or Subset).
Stream = DenseSource | RaggedSource

#: ``LoaderStats`` and its parts are what ``stats()`` returns, for annotations and isinstance.
__all__ = ["DataLoader", "LoaderStats", "Pass", "Period", "Stage", "Stream", "Verdict"]

_WORKER_MODES = ("thread", "process")

_STATE_VERSION = 2
_STATE_KEYS = ("length", "batch_size", "mode", "seed", "step")
#: close() waits at most this long for all the prefetch threads together.
_JOIN_SECONDS = 1.0
#: Time source of close()'s deadline (a test replaces it).
_clock = time.monotonic


def _identity(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return batch


def _wants_ctx(transform: Callable[..., Any]) -> bool:
    """Whether ``transform`` takes a ``ctx`` keyword (asked once, at construction)."""
    try:
        parameter = inspect.signature(transform).parameters.get("ctx")
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _signed64(value: int) -> int:
    """A 64-bit value in [0, 2**64) as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _state_int(value: Any, key: str) -> int:
    """A checkpoint's integer: a Python or NumPy integer, or a 0-d integer array (what Orbax
    and other array checkpointers restore)."""
    if not isinstance(value, (bool, np.bool_)):
        if isinstance(value, (int, np.integer)):
            return int(value)
        array = np.asarray(value)
        if array.shape == () and array.dtype.kind in "iu":
            return int(array)
    raise LoaderxValueError(f"the checkpoint's {key!r} must be an integer, got "
                            f"{type(value).__name__} ({value!r})")


class DataLoader:
    """Endless batches from one or more streams; see the module documentation.

    Parameters:

    * ``streams`` -- ``{name: dataset}``: :class:`~loaderx.dataset.DenseDataset` or
      :class:`~loaderx.dataset.RaggedDataset` objects, or
      :class:`~loaderx.concat.ConcatDataset` / :class:`~loaderx.subset.Subset` views of them
      (or anything implementing :mod:`loaderx.source`), all of one length; every batch gathers
      each stream at the same indices (a ragged stream as a list of arrays).
    * ``batch_size`` -- records per batch (the global batch when sharded).
    * ``num_workers`` -- prefetch threads or worker processes; ``0`` builds each batch on the
      consumer's thread; None (default): ``min(4, cores)`` threads (one per core on a
      free-threaded interpreter), or one process per core.
    * ``prefetch_size`` -- finished batches kept ready ahead of the consumer.
    * ``mode`` -- ``"cyclic"`` (default: a fresh permutation per cycle), ``"iid"`` (with
      replacement) or ``"sequential"``; also a :class:`~loaderx.sampler.Mode` or 0/1/2.
    * ``seed`` -- any int; the same seed gives the same batches.
    * ``transform`` -- ``batch dict -> anything``, run on the worker threads (the collate step);
      with a parameter named ``ctx`` it is called ``transform(batch, ctx=BatchContext)``.
    * ``start_step`` -- the first step to deliver (as ``seek``).
    * ``shard_index``, ``shard_count`` -- this process's contiguous slice of each global batch.
    * ``readahead`` -- steps whose reads start early while reads go to the disk (default
      ``prefetch_size`` with ``num_workers=0``, else ``0``: off).
    * ``worker_mode`` -- ``"thread"`` (default) or ``"process"``: worker processes, for
      transforms that hold the GIL (see the module documentation).
    * ``start_method`` -- how worker processes start: None or ``"auto"`` (fork when forking is
      safe: no other Python thread runs, no CUDA context exists; else forkserver, with the
      transform's module preloaded), ``"fork"``, ``"forkserver"``, ``"spawn"``.
    * ``stats`` -- record where the time goes, for :meth:`stats` (default on: a few clock
      reads per batch; ``LOADERX_STATS=0`` turns the default off; see :mod:`loaderx._loader.stats`).

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
        num_workers: int | None = None,
        prefetch_size: int = 4,
        mode: ModeLike = "cyclic",
        seed: Any = 42,
        transform: Callable[..., Any] = _identity,
        start_step: int = 0,
        shard_index: int = 0,
        shard_count: int = 1,
        readahead: int | None = None,
        worker_mode: str = "thread",
        start_method: str | None = None,
        stats: bool | None = None,
    ) -> None:
        if not isinstance(streams, Mapping) or not streams:
            raise LoaderxValueError("streams must be a non-empty dict of {name: DenseDataset}")
        for name, ds in streams.items():
            if isinstance(ds, (str, os.PathLike)):
                raise LoaderxTypeError(f"stream {name!r} is a path; open it first: "
                                       f"DenseDataset({os.fspath(ds)!r})")
            if not (is_dense_source(ds) or is_ragged_source(ds)):
                raise LoaderxTypeError(
                    f"stream {name!r} is a {type(ds).__name__}; a stream is a DenseDataset or "
                    "RaggedDataset, a ConcatDataset or Subset of one, or an object with the "
                    "members loaderx.source lists")
        _check_companion_names(streams)
        # Mixtures (loaderx.mixture) set the order: their positions are read in turn.
        self._ordered = ordered_streams(streams, _mode(mode), _u64(batch_size, "batch_size", 1))
        lengths = {name: len(ds) for name, ds in streams.items()}
        if len(set(lengths.values())) != 1:
            raise LoaderxValueError(f"streams must have the same length, got {lengths}")
        length = next(iter(lengths.values()))
        if length == 0:
            raise LoaderxValueError("the streams are empty")
        if not callable(transform):
            raise LoaderxTypeError(f"transform must be callable, got {type(transform).__name__}")
        self._streams = dict(streams)
        if worker_mode not in _WORKER_MODES:
            raise LoaderxValueError(f"worker_mode must be one of {_WORKER_MODES}, got "
                                    f"{worker_mode!r}")
        if start_method not in (None, "auto", *METHODS):
            raise LoaderxValueError(f"start_method must be None, 'auto' or one of {METHODS}, "
                                    f"got {start_method!r}")
        self._worker_mode = worker_mode
        self._start_method = start_method
        self._stats = stats_default() if stats is None else bool(stats)
        self._num_workers = (default_workers(worker_mode) if num_workers is None
                             else _u64(num_workers, "num_workers", 0))
        self._prefetch = _u64(prefetch_size, "prefetch_size", 1)
        self._length = length
        self._batch_size = _u64(batch_size, "batch_size", 1)
        if self._batch_size > _MAX_BATCH:
            raise LoaderxValueError(f"batch_size must be at most {_MAX_BATCH}, "
                                    f"got {self._batch_size}")
        self._mode = _mode(mode)
        self._seed = _integer(seed, "seed")
        # A finite pass does not sample, so a cyclic batch larger than the data is refused only
        # by the endless next(), which would have to draw it without replacement.
        self._sampler: Sampler | None = None
        if not (self._mode is Mode.CYCLIC and self._batch_size > length):
            self._sampler = Sampler(length, self._batch_size,
                                    Mode.SEQUENTIAL if self._ordered else self._mode, self._seed)
        self._shard = _shard_rows(self._batch_size, shard_index, shard_count)
        self._transform = transform
        self._wants_ctx = _wants_ctx(transform)
        if readahead is None:
            ahead = self._prefetch if self._num_workers == 0 else 0
        else:
            ahead = _u64(readahead, "readahead", 0)
        self._readahead = ahead
        index, count, rows = self._shard
        self._positions = np.arange(index * rows, (index + 1) * rows, dtype=np.int64)
        # The worker processes a pass that ran to its end leaves for the next pass.
        self._parking = parking()
        self._pipe = self._pipeline(
            EndlessRows(self._sampler, self._positions, self._cannot_sample()),
            self._job(transform, None), _u64(start_step, "start_step", 0), rows, ahead, None,
            None, None)
        # Stops the threads when the loader is dropped, and at interpreter exit (finalize's
        # atexit hook), so no prefetch thread is inside a gather while the interpreter ends.
        self._finalizer = weakref.finalize(self, _stop_all, self._pipe, self._parking)
        # Prefetchers holding batches taken ahead of the training loop (loaderx.prefetch, e.g.
        # prefetch_to_device): state_dict() points at the first batch they have not handed on,
        # and seek() makes them drop what they hold.
        self._readers_ahead = _ReadersAhead()

    def _pipeline(self, rows_of: Callable[[int], Any], job: Job, start_step: int, rows: int,
                  readahead: int, steps: int | None, mask_key: str | None,
                  pass_id: int | None) -> Any:
        """The thread or process pipeline that builds this loader's (or a pass's) batches."""
        if self._worker_mode == "process" and self._num_workers > 0:
            # What each worker seeds its process-global generators from (with its index):
            # the loader's seed, the pass, where it starts and the shard, so that no two
            # workers -- of this loader, another pass or another host -- draw alike.
            index, _, _ = self._shard
            kind, pass_number = (0, 0) if pass_id is None else (1, pass_id)
            entropy = (normalize_seed(self._seed), kind, pass_number, start_step, index)
            return ProcessPipeline(self._streams, rows_of, job, mask_key, start_step,
                                   self._num_workers, self._prefetch, readahead, steps,
                                   self._start_method, entropy, self._stats, self._parking)
        builder = Builder(self._streams, rows_of, job, self._num_workers, mask_key)
        return _Pipeline(builder, start_step, self._num_workers, self._prefetch, rows,
                         readahead, steps, self._stats)

    def _job(self, transform: Callable[..., Any], pass_id: int | None) -> Job:
        """What the pipeline runs on each batch: the transform, and how to build its ctx."""
        index, count, _ = self._shard
        maker = ContextMaker(self._seed, pass_id, index, count)
        return Job(transform, maker if self._wants_ctx else None)

    def _cannot_sample(self) -> str:
        return (f"cyclic mode draws without replacement, so the endless loader cannot draw "
                f"batches of {self._batch_size} from {self._length} records; loader.epoch() "
                "still reads them (one short batch, or pad=True), or use a batch_size of at "
                f"most {self._length} or mode='iid'")

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> DataLoader:
        return self

    def __next__(self) -> Any:
        if self._sampler is None:
            raise LoaderxValueError(self._cannot_sample())
        return self._pipe.next()

    next = __next__

    def __len__(self) -> int:
        raise LoaderxTypeError("a DataLoader is endless and has no length; count steps instead, or "
                               "use loader.epoch(), a finite pass that has one")

    # -- finite passes -------------------------------------------------------------------------

    def epoch(self, *, drop_last: bool = False, pad: bool = False, mask_key: str = "mask",
              pass_id: int = 0) -> Pass:
        """One finite pass over the streams: every record exactly once, in index order, in
        batches of ``batch_size`` and a last, shorter one (dropped with ``drop_last=True``),
        built by the same number of workers with the same transform, as evaluation and export
        loops want. ``len()`` is the number of batches. The endless position (``step``) is not
        touched.

        ``pad=True``: every batch has ``batch_size`` rows (``batch_size // shard_count`` per
        shard), the last one filled up with records repeated from the start of the data, and
        ``batch[mask_key]`` (default ``"mask"``) is a boolean array, True for the real rows;
        when the transform returns a dict without that key, it is added to it.

        With shards, each process gets its contiguous part of every batch; a last batch that
        does not divide into ``shard_count`` equal parts is refused unless ``pad=True`` or
        ``drop_last=True`` (hosts would otherwise get arrays of different shapes).

        ``pass_id`` keys the random numbers a ``ctx`` transform gets (passes with one
        ``pass_id`` augment alike; another gives other numbers).

        A mixture (:func:`loaderx.mix`) has no end, and a pass is refused: see
        :mod:`loaderx.mixture`."""
        if self._ordered:
            raise LoaderxValueError(
                "a mixture has no end (its small sources cycle, its large ones are drawn "
                "without end), so it has no pass; evaluate on each source's own loader "
                "(DataLoader({'x': source}).epoch()), or take a number of steps")
        return Pass(self, drop_last=bool(drop_last), pad=bool(pad), mask_key=mask_key,
                    pass_id=_u64(pass_id, "pass_id", 0))

    # -- position and checkpoints --------------------------------------------------------------

    @property
    def step(self) -> int:
        """The step of the batch ``next()`` returns next."""
        return self._pipe.step

    def seek(self, step: int) -> None:
        """Makes ``step`` the next batch; prefetched batches are discarded."""
        self._pipe.seek(_u64(step, "step", 0))
        for reader in list(self._readers_ahead):
            reader.source_moved()

    def state_dict(self) -> dict[str, int]:
        """Everything a resumed run needs to continue with exactly the next batch: a flat dict
        of Python ints (no strings, no None), so that any checkpoint takes it, Orbax's
        ``StandardSave`` included. ``mode`` is the mode's integer, ``seed`` the seed as a
        signed 64-bit value (a seed outside int64 as its 64-bit key), ``view`` a signed 64-bit
        digest of which subsets the streams are (0: whole datasets). While a prefetcher
        (``prefetch_to_device``) holds batches taken ahead, ``step`` is the first of them: the
        next batch the training loop gets."""
        step = self.step - sum(reader.held_ahead for reader in list(self._readers_ahead))
        return {"version": _STATE_VERSION, "length": self._length,
                "batch_size": self._batch_size, "mode": int(self._mode),
                "seed": _signed64(normalize_seed(self._seed)), "step": step,
                "view": self._view_id()}

    def _view(self) -> str:
        """Which subsets the streams are ("" when every stream is a whole dataset)."""
        ids = [f"{name}={ds.view_digest}" for name, ds in sorted(self._streams.items())
               if ds.view_digest]
        return ",".join(ids)

    def _view_id(self) -> int:
        """:meth:`_view` as a signed 64-bit integer (0 for whole datasets)."""
        view = self._view()
        if not view:
            return 0
        digest = hashlib.blake2b(view.encode(), digest_size=8, person=b"loaderx.view")
        return _signed64(int.from_bytes(digest.digest(), "little")) or 1

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes at ``state["step"]``. The state must come from a loader with the same seed,
        mode and batch size over streams of the same length and subsets, else
        ``LoaderxValueError``: resuming on changed data would silently give other batches.
        Takes this version's checkpoints and version 1's (mode and view as strings), with
        integers as Python or NumPy integers or 0-d arrays (as checkpointers restore them)."""
        if not isinstance(state, Mapping):
            raise LoaderxValueError(f"state_dict must be a dict, got {type(state).__name__}")
        version = _state_int(state.get("version", 1), "version")
        if not 1 <= version <= _STATE_VERSION:
            raise LoaderxValueError(
                f"the checkpoint has state version {version}; this loaderx reads versions 1 "
                f"to {_STATE_VERSION} (a newer loaderx wrote it: upgrade to resume it)")
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise LoaderxValueError(f"state_dict is missing {', '.join(missing)}")
        length = _state_int(state["length"], "length")
        if length != self._length:
            raise LoaderxValueError(
                f"the checkpoint was taken on streams of {length} records, these hold "
                f"{self._length}; the data changed, so the checkpoint's batch sequence "
                "no longer exists")
        view = state.get("view", "")
        same_view = (view == self._view() if isinstance(view, str)
                     else _state_int(view, "view") == self._view_id())
        if not same_view:
            raise LoaderxValueError(
                "the checkpoint was taken on other subsets of the data (these streams are "
                f"{self._view() or 'whole datasets'!r}); resuming would give other batches")
        mode = state["mode"]
        theirs = {"batch_size": _state_int(state["batch_size"], "batch_size"),
                  "mode": _mode(mode if isinstance(mode, str) else _state_int(mode, "mode")),
                  "seed": _state_int(state["seed"], "seed")}
        ours = {"batch_size": self._batch_size, "mode": self._mode, "seed": self._seed}
        key = {"seed": normalize_seed}
        diff = [f"{name}: {_shown(theirs[name])} in the state, {_shown(ours[name])} here"
                for name in ours
                if key.get(name, _same)(theirs[name]) != key.get(name, _same)(ours[name])]
        if diff:
            raise LoaderxValueError(
                f"the checkpoint is for a differently configured loader ({', '.join(diff)}); "
                "resuming would give other batches"
                + ("" if theirs["batch_size"] == ours["batch_size"] else
                   ". To go on with another batch size, start the new loader at start_step="
                   "rows_seen // new_batch_size (rows_seen = the checkpoint's step * its "
                   "batch_size): a mixture then continues its order exactly; a cyclic loader "
                   "starts another permutation"))
        self.seek(_state_int(state["step"], "step"))

    # -- configuration -------------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def readahead(self) -> int:
        """How many steps past the one a worker claims have their reads started early."""
        return self._readahead

    @property
    def num_workers(self) -> int:
        return self._num_workers

    @property
    def worker_mode(self) -> str:
        """``"thread"`` or ``"process"``: what builds the batches."""
        return self._worker_mode

    @property
    def start_method(self) -> str | None:
        """How the worker processes were started (``"fork"``, ``"forkserver"``, ``"spawn"``);
        None in thread mode and before the first batch."""
        method: str | None = getattr(self._pipe, "start_method", None)
        return method

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' pids (empty in thread mode and before the first batch)."""
        pids: list[int] = self._pipe.worker_pids
        return pids

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
        first = int(self._positions[0])
        return self.global_batch_indices(step)[first:first + len(self._positions)]

    def global_batch_indices(self, step: int) -> np.ndarray:
        """The record indices of the whole global batch ``step``, every shard's rows."""
        if self._sampler is None:
            raise LoaderxValueError(self._cannot_sample())
        return self._sampler.batch(step)

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._pipe.closed

    def stats(self) -> LoaderStats:
        """Where the time went, since the first batch and since the last call: per stage
        (index sampling, store read and decode, transform, hand-off, workers waiting for a
        free slot, the consumer's wait in ``next()``) counts, totals, mean, p50 and p99; bytes
        read and batches read from the device; the prefetch queue's occupancy; the workers'
        busy fraction and the cores busy; the fraction of the time the consumer waited.
        ``stats().summary()`` (and ``print(stats())``) says whether the loop is input-bound
        and what to change. Worker processes report theirs with their batches. Off
        (``stats=False``): a snapshot whose summary says so."""
        return _snapshot(self._pipe, self._worker_mode, self._num_workers, self._streams)

    def close(self) -> None:
        """Stops the prefetch threads, waiting for them a second at most in all (a thread
        still inside a transform then ends on its own, its batch discarded); the datasets stay
        open. Closing twice is harmless; closing from another thread while a ``num_workers=0``
        ``next()`` builds a batch returns at once, and that ``next()`` raises
        ``LoaderClosedError`` when its transform returns. Worker processes (those kept idle
        between passes too) are told to leave, given the same second, then killed, and reaped
        either way."""
        _stop_all(self._pipe, self._parking)

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"DataLoader(streams={list(self._streams)}, batch_size={self._batch_size}, "
                f"mode={self._mode.name.lower()!r}, seed={self._seed}, step={self.step}, "
                f"num_workers={self._num_workers}"
                + (f", shard={self.shard_index}/{self.shard_count}" if self.shard_count > 1
                   else "")
                + f"{', closed' if self.closed else ''})")


class _ReadersAhead:
    """The prefetchers reading a loader ahead (held weakly): ``add``, ``discard`` and iteration
    over a snapshot, safe from several threads. (A ``weakref.WeakSet`` is not: iterating it
    while another thread adds a prefetcher raised "Set changed size during iteration" from
    ``state_dict()``, with the GIL too.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refs: tuple[weakref.ref[Any], ...] = ()

    def add(self, reader: Any) -> None:
        with self._lock:
            self._refs = (*self._live(reader), weakref.ref(reader))

    def discard(self, reader: Any) -> None:
        with self._lock:
            self._refs = self._live(reader)

    def _live(self, leaving: Any) -> tuple[weakref.ref[Any], ...]:
        return tuple(r for r in self._refs if r() is not None and r() is not leaving)

    def __iter__(self) -> Iterator[Any]:
        readers = [r() for r in self._refs]  # one read of a tuple: a consistent snapshot
        return iter([reader for reader in readers if reader is not None])


def _same(value: Any) -> Any:
    return value


def _shown(value: Any) -> str:
    """A configuration value as it is passed in (a mode by its name)."""
    return repr(value.name.lower()) if isinstance(value, Mode) else repr(value)


class Pass:
    """A finite pass over a :class:`DataLoader`'s streams (:meth:`DataLoader.epoch`): an
    iterator of ``len(pass)`` batch dicts, each record once, in index order. It runs its own
    worker threads, stopped when it is exhausted, closed, or dropped."""

    def __init__(self, loader: DataLoader, *, drop_last: bool, pad: bool, mask_key: str,
                 pass_id: int) -> None:
        length, b = loader._length, loader.batch_size
        index, count, per_shard = loader._shard
        full, rest = divmod(length, b)
        steps = full if drop_last or not rest else full + 1
        if pad:
            if not isinstance(mask_key, str):
                raise LoaderxTypeError(f"mask_key must be a str, got {type(mask_key).__name__}")
            if mask_key in loader._streams:
                raise LoaderxValueError(
                    f"mask_key {mask_key!r} is also a stream's name; pass another "
                    "mask_key=... so the mask does not replace the stream")
            if mask_key in _check_companion_names(loader._streams):
                raise LoaderxValueError(
                    f"mask_key {mask_key!r} is also the name of a stream's companion array; "
                    "pass another mask_key=... so the mask does not replace it")
        elif count > 1 and steps > full and rest % count:
            raise LoaderxValueError(
                f"the pass's last batch holds {rest} records, which do not split evenly into "
                f"{count} shards (hosts would get arrays of different shapes); use "
                "loader.epoch(pad=True) -- every batch full, batch['mask'] marking the real "
                "rows -- or drop_last=True")
        # The short last batch of an unpadded pass: each shard's equal contiguous part.
        last = per_shard if pad else rest // count

        rows_of = PassRows(length, b, index, per_shard, full, last, pad)
        self._rows_of = rows_of
        self._len = steps
        self._mode, self._workers = loader.worker_mode, loader.num_workers
        self._streams = loader._streams
        self._done = False
        self._pipe = loader._pipeline(
            rows_of, loader._job(loader._transform, pass_id), 0,
            per_shard if pad or full else last, loader.readahead, steps,
            mask_key if pad else None, pass_id)
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
            # Worker processes, idle now, wait for the loader's next pass (workers/parking.py).
            self._pipe.finish()
            raise

    @property
    def step(self) -> int:
        """The index of the batch ``next()`` returns next."""
        return self._pipe.step

    def stats(self) -> LoaderStats:
        """The pass's statistics, as :meth:`DataLoader.stats` gives the loader's."""
        return _snapshot(self._pipe, self._mode, self._workers, self._streams)

    def batch_indices(self, step: int) -> np.ndarray:
        """The record indices this process loads for batch ``step`` of the pass (padding rows
        included), without loading them: their count is the batch's row count here."""
        step = _u64(step, "step", 0)
        if step >= self._len:
            raise LoaderxValueError(f"the pass has {self._len} batches, not a batch {step}")
        return self._rows_of(step).indices

    def close(self) -> None:
        """Stops the pass's threads; closing twice is harmless."""
        self._pipe.stop()

    def __enter__(self) -> Pass:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop_all(pipe: Any, parking: Parking) -> None:
    """Stops the endless pipeline and ends the worker processes parked between passes."""
    pipe.stop()
    parking.close()


def _snapshot(pipe: Any, mode: str, workers: int, streams: Mapping[str, Any]) -> LoaderStats:
    collector = pipe.collector
    method = getattr(pipe, "start_method", None)
    if collector is None:
        return dataclasses.replace(LoaderStats.off(mode, workers), start_method=method)
    snapshot: LoaderStats = collector.snapshot()
    return dataclasses.replace(snapshot, read_advice=read_advice(streams), start_method=method)


def _check_companion_names(streams: Mapping[str, Any]) -> set[str]:
    """The companion arrays the streams declare (``companion_names``), checked: no name twice,
    none a stream's name. Streams with ``companions`` but no declaration are checked at each
    batch instead."""
    seen: dict[str, str] = {}
    for name, ds in streams.items():
        declare = getattr(ds, "companion_names", None)
        if declare is None:
            continue
        for extra in tuple(declare(name)):
            if not isinstance(extra, str):
                raise LoaderxTypeError(f"stream {name!r} declares a companion array named "
                                       f"{extra!r}; names must be str")
            if extra in streams:
                raise LoaderxValueError(
                    f"stream {name!r} adds a companion array {extra!r} to every batch, which "
                    "is also a stream's name; rename one of the streams")
            if extra in seen:
                raise LoaderxValueError(
                    f"streams {seen[extra]!r} and {name!r} both add a companion array "
                    f"{extra!r} to every batch; rename one of the streams")
            seen[extra] = name
    return set(seen)


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


class _PooledMemory:
    """A prefetch thread's batch memory: each stream's arrays from its pool of recycled
    buffers (see :mod:`loaderx._views.recycle`), a fixed-size one per dense stream, a growing one
    per ragged stream."""

    def __init__(self, builder: Builder, rows: int, keep: int) -> None:
        self.shapes = [(rows, *s.item_shape) for s in builder.streams]
        self.pools: list[Any] = [GrowingPool(keep) if s.ragged else
                                 BufferPool(rows * s.record_bytes, keep)
                                 for s in builder.streams]

    def reserve(self, sizes: list[int]) -> None:
        return

    def dense(self, i: int, shape: tuple[int, ...], dtype: np.dtype[Any],
              rows: int) -> tuple[np.ndarray, np.ndarray]:
        out, raw = self.pools[i].take(self.shapes[i], dtype)
        if rows < self.shapes[i][0]:  # the last batch of a finite pass
            out, raw = out[:rows], raw[:len(raw) // self.shapes[i][0] * rows]
        return out, raw

    def ragged(self, i: int, nbytes: int) -> np.ndarray:
        buf: np.ndarray = self.pools[i].take(nbytes)
        return buf

    def close(self) -> None:
        for pool in self.pools:
            pool.close()


class _Pipeline(Window):
    """The prefetch machinery of the thread workers. Kept apart from :class:`DataLoader` so
    that worker threads hold no reference to the loader: dropping the loader finalizes it and
    stops the threads.

    ``builder`` builds a step's batch; ``steps`` is how many there are (None: endless).
    ``rows`` is the most rows a batch has (a pass's last one may have fewer)."""

    forked_message = ("this DataLoader was created in another process; its threads do not "
                      "survive fork -- create it in the child")

    def __init__(self, builder: Builder, start_step: int, workers: int, prefetch: int,
                 rows: int, readahead: int = 0, steps: int | None = None,
                 stats: bool = False) -> None:
        super().__init__(start_step, steps)
        self.builder = builder
        self.workers = workers
        # Up to `prefetch` finished batches wait while `workers` more are being built.
        self.window = prefetch + workers
        self.memory = _PooledMemory(builder, rows, self.window + 2)
        self.pools = self.memory.pools
        # num_workers=0: consumers on several threads build their steps one at a time, without
        # holding `cond`, so close() never waits behind a transform.
        self.turn = threading.Lock()
        self.readahead = readahead
        self.threads: list[threading.Thread] = []
        # Statistics: each worker thread registers a recorder of its own; with num_workers=0
        # the consumers, who take turns, share one.
        self.collector = Collector("thread", workers, self.window, self.lock) if stats else None
        self.own_clock: Clock | None = (self.collector.clock() if self.collector is not None
                                        and workers == 0 else None)

    @property
    def worker_pids(self) -> list[int]:
        return []

    # -- consumer side -------------------------------------------------------------------------

    def next(self) -> Any:
        if self.workers == 0 and same_process(self.born):
            return self._next_in_process()
        return self.take()

    def _started(self) -> bool:
        return bool(self.threads)

    def _start(self) -> None:
        for i in range(self.workers):
            t = threading.Thread(target=self._work, name=f"loaderx-prefetch-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def finish(self) -> None:
        """A pass ran to its end: its threads stop (nothing of them is kept for later)."""
        self.stop()

    def stop(self) -> None:
        # Held already: this close() runs inside this thread's own critical section further
        # out (a signal handler or a finalizer).
        nested = self.owns()
        with self.cond:
            if self.closed:
                return
            self.closed = True
            self.ready.clear()
            self.notify()
            threads, self.threads = self.threads, []
        me = threading.current_thread()
        # One deadline for all: a thread stuck in a transform costs the wait once, not once
        # per thread. A thread still running afterwards sees `closed` and drops its batch.
        # Called with the lock held further out (`nested`), no thread can finish while
        # this one waits: they end on their own once the lock is free.
        deadline = _clock() + _JOIN_SECONDS
        for t in threads:
            if t is not me and self.pid == os.getpid() and not nested:
                t.join(max(0.0, deadline - _clock()))
        self.memory.close()

    # -- worker side ---------------------------------------------------------------------------

    def _work(self) -> None:
        self.builder.take_private_transform()  # free-threaded: this thread's own module copy
        cond = self.cond
        collector = self.collector
        # Statistics: this thread's own recorder; `idle_from` is when it last had nothing to do.
        clock = None if collector is None else collector.clock(threading.get_native_id())
        ns = time.perf_counter_ns
        idle_from = claimed = ns()
        while True:
            with cond:
                while not self.closed and self.claim >= self.next_step + self.window:
                    cond.wait(RECHECK_SECONDS)  # a nested close() notifies nobody (Window.notify)
                if self.closed or (self.steps is not None and self.claim >= self.steps):
                    return
                step, generation = self.claim, self.generation
                self.claim += 1
                ahead = self.steps_ahead(step, self.readahead)
            if clock is not None and ahead:
                claimed = ns()  # (else the build's own start)
            if ahead and self.builder.going_to_disk():
                self.builder.read_ahead(ahead, self.steps)
            timed = None if clock is None else clock.pick()  # (None: an untimed batch)
            try:
                item = self.builder.produce(step, self.memory, timed)
            except BaseException as e:
                item = Failure(e)
            with cond:
                if self.closed:
                    return
                if generation == self.generation:
                    self.ready[step] = item
                    self.notify()
                if clock is not None:  # (recorded under the lock held anyway)
                    free = ns()
                    if type(item) is not Failure:
                        if timed is not None:
                            start = claimed if ahead else clock.start
                            clock.record(free - clock.finish, start - idle_from, free - start)
                    elif timed is None:
                        clock.uncount()
                    idle_from = free

    def _next_in_process(self) -> Any:
        """``num_workers=0``: the consumer's own thread samples, gathers and transforms each
        step (what a debugger or a profiler needs to see), giving the batches any worker count
        gives. An exception propagates from here as raised and leaves the step unconsumed, so
        the next call builds it again; consumers on several threads take turns. ``cond`` is
        not held while the batch is built: close() returns at once, and the batch is then
        discarded."""
        collector = self.collector
        if collector is None:
            return self._build_in_process(None)
        began = collector.begin()  # (None: an untimed call)
        try:
            return self._build_in_process(began)
        except BaseException:
            if began is not None:
                collector.abandon(began)
            raise

    def _build_in_process(self, began: tuple[int, Any] | None) -> Any:
        clock = self.own_clock
        collector = self.collector
        with self.turn:
            while True:
                with self.cond:
                    if self.closed:
                        raise LoaderClosedError("the DataLoader is closed")
                    step, generation = self.next_step, self.generation
                    if self.steps is not None and step >= self.steps:
                        raise StopIteration
                    ahead = self.steps_ahead(step, self.readahead)
                if ahead and self.builder.going_to_disk():
                    self.builder.read_ahead(ahead, self.steps)
                timed = None if clock is None else clock.pick()  # (None: untimed)
                try:
                    item = self.builder.produce(step, self.memory, timed)
                except BaseException:
                    if clock is not None and timed is None:
                        clock.uncount()
                    raise
                with self.cond:
                    if self.closed:
                        raise LoaderClosedError("the DataLoader was closed while this batch "
                                                "was being built; the batch is discarded")
                    if generation == self.generation:  # else a seek came: build its step
                        if clock is not None and collector is not None:
                            # Before the step is consumed: an interrupt in here leaves it to
                            # be built again, as one in the build does.
                            if timed is not None:
                                clock.record(0, 0, clock.sample + clock.read + clock.transform)
                            if began is None:
                                collector.skipped()
                            else:
                                self._record(began, 0)
                        self.next_step = step + 1
                        return item
