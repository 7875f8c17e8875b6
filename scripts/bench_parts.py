"""Converting on a local Dask cluster against one process, and reading the parts back.

``python scripts/bench.py parts [--repeats N] [--rows N] [--partitions N] [--only dask|resume]
[--stages] [--files 8,16,32]``: a pyarrow table
(int64 ids, 64-float vectors as fixed-size lists, short strings) converted by
``loaderx.from_arrow`` in this process and by ``loaderx.intake.parts.from_dask`` on a
``LocalCluster`` of 2 worker processes (one thread each), the cluster started before the clock
(it is started once per job, not per conversion), its parts joined into one store per column
(the default) and kept as a directory of parts (``join=False``); then random batches of 256 rows
gathered from the single store and from both. Medians of ``--repeats`` runs, interleaved.

Then resumable conversions (``--only resume`` runs these alone; they need no Dask):
``from_arrow(dst, files, resume=True)`` against the plain ``from_arrow(dst, files)`` on 8, 16
and 32 (``--files``) zstd Parquet files of about 2 MB each (2,000 rows of an int64 and 1 KiB of
random bytes, which zstd cannot shrink, so loaderx stores them raw: the fastest plain
conversion, the hardest ratio), all in the page cache (written once, one untimed run of each
first). Every repeat runs the rows in turn, each into a new directory, so each ratio is of runs
a few milliseconds apart; the medians of the per-repeat ratios are reported. ``resume=True, one
file per part`` sets ``RESUME_PART_BYTES`` to 1 byte, as loaderx wrote parts before batching
them; ``8 MiB parts`` (4 files a part) shows what a conversion of more than one part (over 128
MiB) pays a part. ``--stages`` adds where the time goes: wall time inside each step, summed per
run, from wrappers around them (a step inside another is counted in both).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import _bench_common as common

ROWS, PARTITIONS, DIM = 400_000, 8, 64
# Resumable conversions: files of FILE_ROWS rows of an int64 and BLOB random bytes.
RESUME_FILES, FILE_ROWS, BLOB = (8, 16, 32), 2000, 1024


def _table(rows: int):
    import pyarrow as pa
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(rows, DIM)).astype(np.float32)
    return pa.table({
        "id": np.arange(rows, dtype=np.int64),
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), DIM),
        "name": pa.array([f"row-{i}" for i in range(rows)]),
    })


class _Files:
    """A Dask-like collection (``to_delayed``) of one Parquet file per partition: each task
    reads its own file where it runs, as a cluster converting data in place does."""

    def __init__(self, paths: list[str]) -> None:
        from dask.delayed import delayed
        self.parts = [delayed(p) for p in paths]

    def to_delayed(self) -> list:
        return self.parts


def _write_files(table, partitions: int, tmp: str) -> list[str]:
    import pyarrow.parquet as pq
    n = len(table)
    bounds = np.linspace(0, n, partitions + 1).astype(int)
    paths = []
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        paths.append(os.path.join(tmp, f"part-{k}.parquet"))
        pq.write_table(table.slice(int(a), int(b - a)), paths[-1], compression="zstd")
    return paths


def _gather_rate(ds: dict, batches: int = 200) -> float:
    """Random sorted batches of 256 rows of every column, batches per second."""
    rng = np.random.default_rng(1)
    n = len(ds["id"])
    idx = [np.sort(rng.choice(n, 256, replace=False)).astype(np.uint64) for _ in range(batches)]
    t = time.perf_counter()
    for i in idx:
        for d in ds.values():
            d[i]
    return batches / (time.perf_counter() - t)


def main(repeats: int = 5, rows: int = ROWS, partitions: int = PARTITIONS,
         only: str | None = None, stages: bool = False,
         files: tuple[int, ...] = RESUME_FILES) -> None:
    if only in (None, "dask"):
        dask(repeats, rows, partitions)
    if only in (None, "resume"):
        resume(repeats, files, stages=stages)


def dask(repeats: int = 5, rows: int = ROWS, partitions: int = PARTITIONS) -> None:
    try:
        from distributed import Client, LocalCluster
    except ImportError as e:
        print(f"\n## Dask parts: not available ({e})")
        return
    from loaderx import from_arrow, open_dataset
    from loaderx.intake.parts import from_dask

    table = _table(rows)
    mib = table.nbytes / 2**20
    one, cluster_s, kept_s, read_one, read_parts, read_kept = [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                         dashboard_address=None) as cluster, Client(cluster) as client:
        files = _write_files(table, partitions, tmp)
        for r in range(repeats):
            t = time.perf_counter()
            from_arrow(os.path.join(tmp, f"one{r}"), files, progress=False)
            one.append(time.perf_counter() - t)
            collection = _Files(files)
            t = time.perf_counter()
            from_dask(os.path.join(tmp, f"parts{r}"), collection, client=client)
            cluster_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            from_dask(os.path.join(tmp, f"kept{r}"), collection, client=client, join=False)
            kept_s.append(time.perf_counter() - t)
            read_one.append(_gather_rate(open_dataset(os.path.join(tmp, f"one{r}"))))
            read_parts.append(_gather_rate(open_dataset(os.path.join(tmp, f"parts{r}"))))
            read_kept.append(_gather_rate(open_dataset(os.path.join(tmp, f"kept{r}"))))
    m = statistics.median
    print(f"\n## Converting on a local Dask cluster -- {rows:,} rows (int64, {DIM} float32, a "
          f"string; {mib:.0f} MiB in Arrow) in {partitions} Parquet files, medians of {repeats}\n")
    print(common.table(["converter", "s", "MiB/s", "vs one process"], [
        ("from_arrow, one process", f"{m(one):.2f}", f"{mib / m(one):.0f}", "1.00x"),
        *((name, f"{m(t):.2f}", f"{mib / m(t):.0f}", f"{m(one) / m(t):.2f}x") for name, t in (
            ("from_dask, 2 worker processes, parts joined", cluster_s),
            ("from_dask, 2 worker processes, parts kept (join=False)", kept_s)))]))
    print("\n" + common.table(["read back: 256 random rows of every column", "batches/s",
                               "vs one store"], [
        (name, f"{m(r):,.0f}", f"{m(r) / m(read_one):.2f}x") for name, r in (
            ("one store per column", read_one),
            (f"{partitions} parts joined into one store per column", read_parts),
            (f"{partitions} parts kept (join=False)", read_kept))]))


# -- resumable conversions ------------------------------------------------------------------------



def _small_files(tmp: str, count: int) -> list[str]:
    """``count`` zstd Parquet files of about 2 MB: an int64 and 1 KiB of random bytes a row."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(count)
    paths = []
    for k in range(count):
        table = pa.table({
            "id": np.arange(k * FILE_ROWS, (k + 1) * FILE_ROWS, dtype=np.int64),
            "blob": pa.array([rng.bytes(BLOB) for _ in range(FILE_ROWS)], pa.binary())})
        paths.append(os.path.join(tmp, f"{count}-{k:03d}.parquet"))
        pq.write_table(table, paths[-1], compression="zstd")
    return paths


