"""Bringing a table in, and reading random batches of it back: loaderx against the formats the
users of Parquet would pick instead, on the same rows in the same run.

``python scripts/bench_contenders.py [--repeats N] [--rows N]`` (also a part of
``scripts/bench.py store``). One Parquet file (zstd, row groups of 2,048 rows) of ``--rows``
rows: ``x``, 3,072 float32 per row as a fixed-size list (12 KiB), and ``label``, an int64.

Conversion, every converter starting from that file, interleaved, medians of ``--repeats``:
``pyarrow.parquet.read_table`` alone (the floor: decoding the file), ``loaderx.from_arrow(dst,
path)``, Mosaic ``MDSWriter`` (one process; rows from ``ParquetFile.iter_batches``; columns
``ndarray:float32:3072`` and ``int64``, no compression: MDS compresses whole shards, which
random access would then have to decompress), LitData ``optimize()`` (a worker per core, one
input per row group, each read by the worker), Lance ``write_dataset`` (from a
``pyarrow.dataset`` scanner) and Hugging Face ``Dataset.from_parquet`` + ``save_to_disk``.

Reads, warm (every file just written and in the page cache, a few batches read first): 256
sorted random rows of ``x``, and of ``label``, as a NumPy array, through loaderx
(``open_dataset(dst)[column][indices]``, one gather), Lance (``dataset.take(indices,
columns=[column])``, then the column to NumPy), Hugging Face (``load_from_disk(dst)
.with_format("numpy", columns=[column])[list_of_indices][column]``), Mosaic
(``StreamingDataset(local=dst, remote=None)``, ``ds[i]`` per row, stacked) and LitData
(``StreamingDataset(dst, batch_decode=0)``, ``ds[i]`` per row, stacked; its default decodes a
window of items around each one). Contenders that are not installed are skipped
(``pip install pylance datasets mosaicml-streaming litdata``). Then the copy ceiling: the same
rows copied out of an array in RAM on the pool and with the sharding of a gather, no store
(``_native.copy_records``), which no reader of the rows can beat by much: the most any reader
can be faster than a contender is about the ceiling's rate over the contender's.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

ROWS, DIM, ROW_GROUP, BATCH = 40_000, 3072, 2048, 256
# Each read figure: batches for at least this long (and at least MIN_BATCHES of them).
READ_SECONDS, MIN_BATCHES = 0.5, 3


def _available(module: str) -> bool:
    try:
        __import__(module)
    except Exception:  # a contender that does not import is skipped, whatever the reason
        return False
    return True


def _write_parquet(path: str, rows: int) -> int:
    """The source file; returns its size of ``x`` and ``label`` in bytes, decoded."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(0)
    with pq.ParquetWriter(path, pa.schema([("x", pa.list_(pa.float32(), DIM)),
                                          ("label", pa.int64())]), compression="zstd") as w:
        for start in range(0, rows, ROW_GROUP):
            n = min(ROW_GROUP, rows - start)
            x = rng.standard_normal((n, DIM), dtype=np.float32)
            label = rng.integers(0, 1000, n, dtype=np.int64)
            w.write_table(pa.table({"x": pa.FixedSizeListArray.from_arrays(
                pa.array(x.reshape(-1)), DIM), "label": label}), row_group_size=ROW_GROUP)
    return rows * (DIM * 4 + 8)


def _batches_of(path: str):
    """(x as an (n, DIM) array, label) for each record batch of the file."""
    import pyarrow.parquet as pq
    for batch in pq.ParquetFile(path).iter_batches(batch_size=ROW_GROUP):
        x = batch.column("x").flatten().to_numpy().reshape(-1, DIM)
        yield x, batch.column("label").to_numpy()


# -- converters: (path, dst) -> None ---------------------------------------------------------------


def _read_table(path: str, dst: str) -> None:
    import pyarrow.parquet as pq
    pq.read_table(path)


def _loaderx(path: str, dst: str) -> None:
    from loaderx import from_arrow
    from_arrow(dst, path, progress=False)


