"""Bringing a table in, and reading random batches of it back: loaderx against the formats the
users of Parquet would pick instead, on the same rows in the same run.

``python scripts/bench.py contenders [--repeats N] [--rows N] [--cold-batches N]`` (also a part
of ``scripts/bench.py store``). One Parquet file (zstd, row groups of 2,048 rows) of ``--rows``
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

Reads, cold (``--cold-batches`` N, 0 skips them; the method of ``bench_cold.py``): the same
readers on ``N`` other random batches (the same for every format), nothing of the files cached.
For each format in each repeat (formats interleaved, the order rotated per repeat): the reader
objects of every earlier run are dropped, every file under the format's output directory
(Lance's ``data/``, ``_versions/`` and ``_transactions/``; Hugging Face's Arrow files and its
cache directory where one is left; Mosaic's shards and ``index.json``; LitData's chunks and
``index.json``; loaderx's chunk and table files) is evicted with ``posix_fadvise(DONTNEED)``,
the reader is opened (timed: the cold open), everything is evicted again (what the open read
would otherwise serve the first batch) and ``fincore`` reports what is still resident (pages
the open reader keeps mapped), then the ``N`` batches are timed (and the first alone: the one
batch that finds nothing cached; later batches of a run find what earlier ones read). Also per
batch: the bytes the process read from the device (``read_bytes`` of ``/proc/self/io``). The
physical reference, in each repeat: ``fio`` random 12 KiB reads with ``O_DIRECT`` at queue depth
128 on loaderx's chunk file of ``x`` (``bench_cold.fio``), as batches of 256 such reads per
second. Cold ratios are medians of the per-repeat ratios (the rows of one repeat run seconds
apart on this noisy machine).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import io
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import _bench_common as common
from bench_cold import evict, fio, read_bytes, resident_bytes

ROWS, DIM, ROW_GROUP, BATCH = 40_000, 3072, 2048, 256
# Each read figure: batches for at least this long (and at least MIN_BATCHES of them).
READ_SECONDS, MIN_BATCHES = 0.5, 3
# Cold: batches per run (each run starts with nothing of the format's files cached).
COLD_BATCHES = 30


def _available(module: str) -> bool:
    return common.available(module) is None


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


def _tree(*dirs: str) -> list[str]:
    """Every regular file under ``dirs`` (those that exist)."""
    out = []
    for d in dirs:
        for root, _, files in os.walk(d):
            out += [os.path.join(root, f) for f in files
                    if os.path.isfile(os.path.join(root, f))]
    return sorted(out)


def _cold_files(dst: str) -> list[str]:
    """What a cold run of the format at ``dst`` must find uncached: its whole output directory,
    and Hugging Face's cache directory of the conversion where it is still there."""
    return _tree(dst, dst + ".cache")


def _chunk_file(dst: str, column: str) -> str:
    """loaderx's largest chunk file (``<n>.zr``) of ``column``: fio's file."""
    d = os.path.join(dst, column)
    chunks = [os.path.join(d, f) for f in os.listdir(d)
              if f.endswith(".zr") and f[:-3].isdigit()]
    return max(chunks, key=os.path.getsize)


def _read_ahead_kb(path: str) -> str:
    """The read_ahead_kb of the block device under ``path`` ("?" where it cannot be found)."""
    dev = os.stat(path).st_dev
    base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    for queue in (f"{base}/queue", f"{base}/../queue"):  # a disk, or a partition of one
        try:
            with open(f"{queue}/read_ahead_kb") as f:
                return f.read().strip()
        except OSError:
            pass
    return "?"