@contextlib.contextmanager
def _part_bytes(limit: int | None) -> Iterator[None]:
    from loaderx.intake import tables
    saved = tables.RESUME_PART_BYTES
    if limit is not None:
        tables.RESUME_PART_BYTES = limit
    try:
        yield
    finally:
        tables.RESUME_PART_BYTES = saved


# (row, resume, RESUME_PART_BYTES: None for the default)
_RESUME_ROWS = [("from_arrow, plain", False, None),
                ("from_arrow, resume=True", True, None),
                ("from_arrow, resume=True, 8 MiB parts", True, 8 << 20),
                ("from_arrow, resume=True, one file per part (as before)", True, 1)]


def resume(repeats: int = 5, counts: tuple[int, ...] = RESUME_FILES,
           stages: bool = False) -> None:
    from loaderx import from_arrow
    from loaderx.intake import tables

    m = statistics.median
    print(f"\n## Resumable conversions -- Parquet files of {FILE_ROWS:,} rows (an int64, "
          f"{BLOB} random bytes), zstd, warm cache; medians of {repeats}, rows interleaved, "
          f"ratios per repeat; RESUME_PART_BYTES = {tables.RESUME_PART_BYTES >> 20} MiB\n")
    print(common.head("files", "MB", *(f"{name} ms" for name, _, _ in _RESUME_ROWS),
                      "resume vs plain", "8 MiB parts vs plain", "one file per part vs plain"))
    profiles = []
    for count in counts:
        with tempfile.TemporaryDirectory() as tmp:
            files = _small_files(tmp, count)
            mb = sum(os.path.getsize(f) for f in files) / 1e6
            times: dict[str, list[float]] = {name: [] for name, _, _ in _RESUME_ROWS}
            for r in range(-1, repeats):  # run -1: untimed, everything warm
                for name, resumable, limit in _RESUME_ROWS:
                    out = os.path.join(tmp, "out")
                    with _part_bytes(limit):
                        t = time.perf_counter()
                        from_arrow(out, files, resume=resumable, progress=False)
                        took = time.perf_counter() - t
                    shutil.rmtree(out)
                    if r >= 0:
                        times[name].append(took)
            plain = times[_RESUME_ROWS[0][0]]
            ratios = [m(common.paired(times[name], plain)) for name, _, _ in _RESUME_ROWS[1:]]
            print(common.row(count, f"{mb:.0f}",
                             *(f"{m(times[name]) * 1e3:.0f}" for name, _, _ in _RESUME_ROWS),
                             *(f"{x:.2f}x" for x in ratios)))
            if stages:
                profiles.append((count, _stages(files, tmp, repeats)))
    print("\nTarget: resume=True within 1.3x of the plain conversion (issue 31).")
    for count, profile in profiles:
        print(f"\n### Where the time goes, {count} files (ms a run, median of {repeats}; "
              "a step inside another counts in both)\n")
        print(common.head("step", *(name for name, _, _ in _RESUME_ROWS)))
        for step in _STEP_NAMES:
            cells = []
            for name, _, _ in _RESUME_ROWS:
                took, calls = profile[name].get(step, (0.0, 0))
                cells.append(f"{took * 1e3:.1f} ({calls}x)" if calls else "")
            print(common.row(step, *cells))