def _mosaic(path: str, dst: str) -> None:
    from streaming import MDSWriter
    with MDSWriter(out=dst, columns={"x": f"ndarray:float32:{DIM}", "label": "int64"},
                   compression=None) as w:
        for x, label in _batches_of(path):
            for i in range(len(label)):
                w.write({"x": x[i], "label": label[i]})


def _litdata_rows(path: str, row_group: int):
    import pyarrow.parquet as pq
    batch = pq.ParquetFile(path).read_row_group(row_group)
    x = batch.column("x").combine_chunks().flatten().to_numpy().reshape(-1, DIM)
    label = batch.column("label").to_numpy()
    for i in range(len(label)):
        yield {"x": x[i], "label": int(label[i])}


def _litdata(path: str, dst: str) -> None:
    import litdata
    import pyarrow.parquet as pq
    groups = pq.ParquetFile(path).metadata.num_row_groups
    # optimize() prints its progress; the table is what this script prints.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        litdata.optimize(fn=functools.partial(_litdata_rows, path), inputs=list(range(groups)),
                         output_dir=dst, chunk_bytes="64MB", num_workers=os.cpu_count() or 1,
                         # the rows in the file's order, as every other converter keeps them
                         keep_data_ordered=True, reorder_files=False, verbose=False)


def _litdata_rows_written(dst: str) -> int:
    """The rows LitData's index lists: optimize() can log a failed worker and still finish."""
    with open(os.path.join(dst, "index.json")) as f:
        return sum(chunk["chunk_size"] for chunk in json.load(f)["chunks"])


def _lance(path: str, dst: str) -> None:
    import lance
    import pyarrow.dataset as pads
    lance.write_dataset(pads.dataset(path).scanner(batch_size=ROW_GROUP).to_reader(), dst)


def _huggingface(path: str, dst: str) -> None:
    import datasets
    datasets.disable_progress_bars()
    # A fresh cache per run: from_parquet would otherwise find the previous run's Arrow copy.
    ds = datasets.Dataset.from_parquet(path, cache_dir=dst + ".cache")
    ds.save_to_disk(dst)


# name, exact API, required module, converter, the target (loaderx's speed / theirs) or None
CONVERTERS: list[tuple[str, str, str, Callable[[str, str], None], float | None]] = [
    ("pyarrow", "pyarrow.parquet.read_table(path) (decoding only)", "pyarrow", _read_table, 0.5),
    ("loaderx", "loaderx.from_arrow(dst, path)", "loaderx", _loaderx, None),
    ("mosaic", "streaming.MDSWriter(columns=..., compression=None).write(row)", "streaming",
     _mosaic, 2.0),
    ("litdata", "litdata.optimize(fn, row groups, num_workers=cores)", "litdata", _litdata, 2.0),
    ("lance", "lance.write_dataset(scanner reader, dst)", "lance", _lance, None),
    ("huggingface", "datasets.Dataset.from_parquet(path).save_to_disk(dst)", "datasets",
     _huggingface, None),
]


# -- readers: (dst, column) -> (indices -> array) ----------------------------------------------


def _open_loaderx(dst: str, column: str) -> Callable[[np.ndarray], Any]:
    from loaderx import open_dataset
    ds = open_dataset(dst)[column]
    return lambda idx: ds[idx]


def _open_lance(dst: str, column: str) -> Callable[[np.ndarray], Any]:
    import lance
    ds = lance.dataset(dst)

    def take(idx: np.ndarray) -> np.ndarray:
        col = ds.take(idx, columns=[column]).column(column).combine_chunks()
        return col.flatten().to_numpy().reshape(len(idx), -1) if column == "x" \
            else col.to_numpy()
    return take


def _open_huggingface(dst: str, column: str) -> Callable[[np.ndarray], Any]:
    import datasets
    ds = datasets.load_from_disk(dst).with_format("numpy", columns=[column])
    return lambda idx: ds[idx.tolist()][column]


_MOSAIC: dict[str, Any] = {}  # one StreamingDataset per directory (it keys shared memory on it)


def _open_mosaic(dst: str, column: str) -> Callable[[np.ndarray], Any]:
    from streaming import StreamingDataset
    if dst not in _MOSAIC:
        _MOSAIC[dst] = StreamingDataset(local=dst, remote=None, batch_size=BATCH)
    ds = _MOSAIC[dst]
    return lambda idx: np.stack([ds[int(i)][column] for i in idx])