def _cold_run(name: str, dst: str, column: str, opener: Callable[[str, str], Any],
              batches: list[np.ndarray], expect: np.ndarray) -> dict[str, float]:
    """One cold run of a reader: evict, open, evict again, fincore, then the batches."""
    _MOSAIC.clear()
    gc.collect()  # the reader objects of earlier runs, and the pages they keep mapped
    files = _cold_files(dst)
    evict(files)
    t = time.perf_counter()
    read = opener(dst, column)
    opened = time.perf_counter() - t
    evict(files)
    residue = resident_bytes(files)
    before = read_bytes()
    t = time.perf_counter()
    first = np.array(read(batches[0]))
    first_s = time.perf_counter() - t  # the one batch that finds nothing at all cached
    for idx in batches[1:]:
        read(idx)
    elapsed = time.perf_counter() - t
    device = read_bytes() - before
    del read
    _MOSAIC.clear()
    if not np.array_equal(first.reshape(expect.shape), expect):
        raise AssertionError(f"{name} read other rows than the source's (cold)")
    return {"bps": len(batches) / elapsed, "first": first_s, "open": opened,
            "device": device / len(batches),
            "residue": -1 if residue is None else residue,
            # allocated bytes: loaderx's table files are sparse
            "size": sum(os.stat(f).st_blocks * 512 for f in files)}


def _cold(tmp: str, readers: list, in_ram: dict[str, np.ndarray], rows: int, repeats: int,
          count: int) -> tuple[dict[tuple[str, str], list[dict[str, float]]],
                               list[float | None]]:
    """Every reader's cold runs (formats interleaved, the order rotated per repeat), and fio's
    batches/s on loaderx's chunk file of ``x``, once per repeat."""
    rng = np.random.default_rng(2)  # other rows than the warm batches'
    batches = [np.sort(rng.choice(rows, BATCH, replace=False)) for _ in range(count)]
    os.sync()  # no conversion's writeback under the cold reads
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    fio_bps: list[float | None] = []
    chunk = _chunk_file(os.path.join(tmp, "loaderx0"), "x")
    for r in range(repeats):
        order = readers[r % len(readers):] + readers[:r % len(readers)]
        for column in ("x", "label"):
            expect = in_ram[column][batches[0]]
            for name, _, opener, _ in order:
                runs.setdefault((name, column), []).append(_cold_run(
                    name, os.path.join(tmp, f"{name}0"), column, opener, batches, expect))
            if column == "x":
                mib = fio(chunk, DIM * 4)
                fio_bps.append(None if mib is None else mib * 2**20 / (BATCH * DIM * 4))
    return runs, fio_bps


