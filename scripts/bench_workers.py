#!/usr/bin/env python3
"""Worker threads against worker processes (issue 22): rows of ``python scripts/bench.py loader``,
or alone with ``python scripts/bench.py workers [--repeats N] [--tables T,...] [--quick]``.

Every table runs its rows interleaved (each repeat runs every row once, so a change of load
hits all of them), on the same data in the same run, and shows medians; a ratio is also given
per repeat (two rows that ran back to back), its median and range. ``cores busy`` is the CPU
time of the consumer (all its threads) and of its worker processes per second of the timed run
(``/proc/<pid>/stat``), in brackets the consumer's share; ``CPU ms/batch`` is the same CPU time
per batch, what a batch costs whatever the load from elsewhere. Tables:

* per-sample Python transform -- the loader benchmark's data (20000 records of 12 KiB, zstd
  store, plus int64 labels, batch 256) with ``bench_loader.augment`` (a Python loop over the
  samples of the batch doing small NumPy work each: it holds the GIL): the loader with 1 and 2
  worker threads, with 2 worker processes, and torch's ``DataLoader`` with 2 worker processes
  and the same transform on the same records (``np.load(mmap_mode='r')``, a batch fetched with
  one fancy index through ``__getitems__``, as ``bench_loader.torch_run`` does);
* identity transform -- the same data without a transform: the thread loader (its default
  worker count) against 2 worker processes, what handing whole batches over shared memory costs
  when there is nothing to parallelise;
* torchvision -- ``transforms.v2`` per sample (``RandomResizedCrop(56)``,
  ``RandomHorizontalFlip``, ``ToDtype(float32, scale=True)``) on 64x64x3 uint8 images from a
  ``DenseDataset``, batch 128, stacked into one float tensor: the loader with 1 and 2 threads
  and 2 processes, against torch's ``DataLoader`` with 2 worker processes over a map-style
  dataset on the same ``DenseDataset`` (one image per ``__getitem__``, the same transform,
  default collate), as a PyTorch user would write it; skipped where torchvision does not import;
* memory -- RSS, PSS and USS (private pages) from ``/proc/<pid>/smaps_rollup`` of each worker
  process and of the consumer after batch 100 and after 10,000 batches, process mode, start
  methods fork and forkserver, in a fresh interpreter each. Records of 256 bytes plus int64
  labels, batch 100. The consumer builds a list of 100,000 Python strings (about 20 MiB of
  objects) before the loader starts; the identity rows never touch it, the lookup rows' transform
  reads one name per record from it. Under fork a worker that touches the parent's objects
  (their reference counts) copies their pages (torch's copy-on-write growth, pytorch #13246),
  so growth per worker is the figure to read; under fork the consumer's USS also rises as the
  pages it shared become its own when a worker copies them;
* default worker count -- the thread loader with the augment transform for
  ``num_workers=None`` (the default) and 1, 2, 4;
* start-up -- a torchvision transform whose module imports torch and torchvision at the top
  (``_bench_vision.py``, the torchvision table's pipeline, batch 128), in a fresh interpreter
  per row that has imported torch already, as a training script has: seconds from making the
  loader (torch: ``iter(loader)``) to its first batch, and the PSS of every process it runs on
  (consumer, workers, and the fork server where there is one) after 10 batches. Rows: torch's
  ``DataLoader`` (2 workers, its default start method: fork on Linux); loaderx with 2 worker
  processes by ``fork``, by ``forkserver`` with the first ``next()`` at once after making the
  loader (the server's import of torch in the way), by ``forkserver`` with 5 s between making
  the loader and the first ``next()`` (the time a script takes to build its model: the server,
  started as the loader is made, imports meanwhile), a second loader in the same process
  (the server running already); the next pass: torch's second epoch (workers started again,
  its default, and with ``persistent_workers=True``) against loaderx's second ``epoch()``
  (the workers the first pass left idle take the job); and the ceiling of any server started
  from a clean interpreter -- importing the transform's module once, and the PSS it leaves.

``--quick`` runs everything once with few batches: a smoke check, not figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

SCRIPTS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))

import _bench_common as common  # noqa: E402
from _bench_tv_data import TV_BATCH, TV_CROP, TV_N, TV_SIDE, TvItems, make_tv_data  # noqa: E402
from bench_loader import (  # noqa: E402
    BATCH,
    SIZE,
    NpyBatches,
    augment,
    torch_collate_batches,
    write_stores,
)

N = 20000
PROCS = 2  # the worker processes of every process row (the cores of the reference machine)
MEM_N, MEM_SIZE, MEM_BATCH, MEM_NAMES = 100_000, 256, 100, 100_000


class Plan:
    """Batches per timed run of each table (``--quick`` shrinks them all)."""

    def __init__(self, quick: bool) -> None:
        scale = 10 if quick else 1
        self.augment = 600 // scale
        self.identity = 2000 // scale
        self.tv = 16 if quick else 80
        self.memory = 1000 if quick else 10_000
        self.warm = 5 if quick else 20


# -- timing --------------------------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of the processes ``pids`` (all their threads)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # a process that is gone counts nothing
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


Measured = tuple[float, float, float]  # batches/s, cores busy in all, of which the consumer


def timed(it, batches: int, warm: int, pids: Callable[[], list[int]] = list) -> Measured:
    """(batches/s, cores busy, cores busy in the consumer) of ``batches`` batches after
    ``warm`` (which starts workers); cores busy counts the consumer and the worker processes
    ``pids()`` names."""
    for _ in range(warm):
        next(it)
    workers, me = pids(), [os.getpid()]
    mine, theirs, t = cpu_seconds(me), cpu_seconds(workers), time.perf_counter()
    for _ in range(batches):
        next(it)
    elapsed = time.perf_counter() - t
    mine, theirs = cpu_seconds(me) - mine, cpu_seconds(workers) - theirs
    return batches / elapsed, (mine + theirs) / elapsed, mine / elapsed


# -- loaderx -------------------------------------------------------------------------------------


def loaderx_rate(streams_fn: Callable[[], dict[str, Any]], batches: int, warm: int,
                 info: dict[str, Any] | None = None, **kw: Any) -> Measured:
    """:func:`timed` of one ``DataLoader`` run; ``info`` receives what the loader chose."""
    from loaderx.dataloader import DataLoader

    streams = streams_fn()
    try:
        with DataLoader(streams, **kw) as loader:
            result = timed(loader, batches, warm, lambda: list(loader.worker_pids))
            if info is not None:
                info["num_workers"] = loader.num_workers
                info["start_method"] = getattr(loader, "start_method", None)
    finally:
        for ds in streams.values():
            ds.close()
    return result


def torch_worker_pids(loader) -> list[int]:
    """The worker processes of a torch DataLoader with persistent workers (private API)."""
    try:
        return [w.pid for w in loader._iterator._workers]
    except AttributeError:
        return []


# -- torch ---------------------------------------------------------------------------------------


def torch_augment_rate(root: pathlib.Path, batches: int, warm: int) -> Measured:
    """torch's DataLoader, 2 worker processes, whole batches through ``__getitems__``, the same
    ``augment`` transform (``bench_loader.torch_run`` with ``PROCS`` workers)."""
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    loader = DataLoader(NpyBatches(str(root), augment), batch_size=BATCH, shuffle=True,
                        num_workers=PROCS, persistent_workers=True,
                        collate_fn=torch_collate_batches)
    try:
        return timed(common.endless(loader), batches, warm, partial(torch_worker_pids, loader))
    finally:
        del loader


# -- torchvision ---------------------------------------------------------------------------------

# Built once per process (a worker process builds its own on its first batch).
_TV: dict[int, Any] = {}
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def tv_pipeline() -> Any:
    pid = os.getpid()
    if pid not in _TV:
        import torch
        from torchvision.transforms import v2

        torch.set_num_threads(1)  # as torch does in its workers: one core per worker
        _TV.clear()
        _TV[pid] = v2.Compose([v2.RandomResizedCrop(TV_CROP, antialias=True),
                               v2.RandomHorizontalFlip(),
                               v2.ToDtype(torch.float32, scale=True)])
    return _TV[pid]


def tv_augment(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """loaderx's transform: the v2 pipeline per image of the batch, stacked."""
    import torch

    pipe = tv_pipeline()
    images = torch.from_numpy(batch["image"]).permute(0, 3, 1, 2)
    return {"image": torch.stack([pipe(img) for img in images]),
            "label": torch.from_numpy(batch["label"])}


