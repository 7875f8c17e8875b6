"""Write layer of the benchmark: conversions against loaderx 0.9.11 and against the ceilings.

Dense rows: ``from_numpy(path, np.load(f, mmap_mode="r"), codec=...)`` of the store benchmark's
20,000 records of 12 KiB (240 MB of mildly structured data, see ``bench_store.make_data``) for
raw, zstd and zstd_dict, by this loaderx and by loaderx 0.9.11 (its own virtual environment:
``LOADERX_REF_VENV`` or ``.cache/loaderx-0.9.11-venv``). Every conversion runs in a process of
its own, from a cold start of the converter but with the source in the page cache; the time is
the call's, which ends with the data durable (ours syncs; the figure is what a caller waits).
Runs are interleaved (every repeat runs each contender once, in a rotating order) and the
table gives medians, and the ratio as the median of the paired per-repeat ratios.

The ceilings are measured in the same run on the same bytes: compression on all cores
(``zstd -b3 -T<cores>`` on the array's bytes as one file; its compression figure, not the
decompression one it also prints) and the disk's sequential write rate (``fio``, 1 MiB
``pwrite``s of the same size, ending with an ``fsync`` as a conversion does). The target is
the lower of the two.

Ragged rows: ``from_iterator`` of records of 4-20 KiB cut from the same bytes (zstd), ours and
the reference. Intake rows: ``loaderx.intake.from_arrow`` of a Parquet file (zstd Parquet)
against ``pyarrow.parquet.read_table`` of the same file, in steady state (alternating, the
first round dropped), on a narrow table (a 1 KiB binary column and an int64 column, 40,000
rows) and a wide one (64 float64 columns, 40,000 rows).

The profile rows split one zstd conversion of ours into stages (``_native.write_profile``:
thread-seconds of compressing, placing, writing and syncing), beside the time to read the
source once (a copy of the memory map's pages).

    python scripts/bench_write.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_store import make_data

ROOT = pathlib.Path(__file__).resolve().parent.parent
REF_VENV = pathlib.Path(os.environ.get("LOADERX_REF_VENV",
                                       ROOT / ".cache" / "loaderx-0.9.11-venv"))
N, SIZE = 20000, 12 * 1024
#: zstd_dict compresses at level 19 (a few MB/s per core): its rows convert the first records only.
N_DICT = 2400
CODECS = ("raw", "zstd", "zstd_dict")

CHILD = r"""
import sys, time
import numpy as np
from loaderx.converter import from_numpy, from_iterator
mode, data, out, codec = sys.argv[1:5]
arr = np.load(data, mmap_mode="r")
if mode == "numpy":
    t = time.perf_counter()
    from_numpy(out, arr, codec=codec)
else:
    flat = arr.reshape(-1)
    cuts = np.load(sys.argv[5])
    t = time.perf_counter()
    from_iterator(out, (flat[a:b] for a, b in zip(cuts[:-1], cuts[1:])), codec=codec)
