#!/usr/bin/env python3
"""Tables of many narrow columns: a DLRM-style click log (a 0/1 label, 13 float32 features, 26
int64 categorical ids with Zipf-like frequencies, cardinalities 10 to 10 million) written by the
bench as 8 Parquet files, converted with ``from_arrow`` and read in shuffled batches.

``python scripts/bench.py tables [--rows N] [--repeats R] [--batches B]``. Every figure is the
median of ``R`` fresh processes, the rows of one measurement interleaved (each repeat runs every
row once, in turn), and every ratio is paired per repeat. Warm page cache throughout.

Reads: a batch is every column of ``B`` random rows, stacked as a training step wants them (the
13 floats as one ``(B, 13)`` array, the 26 ids as one ``(B, 26)`` array, the labels), by
- loaderx: ``DataLoader(open_dataset(dst), batch_size=B, transform=stack)`` over the directory
  written with ``group_columns=True`` (one column group) and, for comparison, the layout of a
  store per column (``from_arrow``'s default);
- NumPy: one ``.npy`` memmap per column, fancy-indexed by the same kind of random batch and
  stacked the same way;
- torch: ``torch.utils.data.DataLoader`` over those memmaps with ``__getitems__`` (no workers);
- the copy ceiling: the rows of the table as one ``(N, row_bytes)`` array gathered by the engine's
  memcpy loop (``_native.copy_records``) -- the bytes a batch must move, at memory speed.

Conversion: ``from_arrow`` of the 8 files (grouped and default) against ``pyarrow.parquet.
read_table`` of the same files. Disk: ``du`` of each directory against the raw bytes of the
values (261 a row), with the apparent size.

Durable appends: 100 rows (a 0.5-4 KiB text and a 384-float32 embedding each) appended to a
two-column table of 10,000 rows and made durable, 30 times a process: ``append_rows`` on a
directory with a commit point (``group_columns=True``), against LMDB (one write transaction
of 100 puts, ``sync=True``) and the physical ceiling: the same bytes written to one file and
``fsync``ed once (what any durable commit of them must wait for).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

import _bench_common as common

FLOATS, IDS = 13, 26
VALUE_BYTES = 1 + FLOATS * 4 + IDS * 8


def write_click_log(root: pathlib.Path, rows: int, files: int = 8) -> pathlib.Path:
    """The click log as ``files`` Parquet files under ``root/pq`` (and the columns as .npy files
    under ``root/npy``, for the NumPy and torch rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    pq_dir, npy_dir = root / "pq", root / "npy"
    pq_dir.mkdir()
    npy_dir.mkdir()
    cards = np.geomspace(10, 10_000_000, IDS).astype(np.int64)
    cols: dict[str, np.ndarray] = {"label": rng.integers(0, 2, rows).astype(np.int8)}
    for i in range(FLOATS):
        cols[f"f{i}"] = rng.standard_normal(rows).astype(np.float32)
    for i in range(IDS):
        cols[f"c{i}"] = (rng.zipf(1.2, rows).astype(np.int64) - 1) % cards[i]
    for name, values in cols.items():
        np.save(npy_dir / f"{name}.npy", values)
    per = -(-rows // files)
    for k in range(files):
        part = pa.table({n: v[k * per:(k + 1) * per] for n, v in cols.items()})
        pq.write_table(part, pq_dir / f"{k:02d}.parquet", compression="zstd")
    return pq_dir


def _stack(batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dense = np.stack([batch[f"f{i}"] for i in range(FLOATS)], axis=1)
    sparse = np.stack([batch[f"c{i}"] for i in range(IDS)], axis=1)
    return batch["label"], dense, sparse


# -- one measurement, in a fresh process ----------------------------------------------------------


def child(kind: str, root: str, batch: int, batches: int) -> float:
    """Seconds per batch (or per conversion) of ``kind``, measured in this process."""
    path = pathlib.Path(root)
    if kind in ("grouped", "columns"):
        from loaderx import DataLoader, open_dataset

        loader = DataLoader(open_dataset(path / kind), batch_size=batch, seed=1,
                            transform=_stack)
        it = iter(loader)
        took = common.time_next(it, batches, warm=3)
        loader.close()
        return took / batches
    if kind == "numpy":
        arrays = {n[:-4]: np.load(path / "npy" / n, mmap_mode="r")
                  for n in os.listdir(path / "npy")}
        n = len(arrays["label"])
        rng = np.random.default_rng(1)

        def one() -> Any:
            idx = np.sort(rng.integers(0, n, batch))  # sorted: NumPy's best case
            return _stack({k: a[idx] for k, a in arrays.items()})

        for _ in range(3):
            one()
        return common.seconds(lambda: [one() for _ in range(batches)]) / batches
    if kind == "torch":
        import torch.utils.data as tud

        arrays = {n[:-4]: np.load(path / "npy" / n, mmap_mode="r")
                  for n in os.listdir(path / "npy")}

        class Memmaps(tud.Dataset):  # type: ignore[type-arg]
            def __len__(self) -> int:
                return len(arrays["label"])

            def __getitems__(self, idx: list[int]) -> Any:
                i = np.asarray(idx)
                return _stack({k: a[i] for k, a in arrays.items()})

        dl = tud.DataLoader(Memmaps(), batch_size=batch, shuffle=True,
                            collate_fn=lambda b: b, drop_last=True)
        return common.time_next(common.endless(dl), batches, warm=3) / batches
    if kind == "ceiling":
        from loaderx import _native

        rows = np.fromfile(path / "rows.bin", dtype=np.uint8)
        width = int((path / "width.txt").read_text())
        n = len(rows) // width
        rng = np.random.default_rng(1)
        dst = np.empty(batch * width, np.uint8)
        idx = [rng.integers(0, n, batch).astype(np.uint64) for _ in range(batches)]
        for i in idx[:3]:
            _native.copy_records(rows, width, i, dst)
        return common.seconds(lambda: [_native.copy_records(rows, width, i, dst)
                                       for i in idx]) / batches
    if kind.startswith("append-"):
        return _appends(kind, path, batches)
    if kind == "write-ceiling":  # the group's bytes as raw 64 KiB records, appended and synced
        import shutil

        from loaderx import Zrecord

        rows = np.fromfile(path / "rows.bin", dtype=np.uint8)
        width = int((path / "width.txt").read_text())
        block = (64 << 10) // width * width
        out = path / "ceiling-store"
        took = 0.0
        z = Zrecord(out, codec="raw")
        starts = np.arange(0, len(rows), block, dtype=np.uint64)
        t = time.perf_counter()
        for lo in range(0, len(starts), 256):
            part = starts[lo:lo + 256]
            end = min(len(rows), int(part[-1]) + block)
            z._native.append(rows[int(part[0]):end], part - part[0], "raw")
        z.sync()
        took = time.perf_counter() - t
        z.close()
        shutil.rmtree(out)
        return took
    if kind == "read_table":
        import pyarrow.parquet as pq

        return common.seconds(lambda: pq.read_table(path / "pq"))
    if kind.startswith("convert-"):
        from loaderx import from_arrow

        out = path / f"out-{kind}"
        took = common.seconds(lambda: from_arrow(out, str(path / "pq" / "*.parquet"),
                                                 group_columns=kind == "convert-grouped",
                                                 progress=False))
        import shutil
        shutil.rmtree(out)
        return took
    raise ValueError(kind)


def _chunks(lo: int, hi: int) -> tuple[list[str], np.ndarray]:
    """Rows ``lo .. hi - 1`` of the serving table: texts of 0.5-4 KiB and 384-d embeddings."""
    rng = np.random.default_rng(lo)
    words = "the of and to in is was for on that with as by at from".split()
    texts = [" ".join(rng.choice(words, int(rng.integers(100, 800)))) for _ in range(lo, hi)]
    return texts, rng.standard_normal((hi - lo, 384)).astype(np.float32)


def _appends(kind: str, path: pathlib.Path, times: int) -> float:
    """Median seconds of a durable append of 100 rows, ``times`` of them after 10,000 rows."""
    import shutil
    import tempfile

    work = pathlib.Path(tempfile.mkdtemp(dir=path))
    try:
        took = []
        if kind == "append-loaderx":
            from loaderx.intake import DirectoryWriter, append_rows

            with DirectoryWriter(work / "t", group_columns=True) as w:
                w.add_column("text", "ragged", np.uint8, extra={"string": True})
                w.add_column("emb", "dense", np.float32, (384,))
                texts, emb = _chunks(0, 10_000)
                w.append({"text": texts, "emb": emb})
            for k in range(times):
                texts, emb = _chunks(10_000 + 100 * k, 10_100 + 100 * k)
                took.append(common.seconds(lambda t=texts, e=emb: append_rows(
                    work / "t", {"text": t, "emb": e})))
        elif kind == "append-lmdb":
            import lmdb

            env = lmdb.open(str(work / "lmdb"), map_size=1 << 32, sync=True)

            def put(lo: int, hi: int) -> None:
                texts, emb = _chunks(lo, hi)
                with env.begin(write=True) as txn:
                    for i, (t, e) in enumerate(zip(texts, emb, strict=True)):
                        txn.put(b"t%d" % (lo + i), t.encode())
                        txn.put(b"e%d" % (lo + i), e.tobytes())

            put(0, 10_000)
            for k in range(times):
                took.append(common.seconds(lambda k=k: put(10_000 + 100 * k,
                                                           10_100 + 100 * k)))
            env.close()
        else:  # the ceiling: the bytes written once and fsynced
            fd = os.open(work / "f", os.O_WRONLY | os.O_CREAT, 0o644)
            for k in range(times):
                texts, emb = _chunks(10_000 + 100 * k, 10_100 + 100 * k)
                blob = "".join(texts).encode() + emb.tobytes()

                def write(b: bytes = blob) -> None:
                    os.write(fd, b)
                    os.fsync(fd)

                took.append(common.seconds(write))
            os.close(fd)
        return statistics.median(took)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fresh(kind: str, root: pathlib.Path, batch: int = 0, batches: int = 0) -> float | None:
    """:func:`child` in a new interpreter; None when it cannot run (torch missing)."""
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(root), str(batch),
                          str(batches)], capture_output=True, text=True, check=False)
    if out.returncode:
        if "No module named 'torch'" in out.stderr:
            return None
        raise RuntimeError(f"{kind}: {out.stderr[-2000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def du(path: pathlib.Path) -> tuple[int, int]:
    """Bytes on disk and apparent bytes of everything under ``path``."""
    used = apparent = 0
    for r, _, fs in os.walk(path):
        for f in fs:
            st = os.stat(os.path.join(r, f))
            used += st.st_blocks * 512
            apparent += st.st_size
    return used, apparent


def main(repeats: int = 3, rows: int = 4_000_000, batches: int = 20,
         only: str | None = None) -> None:
    if common.available("pyarrow") is not None:
        print("\n## Tables: not available (pip install pyarrow)")
        return
    from loaderx import from_arrow

    with common.scratch("loaderx-bench-tables-") as root:
        t = time.perf_counter()
        write_click_log(root, rows)
        from_arrow(root / "grouped", str(root / "pq" / "*.parquet"), group_columns=True,
                   progress=False)
        from_arrow(root / "columns", str(root / "pq" / "*.parquet"), progress=False)
        from loaderx import open_dataset

        g = open_dataset(root / "grouped")
        group = g["label"].column_group
        width = group.layout.row_bytes
        every = np.arange(rows, dtype=np.uint64)
        all_rows = np.empty(rows * width, np.uint8)
        for lo in range(0, rows, 1 << 20):
            part = every[lo:lo + (1 << 20)]
            all_rows[lo * width:(lo + len(part)) * width] = group.read(part).reshape(-1)
        all_rows.tofile(root / "rows.bin")
        (root / "width.txt").write_text(str(width))
        del all_rows
        print(f"\n## Tables: a click log of {rows:,} rows, 40 columns ({VALUE_BYTES} bytes of "
              f"values a row, {width} in the group's rows); data made in "
              f"{time.perf_counter() - t:.0f} s")
        if only in (None, "reads"):
            reads(root, repeats, batches)
        if only in (None, "conversion"):
            conversion(root, repeats)
        if only in (None, "disk"):
            disk(root, rows)
        if only in (None, "appends"):
            appends(root, repeats)


def reads(root: pathlib.Path, repeats: int, batches: int) -> None:
    kinds = ("grouped", "columns", "numpy", "torch", "ceiling")
    print(f"\n### Shuffled batches, all 40 columns stacked (ms a batch, medians of {repeats} "
          "fresh processes; ratios paired per repeat)\n")
    print(common.head("B", *kinds, "grouped / numpy", "grouped / torch", "ceiling / grouped"))
    for batch in (8192, 65536):
        n = batches if batch == 8192 else max(3, batches // 4)
        got = common.interleaved(
            {k: (lambda k=k, b=batch, n=n: fresh(k, root, b, n)) for k in kinds}, repeats)
        med = {k: (statistics.median(v) * 1e3 if None not in v else None)
               for k, v in got.items()}

        def ratio(a: str, b: str, got: dict[str, list[Any]] = got) -> str:
            if None in got[a] or None in got[b]:
                return "n/a"
            return common.spread(common.paired(got[b], got[a]))

        print(common.row(batch, *(f"{med[k]:.2f}" if med[k] is not None else "n/a"
                                  for k in kinds),
                         ratio("grouped", "numpy"), ratio("grouped", "torch"),
                         ratio("ceiling", "grouped")))
    print("\nA ratio above 1 means the first is faster. numpy sorts its batch's indices (its "
          "best case); loaderx's batches are the loader's shuffled order, stacked in the same "
          "transform. 'columns' is the layout of a store per column.")


def conversion(root: pathlib.Path, repeats: int) -> None:
    kinds = ("read_table", "convert-grouped", "convert-columns", "write-ceiling")
    got = common.interleaved({k: (lambda k=k: fresh(k, root)) for k in kinds}, repeats)
    print(f"\n### Conversion of the 8 Parquet files (s, medians of {repeats} fresh processes)\n")
    print(common.head("read_table", "from_arrow grouped", "from_arrow a store per column",
                      "durable write of the group's bytes", "grouped vs read_table",
                      "per column vs read_table", "ceiling vs read_table"))
    # The ceiling: reading and the durable write of the bytes, perfectly overlapped.
    ceiling = [r / max(r, w) for r, w in zip(got["read_table"], got["write-ceiling"],
                                             strict=True)]
    print(common.row(*(f"{statistics.median(got[k]):.2f}" for k in kinds),
                     common.spread(common.paired(got["read_table"], got["convert-grouped"])),
                     common.spread(common.paired(got["read_table"], got["convert-columns"])),
                     common.spread(ceiling)))
    print("\nThe ceiling takes reading and writing as perfectly overlapped: read_table over the "
          "longer of read_table and the durable write of the group's bytes (the engine's raw "
          "append and sync, the disk's speed in this run).")


def disk(root: pathlib.Path, rows: int) -> None:
    raw = rows * VALUE_BYTES
    pq_used, _ = du(root / "pq")
    print("\n### On disk\n")
    print(common.head("layout", "du MiB", "apparent MiB", "du / raw values", "du / Parquet"))
    for name in ("grouped", "columns"):
        used, apparent = du(root / name)
        print(common.row(name, f"{used / 2**20:.0f}", f"{apparent / 2**20:.0f}",
                         f"{used / raw:.2f}x", f"{used / pq_used:.2f}x"))
    print(f"\nRaw values: {raw / 2**20:.0f} MiB; the Parquet files (zstd): "
          f"{pq_used / 2**20:.0f} MiB.")


def appends(root: pathlib.Path, repeats: int) -> None:
    kinds = ("append-loaderx", "append-lmdb", "append-fsync")
    if common.available("lmdb") is not None:
        print("\n### Durable appends: LMDB not installed (pip install lmdb)")
        kinds = ("append-loaderx", "append-fsync")
    got = common.interleaved({k: (lambda k=k: fresh(k, root, 0, 30)) for k in kinds}, repeats)
    print(f"\n### Durable appends of 100 rows (text + 384 float32) to a 2-column table (ms, "
          f"median of 30 appends a process, medians of {repeats} processes)\n")
    cols = [k[7:] for k in kinds]
    ratios = ["loaderx / " + k for k in cols[1:]]
    print(common.head(*cols, *ratios))
    print(common.row(*(f"{statistics.median(got[k]) * 1e3:.2f}" for k in kinds),
                     *(common.spread(common.paired(got["append-loaderx"], got[k]))
                       for k in kinds[1:])))
    print("\nA ratio here is loaderx's time over the other's: below 1 is faster. The target is "
          "at most 3x LMDB's.")


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--batches", type=int, default=20, help="batches of 8192 timed")
    parser.add_argument("--only", choices=("reads", "conversion", "disk", "appends"),
                        help="one section (the data is made all the same)")
    args = parser.parse_args(argv)
    main(args.repeats, args.rows, args.batches, args.only)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, root, batch, batches = sys.argv[2:6]
        print(json.dumps(child(kind, root, int(batch), int(batches))))
    else:
        common.standalone(cli)