class TvImages(TvItems):
    """torch's map-style dataset over the same ``DenseDataset`` pair: one image per item, the
    pipeline built per process as ``tv_augment``'s."""

    def pipeline(self) -> Any:
        return tv_pipeline()


def torch_tv_rate(root: pathlib.Path, batches: int, warm: int) -> Measured:
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    loader = DataLoader(TvImages(str(root)), batch_size=TV_BATCH, shuffle=True,
                        num_workers=PROCS, persistent_workers=True)
    try:
        return timed(common.endless(loader), batches, warm, partial(torch_worker_pids, loader))
    finally:
        del loader


# -- measuring -----------------------------------------------------------------------------------


Rows = dict[str, list[Measured]]


def rates_of(measured: Rows) -> dict[str, list[float]]:
    return {name: [m[0] for m in ms] for name, ms in measured.items()}


def ratio_text(rates: dict[str, list[float]], num: str, den: str) -> str:
    """``num / den``: of the medians, and per repeat (median, range)."""
    pairs = sorted(common.paired(rates[num], rates[den]))
    of_medians = statistics.median(rates[num]) / statistics.median(rates[den])
    spread = f"{pairs[0]:.2f}..{pairs[-1]:.2f}" if len(pairs) > 1 else "one repeat"
    return (f"{of_medians:.2f}x (per repeat {statistics.median(pairs):.2f}x median, "
            f"{spread})")


