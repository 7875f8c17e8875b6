"""Converting on a local Dask cluster against one process, and reading the parts back.

``python scripts/bench_parts.py [--repeats N] [--rows N] [--partitions N]``: a pyarrow table
(int64 ids, 64-float vectors as fixed-size lists, short strings) converted by
``loaderx.from_arrow`` in this process and by ``loaderx.intake.parts.from_dask`` on a
``LocalCluster`` of 2 worker processes (one thread each), the cluster started before the clock
(it is started once per job, not per conversion), its parts joined into one store per column
(the default) and kept as a directory of parts (``join=False``); then random batches of 256 rows
gathered from the single store and from both. Medians of ``--repeats`` runs, interleaved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

ROWS, PARTITIONS, DIM = 400_000, 8, 64


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


def main(repeats: int = 5, rows: int = ROWS, partitions: int = PARTITIONS) -> None:
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
    print("| converter | s | MiB/s | vs one process |\n|---|---|---|---|")
    print(f"| from_arrow, one process | {m(one):.2f} | {mib / m(one):.0f} | 1.00x |")
    print(f"| from_dask, 2 worker processes, parts joined | {m(cluster_s):.2f} | "
          f"{mib / m(cluster_s):.0f} | {m(one) / m(cluster_s):.2f}x |")
    print(f"| from_dask, 2 worker processes, parts kept (join=False) | {m(kept_s):.2f} | "
          f"{mib / m(kept_s):.0f} | {m(one) / m(kept_s):.2f}x |")
    print("\n| read back: 256 random rows of every column | batches/s | vs one store |\n"
          "|---|---|---|")
    print(f"| one store per column | {m(read_one):,.0f} | 1.00x |")
    print(f"| {partitions} parts joined into one store per column | {m(read_parts):,.0f} | "
          f"{m(read_parts) / m(read_one):.2f}x |")
    print(f"| {partitions} parts kept (join=False) | {m(read_kept):,.0f} | "
          f"{m(read_kept) / m(read_one):.2f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    a = parser.parse_args()
    sys.exit(main(a.repeats, a.rows, a.partitions))