_STEP_NAMES = ["whole run", "a part written (tables._write)", "stores made (Zrecord())",
               "records appended (Zrecord.append)", "stores synced (Zrecord.sync)",
               "files written and synced (replace_file)", "directories synced (fsync_dir)",
               "codec trials", "published (rename, parent synced)", "joined (assemble)",
               "parts removed (discard_parts)"]


def _stages(files: list[str], tmp: str, repeats: int) -> dict[str, dict[str, tuple[float,
                                                                                    int]]]:
    """Per row of the table: ``{step: (seconds, calls)}`` a run, medians of ``repeats``."""
    from loaderx import _native, from_arrow, staging, zrecord
    from loaderx.intake import directory, joining, tables

    spent: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    saved: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, attr: str, step: str) -> None:
        real = getattr(owner, attr)

        @functools.wraps(real)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                spent[step] += time.perf_counter() - t
                calls[step] += 1

        saved.append((owner, attr, real))
        setattr(owner, attr, timed)

    steps: list[tuple[Any, str, str]] = [
        (tables, "_write", _STEP_NAMES[1]), (zrecord.Zrecord, "__init__", _STEP_NAMES[2]),
        (zrecord.Zrecord, "append", _STEP_NAMES[3]), (zrecord.Zrecord, "sync", _STEP_NAMES[4]),
        (_native, "replace_file", _STEP_NAMES[5]), (staging, "fsync_dir", _STEP_NAMES[6]),
        (directory.DirectoryWriter, "_settle_codec", _STEP_NAMES[7]),
        (staging, "publish", _STEP_NAMES[8]), (tables, "assemble_named", _STEP_NAMES[9]),
        (joining, "discard_parts", _STEP_NAMES[10])]
    for owner, attr, step in steps:
        wrap(owner, attr, step)
    tables.discard_parts = joining.discard_parts  # tables' own name of it, wrapped too
    found: dict[str, dict[str, list[tuple[float, int]]]] = {
        name: collections.defaultdict(list) for name, _, _ in _RESUME_ROWS}
    try:
        for _ in range(repeats):
            for name, resumable, limit in _RESUME_ROWS:
                spent.clear()
                calls.clear()
                out = os.path.join(tmp, "out")
                with _part_bytes(limit):
                    t = time.perf_counter()
                    from_arrow(out, files, resume=resumable, progress=False)
                    spent[_STEP_NAMES[0]] += time.perf_counter() - t
                    calls[_STEP_NAMES[0]] += 1
                shutil.rmtree(out)
                for step in spent:
                    found[name][step].append((spent[step], calls[step]))
    finally:
        for owner, attr, real in reversed(saved):
            setattr(owner, attr, real)
        tables.discard_parts = joining.discard_parts
    median: Callable[[list[tuple[float, int]]], tuple[float, int]] = \
        lambda xs: (statistics.median(x for x, _ in xs), max(c for _, c in xs))  # noqa: E731
    return {name: {step: median(xs) for step, xs in steps_.items()}
            for name, steps_ in found.items()}


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument("--only", choices=["dask", "resume"], default=None)
    parser.add_argument("--stages", action="store_true",
                        help="also where the time of a resumable conversion goes")
    parser.add_argument("--files", default=",".join(map(str, RESUME_FILES)),
                        help="the numbers of Parquet files of the resumable conversions")
    a = parser.parse_args(argv)
    main(a.repeats, a.rows, a.partitions, a.only, a.stages,
         tuple(int(n) for n in a.files.split(",")))


if __name__ == "__main__":
    common.standalone(cli)