def ratio(rates: dict[str, list[float]], num: str, den: str) -> float:
    return statistics.median(rates[num]) / statistics.median(rates[den])


def table(measured: Rows, batch: int, ref: str | None) -> None:
    rates = rates_of(measured)
    print(common.head("loader", "batches/s", "ms/batch", "samples/s", "cores busy (consumer)",
                      "CPU ms/batch", f"vs {ref or '-'}"))
    for name, ms in measured.items():
        bps = statistics.median(rates[name])
        busy = statistics.median(m[1] for m in ms)
        consumer = statistics.median(m[2] for m in ms)
        cpu_ms = statistics.median(1e3 * m[1] / m[0] for m in ms)
        vs = f"{ratio(rates, name, ref):.2f}x" if ref in rates else "-"
        print(common.row(name, f"{bps:,.1f}", f"{1e3 / bps:.2f}", f"{bps * batch:,.0f}",
                         f"{busy:.2f} ({consumer:.2f})", f"{cpu_ms:.2f}", vs))


def target(label: str, value: float, goal: float) -> str:
    return f"{label}: {value:.2f}x (target >= {goal}x: {'met' if value >= goal else 'NOT met'})"


# -- the tables ----------------------------------------------------------------------------------


def zstd_streams(root: pathlib.Path) -> dict[str, Any]:
    """The loader benchmark's stores: 12 KiB records (zstd) and int64 labels."""
    from loaderx.dataset import DenseDataset

    return {"data": DenseDataset(root / "data-zstd"), "label": DenseDataset(root / "label")}


