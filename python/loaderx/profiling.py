"""How fast the loader goes on your data, and what limits it: ``loaderx profile``.

:func:`profile` takes a dataset directory, a store (or several), or a dict of streams, a batch
size and an optional transform (a callable or ``"module:function"``), and measures:

* two ceilings: the store gather alone -- batches of the loader's own indices gathered back to
  back on one thread (the store's native pool splits each gather across the cores), with no
  loader around it -- and the transform alone on one thread, over a few batches gathered
  beforehand (each the best of five short windows, on a thread of its own as a worker's);
* the loader itself at several worker counts (1, 2, 4, ... up to the cores, and the core count)
  in both worker modes, each run a fresh loader taking batches as fast as it gives them for
  ``seconds`` after a warm-up, with its :meth:`~loaderx.dataloader.DataLoader.stats`: batches
  per second and the mean time per batch of every stage.

It stops starting new runs once ``budget`` seconds are spent (the runs left are listed as
skipped), so the default -- two seconds a run, a budget of 50 -- finishes within a minute.
:meth:`Profile.table` is the report, :meth:`Profile.plot` draws batches per second against the
worker count per mode, with the ceilings (matplotlib).

>>> import numpy as np, tempfile, os
>>> from loaderx.converter import from_numpy
>>> path = os.path.join(tempfile.mkdtemp(), "x")
>>> _ = from_numpy(path, np.zeros((512, 8), np.float32))
>>> report = profile(path, batch_size=64, workers=[1], modes=["thread"], seconds=0.1)
>>> [(run.mode, run.workers) for run in report.runs]
[('thread', 1)]
>>> report.runs[0].batches > 0 and report.gather_ceiling > 0
True
"""

from __future__ import annotations

import importlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from loaderx.errors import LoaderxTypeError, LoaderxValueError

__all__ = ["Profile", "ProfileError", "Run", "load_transform", "profile"]

#: Worker modes in the order a profile runs them by default.
MODES = ("thread", "process")
#: The stages whose mean time per batch the table shows.
TABLE_STAGES = ("sample", "read", "transform", "handoff")


class ProfileError(LoaderxValueError):
    """A profile that cannot run: a transform that cannot be found or that raises, a plot
    without matplotlib."""


