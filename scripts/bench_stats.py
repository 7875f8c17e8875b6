#!/usr/bin/env python3
"""What ``loader.stats()`` costs (issue 36): the loader with statistics on (the default)
against ``stats=False``, in one run.

``python scripts/bench.py stats [--windows N] [--batches B] [--quick]``

Workloads (the loader benchmark's data: 20,000 records of 12 KiB plus int64 labels, batch 256;
and small records: 20,000 of 256 B, batch 256, where the loader's fixed cost per batch is
everything):

* identity, 12 KiB zstd / raw, 4 threads -- the loader benchmark's ``loaderx`` rows;
* identity, 12 KiB raw, ``num_workers=0``;
* identity, 256 B raw, 2 threads, and ``num_workers=0`` -- the fixed cost per batch;
* identity, 12 KiB raw, 2 worker processes;
* a control: the 256 B 2-thread row with statistics off on both sides, which shows how far
  apart two identical loaders read by this method on this machine.

Each row builds two loaders side by side, one with statistics on and one off, warms both (50
batches), then times them in turns: ``--windows`` windows of ``--batches`` ``next()`` calls
each per loader, the order swapped every pair, so that a change of load on the machine (a
shared one switches between fast and slow phases within seconds) hits both alike. The table
shows the medians over the windows in microseconds per batch, the median of the per-pair
on/off ratios and their range, and the fastest window of each. A last table times the
recording alone, in the thread's CPU time (what a loaded machine's scheduling adds is left out):
one 256 B-record batch's ``Builder.produce`` untimed, with every batch timed (its clock, the
filing, the consumer's ``begin()``/``end()``) and sampled as the loader does it (one batch in
about ``TIME_ALL_ABOVE_NS / its time`` timed, the others counted), the three in turns batch by
batch, the median of 10 rounds -- the cost per batch that the ratio above measures within noise.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _bench_common as common

N, SIZE, BATCH = 20000, 12 * 1024, 256


def make(root: pathlib.Path) -> None:
    from bench_store import make_data
    from loaderx.converter import from_numpy

    data = make_data(N, SIZE)
    from_numpy(root / "data-zstd", data, codec="zstd", progress=False)
    from_numpy(root / "data-raw", data, codec="raw", progress=False)
    del data
    from_numpy(root / "label", np.arange(N, dtype=np.int64) % 1000, codec="raw",
               progress=False)
    rng = np.random.default_rng(1)
    from_numpy(root / "small", rng.integers(0, 17, (N, 64)).astype(np.float32), codec="raw",
               progress=False)


def streams(root: pathlib.Path, kind: str) -> dict:
    from loaderx.dataset import DenseDataset

    if kind == "small":
        return {"data": DenseDataset(root / "small"), "label": DenseDataset(root / "label")}
    return {"data": DenseDataset(root / f"data-{kind}"), "label": DenseDataset(root / "label")}


def cpu_seconds(loader: Any) -> float:
    """CPU seconds so far of this process (every thread) and of ``loader``'s worker
    processes."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    for pid in loader.worker_pids:
        try:
            fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def paired(root: pathlib.Path, kind: str, workers: int, mode: str, windows: int,
           batches: int, control: bool = False
           ) -> tuple[dict[bool, list[float]], dict[bool, list[float]]]:
    """Seconds per batch of ``windows`` windows of ``batches`` ``next()`` calls each, on two
    loaders alive side by side -- statistics on and off -- taking turns window by window (the
    order swapped every pair), so that both see the same machine; and the CPU seconds per
    batch of the same windows (the loader's threads and worker processes, which a busy
    neighbour slows less than the wall clock). ``control``: both loaders with statistics off
    (keyed True and False all the same) -- what the method reads when nothing differs."""
    from loaderx.dataloader import DataLoader

    s = streams(root, kind)
    loaders = {on: DataLoader(s, batch_size=BATCH, num_workers=workers, worker_mode=mode,
                              stats=on and not control,
                              start_method="fork" if mode == "process" else None)
               for on in (True, False)}
    try:
        for loader in loaders.values():
            for _ in range(50):
                next(loader)
        got: dict[bool, list[float]] = {True: [], False: []}
        cpu: dict[bool, list[float]] = {True: [], False: []}
        for w in range(windows):
            for on in ((True, False) if w % 2 == 0 else (False, True)):
                loader = loaders[on]
                c = cpu_seconds(loader)
                t = time.perf_counter()
                for _ in range(batches):
                    next(loader)
                got[on].append((time.perf_counter() - t) / batches)
                cpu[on].append((cpu_seconds(loader) - c) / batches)
        return got, cpu
    finally:
        for loader in loaders.values():
            loader.close()
        for ds in s.values():
            ds.close()


ROWS = [
    ("identity, 12 KiB zstd, 4 threads", "zstd", 4, "thread"),
    ("identity, 12 KiB raw, 4 threads", "raw", 4, "thread"),
    ("identity, 12 KiB raw, num_workers=0", "raw", 0, "thread"),
    ("identity, 256 B raw, 2 threads", "small", 2, "thread"),
    ("identity, 256 B raw, num_workers=0", "small", 0, "thread"),
    ("identity, 12 KiB raw, 2 processes", "raw", 2, "process"),
]
#: The control: the 256 B 2-thread row with statistics off on both sides (its noise floor).
CONTROL = ("control: 256 B raw, 2 threads, off against off", "small", 2, "thread")