def augment_table(root: pathlib.Path, plan: Plan, repeats: int) -> None:
    streams = partial(zstd_streams, root)
    b, w = plan.augment, plan.warm
    chosen: dict[str, Any] = {}
    runs: dict[str, Callable[[], float]] = {
        "threads, 1 worker": lambda: loaderx_rate(streams, b, w, batch_size=BATCH,
                                                  num_workers=1, transform=augment),
        "threads, 2 workers": lambda: loaderx_rate(streams, b, w, batch_size=BATCH,
                                                   num_workers=2, transform=augment),
        f"processes, {PROCS} workers": lambda: loaderx_rate(
            streams, b, w, chosen, batch_size=BATCH, num_workers=PROCS, transform=augment,
            worker_mode="process"),
    }
    torch_missing = common.available("torch")
    if torch_missing is None:
        runs[f"torch, {PROCS} worker processes"] = lambda: torch_augment_rate(root, b, w)
    measured: Rows = common.interleaved(runs, repeats)
    rates = rates_of(measured)
    print(f"\n## Worker threads and processes, per-sample Python transform (augment) -- {N} "
          f"records of {SIZE // 1024} KiB (zstd) + int64 labels, batch {BATCH}, medians of "
          f"{repeats} x {b} batches\n")
    table(measured, BATCH, f"torch, {PROCS} worker processes" if torch_missing is None else None)
    proc = f"processes, {PROCS} workers"
    print(f"\nprocess workers: start method {chosen.get('start_method')!r}")
    print(f"processes / threads-1: {ratio_text(rates, proc, 'threads, 1 worker')}")
    print(f"processes / threads-2: {ratio_text(rates, proc, 'threads, 2 workers')}")
    print(target("processes / threads-2", ratio(rates, proc, "threads, 2 workers"), 1.8))
    # The target against the faster thread row (the one a user would pick), and against the
    # slower one.
    slower = max(ratio(rates, proc, "threads, 1 worker"), ratio(rates, proc, "threads, 2 workers"))
    faster = min(ratio(rates, proc, "threads, 1 worker"), ratio(rates, proc, "threads, 2 workers"))
    print(target("processes / the faster thread row", faster, 1.8))
    print(target("processes / the slower thread row", slower, 1.8))
    # Threads are not confined to one core: the gathers release the GIL and run on the native
    # pool, so a thread row already keeps more than a core busy, and no loader that spends as
    # much CPU per batch can beat it by more than the usable cores over that.
    cores = len(os.sched_getaffinity(0))
    for row in ("threads, 1 worker", "threads, 2 workers"):
        busy = statistics.median(m[1] for m in measured[row])
        print(f"{row} keeps {busy:.2f} cores busy: on {cores} cores no loader with its CPU per "
              f"batch can run more than {cores / busy:.2f}x its rate with this transform")
    if torch_missing is None:
        t = f"torch, {PROCS} worker processes"
        print(f"processes / torch: {ratio_text(rates, proc, t)}")
        print(target("processes / torch", ratio(rates, proc, t), 1.2))
    else:
        print(f"torch row skipped: {torch_missing}")


def identity_table(root: pathlib.Path, plan: Plan, repeats: int) -> None:
    streams = partial(zstd_streams, root)
    b, w = plan.identity, plan.warm
    default: dict[str, Any] = {}
    runs = {
        "threads, default workers": lambda: loaderx_rate(streams, b, w, default,
                                                         batch_size=BATCH),
        f"processes, {PROCS} workers": lambda: loaderx_rate(
            streams, b, w, batch_size=BATCH, num_workers=PROCS, worker_mode="process"),
    }
    measured: Rows = common.interleaved(runs, repeats)
    rates = rates_of(measured)
    print(f"\n## Identity transform -- the same data, batch {BATCH}, medians of {repeats} x {b} "
          f"batches\n")
    table(measured, BATCH, "threads, default workers")
    print(f"\nthread loader default: num_workers={default.get('num_workers')}")
    proc = f"processes, {PROCS} workers"
    print(f"processes / threads: {ratio_text(rates, proc, 'threads, default workers')}")
    print(target("processes / threads", ratio(rates, proc, "threads, default workers"), 0.8))