@dataclass(frozen=True)
class Run:
    """One loader configuration's measurement: ``batches`` taken in ``seconds`` (after the
    warm-up), ``startup`` (seconds to the first batch), the mean seconds per batch of each
    stage (``stages``), the consumer's wait fraction, the workers' busy fraction, the cores
    busy, and the loader's verdict; ``error`` when the run failed (the rest is then zero)."""

    mode: str
    workers: int
    batches: int = 0
    seconds: float = 0.0
    startup: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    waited: float = 0.0
    busy: float | None = None
    cores_busy: float | None = None
    verdict: str = ""
    error: str | None = None

    @property
    def batches_per_second(self) -> float:
        return self.batches / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Profile:
    """What :func:`profile` measured (see the module documentation)."""

    streams: dict[str, str]
    records: int
    batch_size: int
    transform: str | None
    cores: int
    gather_ceiling: float
    transform_ceiling: float | None
    runs: list[Run]
    skipped: list[tuple[str, int]]
    seconds: float

    def best(self) -> Run | None:
        """The fastest run that did not fail."""
        ok = [r for r in self.runs if r.error is None and r.batches]
        return max(ok, key=lambda r: r.batches_per_second) if ok else None

    def as_dict(self) -> dict[str, Any]:
        runs = []
        for r in self.runs:
            entry = dict(r.__dict__)
            entry["batches_per_second"] = r.batches_per_second
            runs.append(entry)
        return {"streams": self.streams, "records": self.records,
                "batch_size": self.batch_size, "transform": self.transform,
                "cores": self.cores, "gather_ceiling": self.gather_ceiling,
                "transform_ceiling": self.transform_ceiling, "runs": runs,
                "skipped": [list(s) for s in self.skipped], "seconds": self.seconds}

    def table(self) -> str:
        """The report: the ceilings, a row per run, the fastest."""
        streams = ", ".join(f"{name} ({what})" for name, what in self.streams.items())
        lines = [f"loaderx profile: {self.records} records, batch {self.batch_size}, "
                 f"{self.cores} cores; streams {streams}; transform "
                 f"{self.transform or 'none (identity)'}"]
        ceiling = f"ceilings: store gather alone {self.gather_ceiling:.1f} batches/s"
        if self.transform_ceiling is not None:
            ceiling += (f"; transform alone on one thread {self.transform_ceiling:.1f} "
                        "batches/s")
        lines += [ceiling, ""]
        lines.append(f"{'mode':<8}{'workers':>8}{'batches/s':>11}{'startup s':>10}  "
                     f"{'ms per batch: sample':>20}{'read':>9}{'transform':>10}"
                     f"{'hand-off':>9}{'waited':>8}{'busy':>6}{'cores':>7}")
        for r in self.runs:
            if r.error is not None:
                lines.append(f"{r.mode:<8}{r.workers:>8}  failed: {r.error}")
                continue
            ms = [r.stages.get(name, 0.0) * 1e3 for name in TABLE_STAGES]
            busy = "-" if r.busy is None else f"{100 * r.busy:.0f}%"
            cores = "-" if r.cores_busy is None else f"{r.cores_busy:.1f}"
            lines.append(f"{r.mode:<8}{r.workers:>8}{r.batches_per_second:>11.1f}"
                         f"{r.startup:>10.2f}  {ms[0]:>20.3f}{ms[1]:>9.3f}{ms[2]:>10.3f}"
                         f"{ms[3]:>9.3f}{100 * r.waited:>7.0f}%{busy:>6}{cores:>7}")
        for mode, workers in self.skipped:
            lines.append(f"{mode:<8}{workers:>8}  skipped: the time budget was spent")
        best = self.best()
        lines.append("")
        if best is None:
            lines.append("no run delivered a batch")
        else:
            limits = [f"{best.batches_per_second / self.gather_ceiling:.2f}x the gather "
                      "ceiling"] if self.gather_ceiling > 0 else []
            if self.transform_ceiling:
                per_worker = best.batches_per_second / best.workers
                limits.append(f"{per_worker / self.transform_ceiling:.2f}x the transform "
                              "ceiling per worker")
            lines.append(f"fastest: {best.mode} workers, num_workers={best.workers}: "
                         f"{best.batches_per_second:.1f} batches/s ({'; '.join(limits)})")
            if best.verdict:
                lines.append(f"  there: {best.verdict}")
        lines.append(f"({self.seconds:.1f} s in all)")
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Draws batches per second against the worker count, a line per mode, with the
        ceilings, into ``path`` (PNG, SVG, PDF by the suffix; written whole or not at all).
        Needs matplotlib (:class:`ProfileError` without it)."""
        pyplot = _pyplot()
        path = os.fspath(path)
        figure, axes = pyplot.subplots(figsize=(7, 4.5))
        try:
            for mode in MODES:
                runs = sorted((r for r in self.runs if r.mode == mode and r.error is None),
                              key=lambda r: r.workers)
                if runs:
                    axes.plot([r.workers for r in runs], [r.batches_per_second for r in runs],
                              marker="o", label=f"{mode} workers")
            counts = sorted({r.workers for r in self.runs}) or [1]
            axes.axhline(self.gather_ceiling, linestyle="--", color="grey",
                         label="store gather alone")
            if self.transform_ceiling:
                axes.plot(counts, [self.transform_ceiling * n for n in counts], linestyle=":",
                          color="black", label="transform alone x workers")
            axes.set_xlabel("num_workers")
            axes.set_ylabel("batches/s")
            axes.set_xticks(counts)
            axes.set_ylim(bottom=0)
            axes.set_title(f"loaderx profile: batch {self.batch_size}, "
                           f"{self.transform or 'identity'}")
            axes.legend()
            axes.grid(alpha=0.3)
            figure.tight_layout()
            _write_whole(path, lambda f: figure.savefig(f, format=_format_of(path)))
        finally:
            pyplot.close(figure)


def _format_of(path: str) -> str:
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    return suffix or "png"


def _write_whole(path: str, write: Callable[[Any], None]) -> None:
    """Writes ``path`` through a temporary file beside it, renamed into place: a failure
    leaves nothing."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".loaderx-plot-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def _pyplot() -> Any:
    """matplotlib's pyplot with a file backend, or :class:`ProfileError`."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise ProfileError("a plot needs matplotlib, which is not installed "
                           "(pip install matplotlib)") from None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def check_plot(path: str | os.PathLike[str]) -> None:
    """Refuses a plot that could not be written -- no matplotlib, or no such folder -- before
    anything runs."""
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(folder):
        raise ProfileError(f"the plot's folder {folder} does not exist")
    _pyplot()


def load_transform(spec: str) -> Callable[..., Any]:
    """The callable ``"module:function"`` names (``function`` may be dotted:
    ``module:Class.method``), or :class:`ProfileError` saying what is wrong."""
    if not isinstance(spec, str):
        raise LoaderxTypeError(f"a transform is a callable or 'module:function', got "
                               f"{type(spec).__name__}")
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute or ":" in attribute:
        raise ProfileError(f"transform {spec!r}: expected module:function (for example "
                           "mymodule:collate)")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ProfileError(f"transform {spec!r}: module {module_name!r} cannot be imported "
                           f"({e})") from None
    except Exception as e:  # the module raised while it was imported
        raise ProfileError(f"transform {spec!r}: importing {module_name!r} raised "
                           f"{type(e).__name__}: {e}") from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ProfileError(f"transform {spec!r}: {module_name!r} has no "
                               f"{attribute!r}") from None
    if not callable(target):
        raise ProfileError(f"transform {spec!r} is a {type(target).__name__}, not a function")
    result: Callable[..., Any] = target
    return result


def open_streams(data: Any) -> tuple[dict[str, Any], list[Any]]:
    """The streams of ``data`` -- a dataset directory, a store, a list of stores, or a dict of
    streams -- and those of them opened here (to close)."""
    from loaderx._store.schema import read
    from loaderx._views.dataset import DenseDataset, RaggedDataset
    from loaderx.intake.directory import is_dataset_directory, open_dataset

    if isinstance(data, Mapping):
        return dict(data), []
    paths = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    if not paths:
        raise LoaderxValueError("no dataset given")
    if len(paths) == 1 and is_dataset_directory(paths[0]):
        streams = open_dataset(paths[0])
        return dict(streams), list(streams.values())
    streams, opened = {}, []
    try:
        for p in paths:
            p = os.fspath(p)
            if is_dataset_directory(p):
                raise LoaderxValueError(f"{p} is a dataset directory; profile it alone, or "
                                        "give stores")
            kind = read(p).kind
            ds = RaggedDataset(p) if kind == "ragged" else DenseDataset(p)
            opened.append(ds)
            name = os.path.basename(os.path.normpath(p)) or p
            while name in streams:
                name += "_"
            streams[name] = ds
    except BaseException:
        for ds in opened:
            ds.close()
        raise
    return streams, opened


def _describe(ds: Any) -> str:
    shape = "x".join(str(d) for d in ds.item_shape) or "scalar"
    return f"{ds.kind} {np.dtype(ds.dtype).name} {shape}"


def _worker_counts(cores: int) -> list[int]:
    counts, n = [], 1
    while n < cores:
        counts.append(n)
        n *= 2
    counts.append(cores)
    return counts


def _mode(streams: dict[str, Any]) -> Literal["iid", "cyclic"]:
    """The sampling mode a profile's loaders use: random rows (``iid``: the gathers' usual
    cost), but for streams that define the order themselves (mixtures), whose loader reads
    their positions in turn and refuses any other mode."""
    if any(getattr(ds, "defines_order", False) for ds in streams.values()):
        return "cyclic"
    return "iid"


def _gather_ceiling(streams: dict[str, Any], batch_size: int, seconds: float) -> float:
    """Batches per second of the store gathers alone, on this thread (no loader)."""
    from loaderx._loader.batch import Builder, EndlessRows, Job
    from loaderx.dataloader import _identity, _PooledMemory
    from loaderx.sampler import Mode, Sampler

    length = len(next(iter(streams.values())))
    size = min(batch_size, length)
    sampler = Sampler(length, size, Mode.CYCLIC, 0)
    builder = Builder(streams, EndlessRows(sampler, np.arange(size, dtype=np.int64), ""),
                      Job(_identity, None), 1)
    memory = _PooledMemory(builder, size, 4)
    try:
        steps = [sampler.batch(step) for step in range(64)]
        builder.build(steps[0], memory)  # first touch of the buffers and the maps
        return _best_rate(lambda i: builder.build(steps[i % len(steps)], memory), seconds)
    finally:
        memory.close()


def _best_rate(call: Callable[[int], object], seconds: float, windows: int = 5) -> float:
    """Calls per second of ``call(i)``: the best of ``windows`` windows of ``seconds /
    windows`` each (a ceiling, so the window least disturbed by the rest of the machine)."""
    best, i = 0.0, 0
    for _ in range(windows):
        count, start = 0, time.perf_counter()
        while True:
            call(i)
            i += 1
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / windows and count >= 2:
                break
        best = max(best, count / elapsed)
    return best


def _transform_ceiling(streams: dict[str, Any], batch_size: int, transform: Callable[..., Any],
                       name: str, seconds: float) -> float:
    """Batches per second of the transform alone on this thread, over a few batches gathered
    beforehand; :class:`ProfileError` when it raises."""
    from loaderx._loader.batch import ContextMaker
    from loaderx.dataloader import DataLoader, _wants_ctx

    wants_ctx = _wants_ctx(transform)
    maker = ContextMaker(0, None, 0, 1)
    with DataLoader(streams, batch_size=batch_size, num_workers=0, stats=False,
                    mode=_mode(streams)) as loader:
        batches = [(step, loader.batch_indices(step), next(loader)) for step in range(4)]
    positions = np.arange(batch_size, dtype=np.int64)

    def call(i: int) -> None:
        step, indices, batch = batches[i % len(batches)]
        given = dict(batch)  # a transform may change its dict
        if wants_ctx:
            transform(given, ctx=maker(step, positions[:len(indices)], indices))
        else:
            transform(given)

    try:
        call(0)
    except SystemExit as e:
        raise ProfileError(_exited(name, e)) from None
    except Exception as e:
        raise ProfileError(f"the transform {name} raised {type(e).__name__}: {e} (on the first "
                           "batch, before any loader ran)") from e
    try:
        return _best_rate(call, seconds)
    except SystemExit as e:
        raise ProfileError(_exited(name, e)) from None
    except Exception as e:
        raise ProfileError(f"the transform {name} raised {type(e).__name__}: {e}") from e


def _exited(name: str, e: SystemExit) -> str:
    """What a transform that called ``exit()`` (or ``sys.exit``) did, without its argument's
    text (``exit(batch)`` would print the whole batch)."""
    what = e.code if e.code is None or isinstance(e.code, int) else \
        f"a {type(e.code).__name__}"
    return (f"the transform {name} raised SystemExit({what}): it exited instead of returning "
            "the batch; a transform returns what the training step takes")


def _on_a_thread(function: Callable[..., float], *args: Any) -> float:
    """``function(*args)`` on a thread of its own, as a thread worker would run it (the main
    thread's allocator behaves otherwise: a transform that allocates large arrays ran 2-4x
    slower there), its exception raised here."""
    result: list[float] = []
    failed: list[BaseException] = []

    def target() -> None:
        try:
            result.append(function(*args))
        except BaseException as e:
            failed.append(e)

    thread = threading.Thread(target=target, name="loaderx-profile")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return result[0]


def _run(streams: dict[str, Any], batch_size: int, transform: Callable[..., Any] | None,
         mode: str, workers: int, seconds: float, start_method: str | None) -> Run:
    from loaderx.dataloader import DataLoader

    kw: dict[str, Any] = {} if transform is None else {"transform": transform}
    if mode == "process":
        kw["start_method"] = start_method
    with DataLoader(streams, batch_size=batch_size, num_workers=workers, worker_mode=mode,
                    mode=_mode(streams), stats=True, **kw) as loader:
        began = time.perf_counter()
        next(loader)
        startup = time.perf_counter() - began
        warm_until = time.perf_counter() + min(0.5, max(0.1, seconds / 4))
        taken = 1
        while time.perf_counter() < warm_until or taken < 3:
            next(loader)
            taken += 1
        loader.stats()  # what follows is the next snapshot's since_last
        start = time.perf_counter()
        count = 0
        while time.perf_counter() - start < seconds or count < 3:
            next(loader)
            count += 1
        stats = loader.stats()
    period = stats.since_last
    return Run(mode, workers, period.batches, period.seconds, startup,
               {name: period.stages[name].mean for name in (*TABLE_STAGES, "idle", "wait")},
               period.waited, period.busy, period.cores_busy, stats.summary())


def profile(data: Any, batch_size: int = 256, transform: Callable[..., Any] | str | None = None,
            *, workers: Sequence[int] | None = None, modes: Sequence[str] = MODES,
            seconds: float = 2.0, budget: float = 50.0, start_method: str | None = None,
            plot: str | os.PathLike[str] | None = None,
            progress: Callable[[str], None] | None = None) -> Profile:
    """Measures the loader on ``data`` (see the module documentation).

    * ``data`` -- a dataset directory, a store path, a list of store paths, or a dict of
      streams (as :class:`~loaderx.dataloader.DataLoader` takes);
    * ``transform`` -- a callable, ``"module:function"``, or None (the identity);
    * ``workers`` -- the worker counts to try (default 1, 2, 4, ... and the core count);
      ``modes`` -- ``"thread"`` and/or ``"process"``;
    * ``seconds`` -- how long each run takes batches after its warm-up; ``budget`` -- no run
      starts once this many seconds have gone by (the rest are listed as skipped);
    * ``plot`` -- a file to draw the result into (needs matplotlib, checked before anything
      runs); ``progress`` -- called with a line as each measurement ends.

    A transform that cannot be imported or that raises is a :class:`ProfileError` before any
    loader runs (the transform runs alone first); a run that fails (a transform that fails
    only sometimes, worker processes that cannot start) is reported in its row."""
    from loaderx._loader.host import usable_cores

    began = time.perf_counter()
    if plot is not None:
        check_plot(plot)
    name: str | None = None
    if isinstance(transform, str):
        name = transform
        transform = load_transform(transform)
    elif transform is not None:
        if not callable(transform):
            raise LoaderxTypeError(f"transform must be callable or 'module:function', got "
                                   f"{type(transform).__name__}")
        name = getattr(transform, "__qualname__", None) or repr(transform)
    for mode in modes:
        if mode not in MODES:
            raise LoaderxValueError(f"modes must be among {MODES}, got {mode!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise LoaderxValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not seconds > 0 or not budget > 0:
        raise LoaderxValueError("seconds and budget must be positive")
    cores = usable_cores()
    counts = list(workers) if workers is not None else _worker_counts(cores)
    for n in counts:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise LoaderxValueError(f"worker counts must be positive integers, got {n!r}")
    say = progress or (lambda line: None)
    streams, opened = open_streams(data)
    try:
        records = len(next(iter(streams.values())))
        ceiling_seconds = min(1.0, max(0.2, seconds / 2))
        transform_ceiling = None
        if transform is not None:
            transform_ceiling = _on_a_thread(_transform_ceiling, streams, batch_size,
                                             transform, str(name), ceiling_seconds)
            say(f"transform alone, one thread: {transform_ceiling:.1f} batches/s")
        gather_ceiling = _on_a_thread(_gather_ceiling, streams, batch_size, ceiling_seconds)
        say(f"store gather alone: {gather_ceiling:.1f} batches/s")
        runs: list[Run] = []
        skipped: list[tuple[str, int]] = []
        # Process workers first: forking is refused while other Python threads run, and a
        # thread worker stuck in a transform outlives its loader's close() for a while.
        order = sorted(modes, key=lambda m: m != "process")
        last = seconds + 1.0
        for mode in order:
            for n in counts:
                if time.perf_counter() - began + last > budget:
                    skipped.append((mode, n))
                    continue
                started = time.perf_counter()
                try:
                    run = _run(streams, batch_size, transform, mode, n, seconds, start_method)
                except (KeyboardInterrupt, SystemExit):
                    raise
                except Exception as e:
                    run = Run(mode, n, error=f"{type(e).__name__}: {' '.join(str(e).split())}")
                runs.append(run)
                last = time.perf_counter() - started
                say(f"{mode} x {n}: " + (run.error or
                                         f"{run.batches_per_second:.1f} batches/s"))
        runs.sort(key=lambda r: (list(modes).index(r.mode), r.workers))
        result = Profile({k: _describe(v) for k, v in streams.items()}, records, batch_size,
                         name, cores, gather_ceiling, transform_ceiling, runs, skipped,
                         time.perf_counter() - began)
    finally:
        for ds in opened:
            ds.close()
    if plot is not None:
        result.plot(plot)
    return result