def recording_cost(root: pathlib.Path, loops: int) -> list[tuple[str, float]]:
    """Nanoseconds per batch of the recording alone: a batch timed in full, and the mean per
    batch as the loader samples them (a 256 B-record batch is fast: about one in
    ``TIME_ALL_ABOVE_NS / its time`` is timed)."""
    from loaderx._loader.batch import Builder, EndlessRows, Job
    from loaderx._loader.stats import Collector
    from loaderx.dataloader import _identity, _PooledMemory
    from loaderx.sampler import Mode, Sampler

    s = streams(root, "small")
    sampler = Sampler(N, BATCH, Mode.CYCLIC, 0)
    rows = EndlessRows(sampler, np.arange(BATCH, dtype=np.int64), "")
    builder = Builder(s, rows, Job(_identity, None), 1)
    memory = _PooledMemory(builder, BATCH, 4)
    # Each variant its own collector and clock (a timed one's draws must not reset the
    # sampled one's countdown).
    collector = Collector("thread", 1, 8, threading.RLock())
    clock = collector.clock()
    own = Collector("thread", 1, 8, threading.RLock())
    own_clock = own.clock()

    def untimed(step: int) -> None:
        builder.produce(step, memory, None)

    def every_batch_timed(step: int) -> None:
        builder.produce(step, memory, own_clock)
        own_clock.record(0, 0, 0)
        own.left = 1  # (the consumer's next call timed too)
        own.end(own.begin(), 1)  # type: ignore[arg-type]

    def sampled(step: int) -> None:  # what the loader does
        timed = clock.pick()
        builder.produce(step, memory, timed)
        if timed is not None:
            clock.record(0, 0, clock.sample + clock.read + clock.transform)
        began = collector.begin()
        if began is None:
            collector.skipped()
        else:
            collector.end(began, 1)

    # The three in turns batch by batch (the order rotated), each batch's thread CPU time
    # summed per variant: a change of the machine's speed hits all three alike. The figure
    # is the median over 10 rounds.
    runs = [untimed, every_batch_timed, sampled]
    rounds: list[list[float]] = [[], [], []]
    clock_ns = time.thread_time_ns
    for _ in range(10):
        spent = [0, 0, 0]
        for step in range(loops):
            for k in range(3):
                which = (step + k) % 3
                t = clock_ns()
                runs[which](step)
                spent[which] += clock_ns() - t
        for which in range(3):
            rounds[which].append(spent[which] / loops)
    base, every, mean = (statistics.median(r) for r in rounds)
    out = [("produce, untimed (the batch)", base),
           ("recording, every batch timed", every - base),
           ("recording, sampled (the loader's mean)", mean - base)]
    collector.snapshot()
    t = time.perf_counter_ns()
    collector.snapshot()
    out.append(("a stats() snapshot (wall time)", time.perf_counter_ns() - t))
    memory.close()
    return out


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=30, help="windows per side (default 30)")
    ap.add_argument("--batches", type=int, default=200, help="batches per window (200)")
    ap.add_argument("--quick", action="store_true", help="4 windows of 50 batches: a smoke "
                    "check, not figures")
    args = ap.parse_args(argv)
    main(*((4, 50) if args.quick else (args.windows, args.batches)), quick=args.quick)


def main(windows: int = 30, batches: int = 200, quick: bool = False) -> None:
    with common.scratch("loaderx-bench-stats-") as root:
        make(root)
        print(f"\n## stats on against stats=False: {windows} windows of {batches} batches each "
              "on two loaders side by side, taking turns (µs per batch)\n")
        print(common.head("row", "on", "off", "on/off", "pairs: range", "min on", "min off",
                          "CPU on", "CPU off", "CPU on/off", align="lrrrrrrrrr"))
        for name, kind, workers, mode in (*ROWS, CONTROL):
            got, cpu = paired(root, kind, workers, mode, windows, batches,
                              control=name == CONTROL[0])
            on, off = got[True], got[False]
            ratios = common.paired(on, off)
            print(common.row(name, f"{statistics.median(on) * 1e6:.1f}",
                             f"{statistics.median(off) * 1e6:.1f}",
                             f"{statistics.median(ratios):.3f}",
                             f"{min(ratios):.2f}-{max(ratios):.2f}", f"{min(on) * 1e6:.1f}",
                             f"{min(off) * 1e6:.1f}",
                             f"{statistics.median(cpu[True]) * 1e6:.1f}",
                             f"{statistics.median(cpu[False]) * 1e6:.1f}",
                             f"{statistics.median(cpu[True]) / statistics.median(cpu[False]):.3f}"))
        print("\nThe recording alone (one thread, 256 B records, batch 256; CPU time, median of "
              "10 rounds):\n")
        print(common.table(["what", "µs per batch"],
                           [(label.strip(), f"{cost / 1e3:.2f}")
                            for label, cost in recording_cost(root, 2000 if not quick else 200)],
                           align="lr"))


if __name__ == "__main__":
    common.standalone(cli)