def torchvision_table(root: pathlib.Path, plan: Plan, repeats: int) -> None:
    missing = common.available("torchvision.transforms.v2")
    if missing is not None:
        print(f"\n## torchvision.transforms.v2: skipped ({missing})")
        return
    from loaderx.dataset import DenseDataset

    make_tv_data(root)

    def streams():
        return {"image": DenseDataset(root / "tv-image"), "label": DenseDataset(root / "tv-label")}

    b, w = plan.tv, max(2, plan.warm // 4)
    chosen: dict[str, Any] = {}
    kw = {"batch_size": TV_BATCH, "transform": tv_augment}
    runs = {
        "threads, 1 worker": lambda: loaderx_rate(streams, b, w, num_workers=1, **kw),
        "threads, 2 workers": lambda: loaderx_rate(streams, b, w, num_workers=2, **kw),
        f"processes, {PROCS} workers": lambda: loaderx_rate(
            streams, b, w, chosen, num_workers=PROCS, worker_mode="process", **kw),
        f"torch, {PROCS} worker processes": lambda: torch_tv_rate(root, b, w),
    }
    import torch
    import torchvision

    torch.set_num_threads(1)  # the thread rows run the pipeline in this process
    measured: Rows = common.interleaved(runs, repeats)
    rates = rates_of(measured)
    print(f"\n## torchvision.transforms.v2 per sample -- {TV_N} images {TV_SIDE}x{TV_SIDE}x3 "
          f"uint8, RandomResizedCrop({TV_CROP}) + RandomHorizontalFlip + ToDtype(float32), "
          f"batch {TV_BATCH}, torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"medians of {repeats} x {b} batches\n")
    t = f"torch, {PROCS} worker processes"
    table(measured, TV_BATCH, t)
    proc = f"processes, {PROCS} workers"
    print(f"\nprocess workers: start method {chosen.get('start_method')!r}")
    print(f"processes / threads-1: {ratio_text(rates, proc, 'threads, 1 worker')}")
    print(f"processes / threads-2: {ratio_text(rates, proc, 'threads, 2 workers')}")
    print(f"processes / torch: {ratio_text(rates, proc, t)}")


def workers_table(root: pathlib.Path, plan: Plan, repeats: int) -> None:
    streams = partial(zstd_streams, root)
    b, w = plan.augment, plan.warm
    default: dict[str, Any] = {}
    runs = {"num_workers=None (default)": lambda: loaderx_rate(
        streams, b, w, default, batch_size=BATCH, num_workers=None, transform=augment)}
    for n in (1, 2, 4):
        runs[f"num_workers={n}"] = (lambda n=n: loaderx_rate(
            streams, b, w, batch_size=BATCH, num_workers=n, transform=augment))
    measured: Rows = common.interleaved(runs, repeats)
    cores = len(os.sched_getaffinity(0))
    print(f"\n## Default worker count, threads, augment transform -- {cores} usable cores, "
          f"medians of {repeats} x {b} batches\n")
    table(measured, BATCH, "num_workers=1")
    print(f"\nnum_workers=None chose {default.get('num_workers')} threads")


# -- memory (in a fresh interpreter per start method) --------------------------------------------


def smaps(pid: int) -> dict[str, int]:
    """RSS, PSS and USS (private clean + dirty) of ``pid`` in KiB."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1])
    return {"rss": fields["Rss"], "pss": fields["Pss"],
            "uss": fields["Private_Clean"] + fields["Private_Dirty"]}


class NameLookup:
    """The memory rows' transform: each record's name looked up in a list of Python strings,
    as a dataset's metadata might be (a Python loop touching the parent's objects)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = self.names
        lengths = [len(names[i]) for i in batch["label"].tolist()]
        return {"data": batch["data"], "label": batch["label"],
                "name_len": np.asarray(lengths, dtype=np.int32)}


def memory_run(root: pathlib.Path, method: str, lookup: bool, batches: int) -> dict[str, Any]:
    from loaderx.dataloader import DataLoader
    from loaderx.dataset import DenseDataset

    # Built before the loader either way: under fork every worker inherits them.
    names = [f"record {i:06d} " + "x" * (150 + i % 50) for i in range(MEM_NAMES)]
    streams = {"data": DenseDataset(root / "mem-data"), "label": DenseDataset(root / "mem-label")}
    kw = {"transform": NameLookup(names)} if lookup else {}
    with DataLoader(streams, batch_size=MEM_BATCH, num_workers=PROCS, worker_mode="process",
                    start_method=method, **kw) as loader:
        for _ in range(100):
            next(loader)
        pids = list(loader.worker_pids)
        first = {"consumer": smaps(os.getpid()), **{f"worker {i}": smaps(p)
                                                    for i, p in enumerate(pids)}}
        for _ in range(batches):
            next(loader)
        last = {"consumer": smaps(os.getpid()), **{f"worker {i}": smaps(p)
                                                   for i, p in enumerate(pids)}}
        chosen = loader.start_method
    for ds in streams.values():
        ds.close()
    return {"method": chosen, "first": first, "last": last}


def memory_table(root: pathlib.Path, plan: Plan) -> None:
    from loaderx.converter import from_numpy

    records = np.random.default_rng(3).integers(0, 256, size=(MEM_N, MEM_SIZE), dtype=np.uint8)
    from_numpy(root / "mem-data", records, codec="raw", progress=False)
    from_numpy(root / "mem-label", np.arange(MEM_N, dtype=np.int64), codec="raw",
               progress=False)
    total = plan.memory + 100
    print(f"\n## Memory of process workers -- {MEM_N} records of {MEM_SIZE} B + int64 labels, "
          f"batch {MEM_BATCH}, {PROCS} workers; the consumer holds a list of {MEM_NAMES} Python "
          f"strings (about 20 MiB) built before the loader, which the 'lookup' transform reads "
          f"(one name per record) and 'identity' does not; smaps_rollup after batch 100 and "
          f"after batch {total:,} (MiB; USS = private pages)\n")
    print(common.head("start method", "transform", "process", "RSS @100", "PSS @100", "USS @100",
                      "RSS @end", "PSS @end", "USS @end", "growth RSS", "growth PSS",
                      "growth USS"))
    for method, kind in (("fork", "identity"), ("fork", "lookup"), ("forkserver", "identity"),
                         ("forkserver", "lookup")):
        proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_workers.py"), "--memory",
                               str(root), method, kind, str(plan.memory)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            print(common.row(method, kind, f"failed: {tail}"))
            continue
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        for who, a in out["first"].items():
            z = out["last"][who]
            cells = [a["rss"], a["pss"], a["uss"], z["rss"], z["pss"], z["uss"]]
            growth = [z[k] - a[k] for k in ("rss", "pss", "uss")]
            print(common.row(out["method"], kind, who, *(f"{c / 1024:.1f}" for c in cells),
                             *(f"{g / 1024:+.1f}" for g in growth)))


# -- main ----------------------------------------------------------------------------------------

NOTE = """
What the ratios mean (on any machine):
* processes / threads (augment, torchvision): how much a transform that holds the GIL gains from
  worker processes. Threads serialize on the GIL, so their rate stays near one core's; processes
  scale with the cores, up to about the number of workers (2 here) less the cost of the
  consumer's own work and of the hand-over.
* processes / torch: the same transform and the same number of worker processes on both sides,
  so the ratio is the cost of the hand-over: loaderx builds each batch straight into shared
  memory the consumer maps (no pickle, no copy), torch pickles the batch and puts each tensor in
  a shared-memory segment of its own.
* the ceiling lines (augment): a thread loader is not confined to one core (its gathers release
  the GIL), so on C cores no loader that spends the same CPU per batch can beat a thread row by
  more than C / (cores busy of that row); a target above that ceiling cannot be met on that
  machine with that transform (a loader that spends less CPU per batch may pass it by that
  little).
* CPU ms/batch: the CPU a batch costs, consumer and workers together; it moves little with load
  from elsewhere, so processes minus threads there is the hand-over's price in CPU.
* identity, processes / threads: with nothing to parallelise the threads are already fast (the
  gather releases the GIL); the ratio is what the process machinery costs, at most 1 plus noise.
* memory growth per worker: pages a worker gains over the run. Under fork, growth means the
  worker copied pages it inherited from the consumer (copy-on-write): the identity rows show
  what the loader itself causes (it should stay near 0), the lookup rows what a transform that
  reads the consumer's Python objects causes (up to the size of the objects it touches, once per
  worker); forkserver workers inherit nothing, so they start with their own copy instead.
"""


def pss_mib(pids: list[int]) -> float:
    return sum(smaps(pid)["pss"] for pid in pids) / 1024


def loaderx_pss(worker_pids: list[int], forkserver: bool) -> float:
    """PSS in MiB of this process, the loader's workers and, with ``forkserver``, the server."""
    from multiprocessing import forkserver as server_module

    server = server_module._forkserver._forkserver_pid if forkserver else None  # private
    return pss_mib([os.getpid(), *worker_pids, *([server] if server else [])])


def startup_run(root: pathlib.Path, row: str) -> dict[str, Any]:
    """One row of the start-up table, in this (fresh) interpreter."""
    if row == IMPORT_CEILING:
        # The floor of any server or worker started from a clean interpreter: importing what
        # the transform's module imports, once, and the PSS that leaves.
        t0 = time.perf_counter()
        import _bench_vision

        return {"first_s": time.perf_counter() - t0, "pss_mib": pss_mib([os.getpid()])}
    import torch

    import _bench_vision

    torch.set_num_threads(1)
    if row == AUTO_MODEL:
        # The common script: a model built and run on the CPU (torch's OpenMP threads up)
        # before the loader is made.
        torch.set_num_threads(2)
        model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 10))
        with torch.no_grad():
            for _ in range(20):
                model(torch.randn(256, 512))
    if row == AUTO_THREAD:
        import threading

        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()  # a thread that runs on
    if row.startswith("torch"):
        from torch.utils.data import DataLoader as TorchLoader

        loader = TorchLoader(_bench_vision.Items(str(root)), batch_size=TV_BATCH,
                             shuffle=True, num_workers=PROCS,
                             persistent_workers=row == "torch, next epoch, persistent")
        if "next epoch" in row:
            for _ in loader:  # the first epoch, whole; the second is timed
                pass
        t0 = time.perf_counter()
        it = iter(loader)
        next(it)
        first = time.perf_counter() - t0
        for _ in range(10):
            next(it)
        memory = pss_mib([os.getpid(), *(w.pid for w in it._workers)])  # private API
        del it
        return {"first_s": first, "pss_mib": memory}
    from loaderx import DataLoader, DenseDataset

    def streams() -> dict[str, Any]:
        return {"image": DenseDataset(root / "tv-image"), "label": DenseDataset(root / "tv-label")}

    method = "fork" if row == "fork" else None if row.startswith("auto") else "forkserver"
    gap = 5.0 if row == "forkserver, 5 s later" else 0.0
    if row == "forkserver, second loader":
        with DataLoader(streams(), batch_size=TV_BATCH, num_workers=PROCS, worker_mode="process",
                        start_method="forkserver",
                        transform=_bench_vision.augment) as first_loader:
            next(first_loader)
    if row == "forkserver, next epoch()":
        with DataLoader(streams(), batch_size=TV_BATCH, num_workers=PROCS,
                        worker_mode="process", start_method="forkserver",
                        transform=_bench_vision.augment) as loader:
            for _ in loader.epoch():  # the first pass, whole; the second is timed
                pass
            t0 = time.perf_counter()
            again = loader.epoch()
            next(again)
            first = time.perf_counter() - t0
            for _ in range(10):
                next(again)
            return {"first_s": first, "pss_mib": loaderx_pss(again._pipe.worker_pids, True)}
    t0 = time.perf_counter()
    loader = DataLoader(streams(), batch_size=TV_BATCH, num_workers=PROCS, worker_mode="process",
                        start_method=method, transform=_bench_vision.augment)
    if gap:
        time.sleep(gap)
        t0 += gap
    next(loader)
    first = time.perf_counter() - t0
    for _ in range(10):
        next(loader)
    memory = loaderx_pss(loader.worker_pids, loader.start_method == "forkserver")
    chose = loader.start_method
    loader.close()
    return {"first_s": first, "pss_mib": memory, "method": chose}