print(time.perf_counter() - t)
"""


def cores() -> int:
    return len(os.sched_getaffinity(0))


def convert(python: str, mode: str, data: pathlib.Path, out: pathlib.Path, codec: str,
            cuts: pathlib.Path, cwd: pathlib.Path | None) -> float | None:
    p = subprocess.run([python, "-c", CHILD, mode, str(data), str(out), codec, str(cuts)],
                       capture_output=True, text=True, cwd=cwd)
    shutil.rmtree(out, ignore_errors=True)
    if p.returncode:
        print(f"{python} {mode} {codec} failed: {p.stderr[-400:]}", file=sys.stderr)
        return None
    return float(p.stdout.strip().splitlines()[-1])


def zstd_ceiling(raw: pathlib.Path, threads: int, block: int | None = None) -> float | None:
    """``zstd -b3 -T<threads>`` compression speed of ``raw`` in MiB/s."""
    if shutil.which("zstd") is None:
        return None
    cmd = ["zstd", "-b3", f"-T{threads}", "-i2", str(raw)] + ([f"-B{block}"] if block else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    text = (p.stdout + p.stderr).replace("\r", "\n")
    # "3#data.bin : 245760000 -> 217495890 (x1.130), 93.3 MB/s, 2465.9 MB/s": compression first
    found = re.findall(r"\),\s*([\d.]+) MB/s,\s*([\d.]+) MB/s", text)
    return float(found[-1][0]) * 1e6 / 2**20 if found else None


def allocated_bytes(tree: pathlib.Path) -> int:
    """The bytes the files below ``tree`` take on the disk (a store's table is sparse)."""
    return sum(f.stat().st_blocks * 512 for f in tree.rglob("*") if f.is_file())


def fio_write(where: pathlib.Path, size: int) -> float | None:
    """Sequential 1 MiB writes of ``size`` bytes with an fsync at the end, in MiB/s."""
    if shutil.which("fio") is None:
        return None
    target = where / "fio.bin"
    try:
        p = subprocess.run(["fio", "--name=seqwrite", f"--filename={target}", "--rw=write",
                            "--bs=1M", f"--size={size}", "--ioengine=psync", "--end_fsync=1",
                            "--output-format=json"], capture_output=True, text=True)
        if p.returncode:
            return None
        return json.loads(p.stdout)["jobs"][0]["write"]["bw_bytes"] / 2**20
    finally:
        target.unlink(missing_ok=True)


def paired(ours: list[float | None], theirs: list[float | None]) -> float | None:
    """Median over repeats of theirs/ours time (above 1: ours is faster)."""
    pairs = [t / o for o, t in zip(ours, theirs, strict=False) if o and t]
    return statistics.median(pairs) if pairs else None


def med(ts: list[float | None]) -> float | None:
    ok = [t for t in ts if t]
    return statistics.median(ok) if ok else None


def fmt(x: float | None, spec: str = ".0f") -> str:
    return "-" if x is None else format(x, spec)


def conversions(root: pathlib.Path, repeats: int) -> list[str]:
    data = root / "data.npy"
    arr = make_data(N, SIZE)
    np.save(data, arr)
    np.save(root / "dict.npy", arr[:N_DICT])
    raw = root / "data.bin"
    arr.tofile(raw)
    rng = np.random.default_rng(1)
    sizes = rng.integers(4 << 10, 20 << 10, size=arr.nbytes // (12 << 10))
    cuts = np.concatenate([[0], np.cumsum(sizes)])
    cuts = cuts[cuts <= arr.nbytes]
    np.save(root / "cuts.npy", cuts)
    ragged_mib = int(cuts[-1]) / 2**20
    del arr
    mib = N * SIZE / 2**20
    ref_py = REF_VENV / "bin" / "python"
    sides = {"ours": (sys.executable, None)}
    if ref_py.exists():
        sides["0.9.11"] = (str(ref_py), REF_VENV)
    jobs = [(mode, codec, side) for mode, codec in
            [("numpy", c) for c in CODECS] + [("iter", "zstd")] for side in sides]
    times: dict[tuple[str, str, str], list[float | None]] = {j: [] for j in jobs}
    zstd_all: list[float | None] = []
    zstd_rec: list[float | None] = []
    disk: list[float | None] = []
    n = cores()
    for r in range(repeats):
        order = jobs[r % len(jobs):] + jobs[:r % len(jobs)]
        for mode, codec, side in order:
            py, cwd = sides[side]
            out = root / f"out-{mode}-{codec}-{side.replace('.', '')}-{r}"
            source = root / "dict.npy" if codec == "zstd_dict" else data
            times[(mode, codec, side)].append(
                convert(py, mode, source, out, codec, root / "cuts.npy", cwd))
        zstd_all.append(zstd_ceiling(raw, n))
        zstd_rec.append(zstd_ceiling(raw, n, SIZE))
        disk.append(fio_write(root, N * SIZE))
    lo = [min(a, d) if a and d else None for a, d in zip(zstd_all, disk, strict=False)]
    lines = [
        f"\n### Conversion of {N} records of {SIZE // 1024} KiB ({mib:.0f} MiB), "
        f"{n} cores, medians of {repeats} interleaved runs",
        "",
        f"Ceilings in the same run: `zstd -b3 -T{n}` compresses these bytes at "
        f"{fmt(med(zstd_all))} MiB/s (as 12 KiB blocks, `-B{SIZE}`: {fmt(med(zstd_rec))} "
        f"MiB/s); fio writes {fmt(med(disk))} MiB/s sequentially (1 MiB writes, fsync at the "
        f"end). Lower ceiling: {fmt(med(lo))} MiB/s.",
        "",
        "| conversion | loaderx MiB/s | 0.9.11 MiB/s | vs 0.9.11 | vs lower ceiling |",
        "|---|---|---|---|---|",
    ]
    for mode, codec in [("numpy", c) for c in CODECS] + [("iter", "zstd")]:
        size = (N_DICT * SIZE / 2**20 if codec == "zstd_dict" else
                mib if mode == "numpy" else ragged_mib)
        ours = times[(mode, codec, "ours")]
        theirs = times.get((mode, codec, "0.9.11"), [])
        o, t = med(ours), med(theirs)
        ceiling = [size / c for c in lo] if all(lo) else [None]
        vs_ceiling = None
        if codec == "zstd" and all(lo) and all(ours):
            vs_ceiling = statistics.median(c / x for c, x in zip(ceiling, ours, strict=False)
                                           if c and x)
        if codec == "raw" and all(disk) and all(ours):
            vs_ceiling = statistics.median(size / d / x for d, x in zip(disk, ours, strict=False)
                                           if d and x)
        name = (f"from_numpy {codec}" if mode == "numpy" and codec != "zstd_dict"
                else f"from_numpy zstd_dict (first {N_DICT} records, training included)"
                if mode == "numpy"
                else f"from_iterator {codec} (ragged, 4-20 KiB, {ragged_mib:.0f} MiB)")
        lines.append(f"| {name} | {fmt(size / o if o else None)} | "
                     f"{fmt(size / t if t else None)} | {fmt(paired(ours, theirs), '.2f')}x | "
                     f"{fmt(vs_ceiling, '.2f')}x |")
    lines.append("\n(raw rows: against the disk's rate alone; zstd rows: against the lower "
                 "ceiling; zstd_dict compresses at level 19, which the level-3 ceiling does not "
                 "bound.)")
    lines += profile(data)
    return lines


def profile(data: pathlib.Path) -> list[str]:
    """One zstd conversion of ours in this process, split into stages."""
    from loaderx import _native
    from loaderx.converter import from_numpy

    if not hasattr(_native, "write_profile"):
        return ["\n(no per-stage profile: the native module was built without `bench`)"]
    arr = np.load(data, mmap_mode="r")
    buf = np.empty(8 << 20, dtype=np.uint8)
    flat = arr.reshape(-1)
    t = time.perf_counter()
    for a in range(0, flat.size, buf.size):
        piece = flat[a:a + buf.size]
        buf[:piece.size] = piece
    read = time.perf_counter() - t
    out = data.parent / "out-profile"
    _native.write_profile(True)
    t, c = time.perf_counter(), time.process_time()
    from_numpy(out, arr, codec="zstd")
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    stages = _native.write_profile(True)
    shutil.rmtree(out, ignore_errors=True)
    lines = [f"\nProfile of one zstd from_numpy of ours: {wall:.3f} s wall, {cpu:.2f} s CPU "
             f"(all threads); reading the source once (a copy of the map) {read:.3f} s.",
             "", "| stage | seconds (thread-seconds where parallel) | calls |", "|---|---|---|"]
    for name in ("compress", "plan", "write", "checksum", "sync", "append"):
        s, k = stages.get(name, (0.0, 0))
        lines.append(f"| {name} | {s:.3f} | {k} |")
    return lines


def intake(root: pathlib.Path, repeats: int) -> list[str]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return ["\n(no pyarrow: intake rows skipped)"]
    from loaderx.intake import from_arrow

    rng = np.random.default_rng(2)
    rows = 40000
    blobs = rng.integers(0, 256, size=(rows, 1024), dtype=np.uint8)
    blobs[:, 512:] = blobs[:, :1]  # half of each value repeats: Parquet's zstd shrinks it
    narrow = pa.table({"blob": pa.array(list(map(bytes, blobs)), pa.binary()),
                       "n": pa.array(np.arange(rows, dtype=np.int64))})
    wide = pa.table({f"c{i}": pa.array(np.round(rng.standard_normal(rows), 3))
                     for i in range(64)})
    lines = ["", f"### Intake: from_arrow of a Parquet file against read_table, {rows} rows, "
             f"medians of {repeats} (steady state)", "",
             "| table | file MB | read_table ms | from_arrow ms | from_arrow / read_table speed "
             "| stored MB | their durable write at fio's rate, ms | ceiling of the ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for name, table in [("narrow (1 KiB binary + int64)", narrow),
                        ("wide (64 float64 columns)", wide)]:
        path = root / f"{name.split()[0]}.parquet"
        pq.write_table(table, path, compression="zstd")
        read: list[float] = []
        conv: list[float] = []
        stored = 0
        for r in range(repeats + 1):
            t = time.perf_counter()
            pq.read_table(path)
            a = time.perf_counter() - t
            out = root / f"arrow-{r}"
            t = time.perf_counter()
            from_arrow(out, str(path))
            b = time.perf_counter() - t
            stored = allocated_bytes(out)
            shutil.rmtree(out, ignore_errors=True)
            if r:
                read.append(a)
                conv.append(b)
        ratio = statistics.median(a / b for a, b in zip(read, conv, strict=False))
        # The conversion must make its bytes durable: at best the disk's sequential rate, in
        # the same run, overlapped with reading the file (so the ratio cannot pass
        # read_table / max(read_table, that write)).
        rate = fio_write(root, max(stored, 1 << 20))
        write_ms = stored / 2**20 / rate * 1e3 if rate else None
        read_ms = statistics.median(read) * 1e3
        ceiling = min(1.0, read_ms / write_ms) if write_ms else None
        lines.append(f"| {name} | {os.path.getsize(path) / 1e6:.1f} | {read_ms:.1f} | "
                     f"{statistics.median(conv) * 1e3:.1f} | {ratio:.2f}x | "
                     f"{stored / 1e6:.1f} | {fmt(write_ms, '.1f')} | {fmt(ceiling, '.2f')}x |")
    return lines


def main(repeats: int = 5) -> None:
    root = pathlib.Path(tempfile.mkdtemp(prefix="loaderx-bench-write-",
                                         dir=os.environ.get("LOADERX_BENCH_DIR")))
    try:
        print(f"\n## Write: conversions against loaderx 0.9.11 and the ceilings "
              f"(medians of {repeats})")
        print("\n".join(conversions(root, repeats)))
        print("\n".join(intake(root, repeats)))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    main(parser.parse_args().repeats)