def _print_cold(runs: dict[tuple[str, str], list[dict[str, float]]],
                fio_bps: list[float | None],
                readers: list, repeats: int, count: int, read_ahead: str) -> None:
    m = statistics.median
    print(f"\n## Random batches after conversion -- {BATCH} sorted random rows, COLD (every "
          f"file of the format evicted with posix_fadvise(DONTNEED) before the reader is "
          f"opened and again after; {count} batches a run, other rows than the warm ones, the "
          f"same for every format), medians of {repeats}; block device read_ahead_kb "
          f"{read_ahead}\n")
    print(common.head("reader", "x (12 KiB) cold batches/s", "loaderx vs it",
                      "label (int64) cold batches/s", "loaderx vs it", "cold open ms"))
    for name, _, _, _ in readers:
        cells = []
        for column in ("x", "label"):
            mine, lx = runs[(name, column)], runs[("loaderx", column)]
            # paired: the loaderx run of the same repeat (seconds apart)
            ratio = m(a["bps"] / b["bps"] for a, b in zip(lx, mine, strict=True))
            cells += [f"{m(x['bps'] for x in mine):,.1f}",
                      "1.00x" if name == "loaderx" else f"{ratio:,.2f}x"]
        both = runs[(name, "x")] + runs[(name, "label")]
        print(f"| {name} | {' | '.join(cells)} | {m(x['open'] for x in both) * 1e3:,.1f} |")
    print(f"\nThe same runs: the first batch of each (nothing of the files cached at all; later "
          f"batches of a run find what earlier ones read), the bytes the process read from the "
          f"device per batch (read_bytes of /proc/self/io over the run; the records are "
          f"{BATCH * DIM * 4 / 2**20:.2f} MiB a batch of x, {BATCH * 8 / 1024:.0f} KiB of "
          f"label), and what fincore found resident after the eviction (the most of any run)\n")
    print(common.head("reader", "x first batch ms", "loaderx vs it", "x device MiB/batch",
                      "label first batch ms", "loaderx vs it", "label device KiB/batch",
                      "resident after eviction / on disk"))
    for name, _, _, _ in readers:
        cells = []
        for column in ("x", "label"):
            mine, lx = runs[(name, column)], runs[("loaderx", column)]
            ratio = m(b["first"] / a["first"] for a, b in zip(lx, mine, strict=True))
            cells += [f"{m(x['first'] for x in mine) * 1e3:,.1f}",
                      "1.00x" if name == "loaderx" else f"{ratio:,.2f}x",
                      # MiB a batch of x, KiB of label
                      f"{m(x['device'] for x in mine) / (2**20 if column == 'x' else 2**10):,.2f}"]
        both = runs[(name, "x")] + runs[(name, "label")]
        residue = max(x["residue"] for x in both)
        shown = "fincore not installed" if residue < 0 else f"{residue:,.0f} B"
        print(f"| {name} | {' | '.join(cells)} | {shown} / "
              f"{both[0]['size'] / 2**20:,.0f} MiB |")
    pairs = [(a["bps"], f) for a, f in zip(runs[("loaderx", "x")], fio_bps, strict=True)
             if f is not None]
    if pairs:
        device = m(f for _, f in pairs)
        print(f"\nfio randread 12 KiB, O_DIRECT, libaio QD128 on loaderx's chunk file of x: "
              f"{device:,.1f} batches of {BATCH} reads/s ({device * BATCH * DIM * 4 / 2**20:,.0f}"
              f" MiB/s, median of {len(pairs)}); loaderx cold x: "
              f"{m(a / f for a, f in pairs):.2f}x of it (the median of the per-repeat ratios).")
    else:
        print("\nfio: not installed (no device reference).")


def _verdict(ratio: float, target: float | None) -> str:
    if target is None:
        return "(info)"
    return f">= {target:g}x: {'met' if ratio >= target else 'SHORT'}"


def main(repeats: int = 5, rows: int = ROWS, cold_batches: int = COLD_BATCHES) -> None:
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
        del opened
        _MOSAIC.clear()
        read_ahead = _read_ahead_kb(tmp)
        if cold_batches > 0:
            cold, fio_bps = _cold(tmp, readers, in_ram, rows, repeats, cold_batches)

    print(f"\n## Bringing a table in -- {rows:,} rows (x: {DIM} float32 = 12 KiB as a "
          f"fixed-size list; label: int64), {mib:,.0f} MiB decoded, from one Parquet file (zstd, "
          f"row groups of {ROW_GROUP:,}); medians of {repeats}\n")
    print(common.head("converter", "exact API", "s", "MiB/s", "loaderx's speed vs it", "target"))
    lx = m(times["loaderx"])
    for name, api, _, _, target in converters:
        s = m(times[name])
        ratio = s / lx
        shown = "1.00x" if name == "loaderx" else f"{ratio:.2f}x"
        print(f"| {name} | `{api}` | {s:.2f} | {mib / s:,.0f} | {shown} | "
              f"{'' if name == 'loaderx' else _verdict(ratio, target)} |")
    print(f"\n## Random batches after conversion -- {BATCH} sorted random rows, warm (files in "
          f"the page cache), medians of {repeats}\n")
    print(common.head("reader", "exact API", "x (12 KiB) batches/s", "loaderx vs it",
                      "label (int64) batches/s", "loaderx vs it", "target"))
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
    if cold_batches > 0:
        _print_cold(cold, fio_bps, readers, repeats, cold_batches, read_ahead)
    common.skipped(missing)


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--cold-batches", type=int, default=COLD_BATCHES,
                        help="batches of each cold run (nothing cached); 0 skips the cold rows")
    a = parser.parse_args(argv)
    main(a.repeats, a.rows, a.cold_batches)


if __name__ == "__main__":
    common.standalone(cli)