#: ``start_method=None``: in a plain script, after a model ran on the CPU, with a thread.
AUTO_ROWS = ("auto (default)", "auto, a CPU model run first (2 torch threads)",
             "auto, another Python thread running")
AUTO_MODEL, AUTO_THREAD = AUTO_ROWS[1], AUTO_ROWS[2]
STARTUP_ROWS = ("torch", "fork", *AUTO_ROWS, "forkserver, at once", "forkserver, 5 s later",
                "forkserver, second loader", "torch, next epoch", "torch, next epoch, persistent",
                "forkserver, next epoch()")
#: Not a loader: a fresh interpreter importing the transform's module (torch, torchvision).
IMPORT_CEILING = "ceiling: a fresh interpreter imports the transform's module"


#: Seconds after which a start-up row counts as hung.
STARTUP_HANG = 240


def startup_table(root: pathlib.Path, plan: Plan, repeats: int) -> None:
    if (why := common.available("torchvision")) is not None:
        print(f"\n(start-up table skipped: torchvision does not import: {why})")
        return
    if not (root / "tv-image").exists():
        make_tv_data(root)
    rows = (*STARTUP_ROWS, IMPORT_CEILING)
    got: dict[str, list[dict[str, Any]]] = {row: [] for row in rows}
    for _ in range(repeats):
        for row in rows:
            try:
                r = subprocess.run([sys.executable, str(SCRIPTS / "bench_workers.py"),
                                    "--startup", str(root), row], capture_output=True,
                                   text=True, check=True, timeout=STARTUP_HANG)
            except subprocess.TimeoutExpired:  # a worker that hangs after the fork, say
                got[row].append({"first_s": math.inf, "pss_mib": math.nan,
                                 "method": f"hung ({STARTUP_HANG} s)"})
                continue
            got[row].append(json.loads(r.stdout.strip().splitlines()[-1]))
    first = {row: statistics.median(g["first_s"] for g in got[row]) for row in rows}
    memory = {row: statistics.median(g["pss_mib"] for g in got[row]) for row in rows}
    print(f"\n### Start-up with a torchvision transform ({PROCS} worker processes, batch "
          f"{TV_BATCH}; medians of {repeats}, rows interleaved, each in a fresh interpreter)\n")
    print(common.head("loader", "start method", "first batch s", "vs torch", "vs fork",
                      "PSS MiB (all its processes)", "vs fork", align="--rrrrr"))
    for row in rows:
        name = row if row.startswith(("torch", "ceiling")) else f"loaderx, {row}"
        methods = "/".join(sorted({str(g.get("method", "")) for g in got[row]} - {""}))
        print(common.row(name, methods or "-", f"{first[row]:.2f}",
                         f"{first[row] / first['torch']:.1f}x",
                         f"{first[row] / first['fork']:.2f}x", f"{memory[row]:,.0f}",
                         f"{memory[row] / memory['fork']:.2f}x"))