def _open_litdata(dst: str, column: str) -> Callable[[np.ndarray], Any]:
    import litdata
    # batch_decode=0: one item decoded per read; the default decodes a window of ~256 items
    # around it (made for sequential reads), 40x slower for random rows.
    ds = litdata.StreamingDataset(dst, batch_decode=0)
    return lambda idx: np.stack([np.asarray(ds[int(i)][column]) for i in idx])


# name, exact API, opener, the target (loaderx's rate / theirs) or None
READERS: list[tuple[str, str, Callable[[str, str], Callable[[np.ndarray], Any]], float | None]] = [
    ("loaderx", "open_dataset(dst)[col][indices]", _open_loaderx, None),
    ("lance", "lance.dataset(dst).take(indices, columns=[col])", _open_lance, 5.0),
    ("huggingface", 'load_from_disk(dst).with_format("numpy", columns=[col])[list]',
     _open_huggingface, 20.0),
    ("mosaic", "StreamingDataset(local=dst, remote=None)[i] per row", _open_mosaic, 10.0),
    ("litdata", "litdata.StreamingDataset(dst, batch_decode=0)[i] per row", _open_litdata, 10.0),
]


def _memcpy_reader(rows: np.ndarray) -> Callable[[np.ndarray], Any]:
    """The copy ceiling's reader: the same rows copied out of an array in RAM by the engine's
    bare copy (``_native.copy_records``: the pool and the sharding of a gather, no store), or
    NumPy's fancy index where the build has no bench ceilings."""
    from loaderx import _native

    copy = getattr(_native, "copy_records", None)
    if copy is None:
        return lambda idx: rows[idx]
    src = rows.reshape(len(rows), -1).view(np.uint8).reshape(-1)
    record = rows[0].nbytes
    out = np.empty((BATCH, *rows.shape[1:]), rows.dtype)

    def read(idx: np.ndarray) -> np.ndarray:
        copy(src, record, idx.astype(np.uint64), out.reshape(-1).view(np.uint8))
        return out[:len(idx)]
    return read


def _rate(name: str, read: Callable[[np.ndarray], Any], batches: list[np.ndarray],
          expect: Any) -> float:
    """Batches per second over at least READ_SECONDS; the first batch is checked against
    loaderx's (every contender reads the same rows)."""
    got = np.asarray(read(batches[0]))
    if expect is not None and not np.array_equal(got.reshape(expect.shape), expect):
        raise AssertionError(f"{name} read other rows than loaderx")
    done, t = 0, time.perf_counter()
    while True:
        read(batches[done % len(batches)])
        done += 1
        elapsed = time.perf_counter() - t
        if elapsed >= READ_SECONDS and done >= MIN_BATCHES:
            return done / elapsed


def _verdict(ratio: float, target: float | None) -> str:
    if target is None:
        return "(info)"
    return f">= {target:g}x: {'met' if ratio >= target else 'SHORT'}"