TABLES = ("augment", "identity", "torchvision", "memory", "workers", "startup")


def main(repeats: int = 5, quick: bool = False, tables: tuple[str, ...] = TABLES) -> None:
    plan = Plan(quick)
    if quick:
        repeats = 1
    # Worker processes started by forkserver or spawn import this module (the transforms live
    # here) and bench_loader: they need the scripts folder on their path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH", "")) if p)
    with common.scratch("loaderx-bench-workers-") as root:
        write_stores(root, ("zstd",))
        for name in tables:
            if name == "memory":
                memory_table(root, plan)
            else:
                globals()[f"{name}_table"](root, plan, repeats)
        print(NOTE)


def child() -> bool:
    """Runs the row a parent asked for with ``--startup`` or ``--memory`` (a fresh interpreter
    per row); False when this process is no such child."""
    if sys.argv[1:2] == ["--startup"]:
        print(json.dumps(startup_run(pathlib.Path(sys.argv[2]), sys.argv[3])))
        return True
    if sys.argv[1:2] == ["--memory"]:
        root, method, kind, batches = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
        print(json.dumps(memory_run(pathlib.Path(root), method, kind == "lookup", batches)))
        return True
    return False


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (median)")
    parser.add_argument("--tables", default="",
                        help=f"comma-separated subset of {','.join(TABLES)} (default all)")
    parser.add_argument("--quick", action="store_true",
                        help="every row once with few batches (a smoke check)")
    args = parser.parse_args(argv)
    tables = tuple(args.tables.split(",")) if args.tables else TABLES
    if unknown := set(tables) - set(TABLES):
        parser.error(f"unknown tables {sorted(unknown)}; choose from {', '.join(TABLES)}")
    main(args.repeats, args.quick, tables)


if __name__ == "__main__":
    # Run through the module's own name, so that the transforms pickle as bench_workers.* (a
    # worker process imports them from there) rather than as __main__.*.
    import bench_workers

    if not bench_workers.child():
        common.standalone(bench_workers.cli)