def main(repeats: int = 5, rows: int = ROWS) -> None:
    if not _available("pyarrow"):
        print("\n## Contenders: not available (pyarrow is not installed)")
        return
    converters = [c for c in CONVERTERS if _available(c[2])]
    missing = [c[0] for c in CONVERTERS if not _available(c[2])]
    names = {c[0] for c in converters}
    readers = [r for r in READERS if r[0] in names]
    m = statistics.median
    times: dict[str, list[float]] = {c[0]: [] for c in converters}
    rates: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "source.parquet")
        mib = _write_parquet(src, rows) / 2**20
        for r in range(repeats):
            for name, _, _, convert, _ in converters:
                dst = os.path.join(tmp, f"{name}{r}")
                t = time.perf_counter()
                convert(src, dst)
                times[name].append(time.perf_counter() - t)
                if name == "litdata" and _litdata_rows_written(dst) != rows:
                    raise AssertionError(f"litdata.optimize wrote {_litdata_rows_written(dst)} "
                                         f"of {rows} rows")
                if r > 0:  # keep the first run's outputs for the reads, free the disk of others
                    shutil.rmtree(dst, ignore_errors=True)
                shutil.rmtree(dst + ".cache", ignore_errors=True)
        rng = np.random.default_rng(1)
        batches = [np.sort(rng.choice(rows, BATCH, replace=False)) for _ in range(64)]
        # The copy ceiling: the batch's rows copied out of an array already in RAM, on the
        # threads a gather uses. No reader of the same rows can beat it by much: it must copy
        # them at least once.
        import pyarrow.parquet as pq
        table = pq.read_table(src)
        in_ram = {"x": table.column("x").combine_chunks().flatten().to_numpy()
                  .reshape(-1, DIM),
                  "label": table.column("label").to_numpy()}
        del table
        for column in ("x", "label"):
            opened = {name: opener(os.path.join(tmp, f"{name}0"), column)
                      for name, _, opener, _ in readers}
            opened["copy"] = _memcpy_reader(in_ram[column])
            expect = np.asarray(opened["loaderx"](batches[0]))
            for read in opened.values():  # warm: a few batches each before any clock
                for b in batches[:3]:
                    read(b)
            for _ in range(repeats):
                for name, read in opened.items():
                    rates.setdefault((name, column), []).append(_rate(name, read, batches,
                                                                           expect))
        _MOSAIC.clear()

    print(f"\n## Bringing a table in -- {rows:,} rows (x: {DIM} float32 = 12 KiB as a "
          f"fixed-size list; label: int64), {mib:,.0f} MiB decoded, from one Parquet file (zstd, "
          f"row groups of {ROW_GROUP:,}); medians of {repeats}\n")
    print("| converter | exact API | s | MiB/s | loaderx's speed vs it | target |\n"
          "|---|---|---|---|---|---|")
    lx = m(times["loaderx"])
    for name, api, _, _, target in converters:
        s = m(times[name])
        ratio = s / lx
        shown = "1.00x" if name == "loaderx" else f"{ratio:.2f}x"
        print(f"| {name} | `{api}` | {s:.2f} | {mib / s:,.0f} | {shown} | "
              f"{'' if name == 'loaderx' else _verdict(ratio, target)} |")
    print(f"\n## Random batches after conversion -- {BATCH} sorted random rows, warm (files in "
          f"the page cache), medians of {repeats}\n")
    print("| reader | exact API | x (12 KiB) batches/s | loaderx vs it | label (int64) "
          "batches/s | loaderx vs it | target |\n|---|---|---|---|---|---|---|")
    for name, api, _, target in readers:
        cells = []
        worst = float("inf")
        for column in ("x", "label"):
            rate = m(rates[(name, column)])
            ratio = m(rates[("loaderx", column)]) / rate
            worst = min(worst, ratio)
            cells += [f"{rate:,.1f}", "1.00x" if name == "loaderx" else f"{ratio:,.1f}x"]
        print(f"| {name} | `{api}` | {' | '.join(cells)} | "
              f"{'' if name == 'loaderx' else _verdict(worst, target)} |")
    ceiling = {c: m(rates[("copy", c)]) for c in ("x", "label")}
    print(f"| copy ceiling | `_native.copy_records` of the rows from RAM (the gather's threads) | "
          f"{ceiling['x']:,.1f} | {m(rates[('loaderx', 'x')]) / ceiling['x']:.2f}x | "
          f"{ceiling['label']:,.1f} | {m(rates[('loaderx', 'label')]) / ceiling['label']:.2f}x "
          "| (loaderx's rate / the ceiling's) |")
    for name, _, _, target in readers:
        if name == "loaderx" or target is None:
            continue
        best = min(ceiling[c] / m(rates[(name, c)]) for c in ("x", "label"))
        print(f"\nThe most any reader of these rows can beat {name} by: {best:,.1f}x "
              f"(the copy ceiling's rate over {name}'s, the worse column); target {target:g}x")
    if missing:
        print(f"\nNot installed, skipped: {', '.join(missing)}.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=ROWS)
    a = parser.parse_args()
    sys.exit(main(a.repeats, a.rows))
