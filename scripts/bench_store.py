"""Store layer of the benchmark: zrecord against the other record and array stores.

Workloads: 20000 records of 12 KiB and 4000 of 128 KiB of mildly compressible structured data
(each record is rows of 512 bytes: 448 random bytes and a 64-byte field repeated from the
record's first row, about 1.1x compressible with zstd level 3). For each store: write MiB/s,
random gather (256 distinct indices drawn at random, sorted) and sequential gather (consecutive
windows of 256) in MiB/s of logical bytes returned, ms per random batch, size on disk
(allocated blocks), compression ratio, and the fraction of records stored compressed.

Every gather allocates its output array, as a client does. The ceiling row copies the same
records at the same indices out of an in-memory buffer on loaderx's own thread pool: it is the
cost of the memory traffic alone. The page-cache ceiling runs the very same copy with the source
being a memory map of a plain file holding the data, already in the page cache: what any reader
of a file-backed store can reach on this machine (every store here reads through the page
cache). Both ceilings hold their records page-aligned, as a zrecord chunk does, so each record
is copied with the same alignment as zrecord's copy of it (this machine's `memcpy` speed
depends on it).

MiB/s columns are medians over repeats; the ratio columns compare two rows repeat by repeat
and give the median of those paired ratios (see :func:`paired_ratio`).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np

import _bench_common as common

BATCH = 256
WORKLOADS = [(20000, 12 * 1024), (4000, 128 * 1024)]


def make_data(n: int, size: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    rows = data.reshape(n, size // 512, 512)
    rows[:, 1:, 448:] = rows[:, :1, 448:]  # the repeated field
    return data


def disk_bytes(path: pathlib.Path) -> int:
    if path.is_file():
        return os.stat(path).st_blocks * 512
    return sum(os.stat(p).st_blocks * 512 for p in path.rglob("*") if p.is_file())


def draws(n: int, batches: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.sort(rng.choice(n, size=BATCH, replace=False)) for _ in range(batches)]


def windows(n: int, batches: int) -> list[np.ndarray]:
    starts = np.arange(batches) * BATCH % (n - BATCH)
    return [np.arange(s, s + BATCH) for s in starts]


def timed(fn: Callable[[np.ndarray], np.ndarray], batches: list[np.ndarray],
          check: np.ndarray | None) -> float:
    fn(batches[0])  # warm (page cache, first-touch of mappings)
    t = time.perf_counter()
    for idx in batches:
        out = fn(idx)
    elapsed = time.perf_counter() - t
    if check is not None:
        assert np.array_equal(out, check[batches[-1]]), "contender returned wrong data"
    return elapsed


# -- contenders: each returns (write_seconds, gather(idx) -> array, path) or None if missing --
def zrecord(codec: str):
    def build(data: np.ndarray, root: pathlib.Path):
        from loaderx.zrecord import Zrecord

        path = root / f"zr-{codec}"
        n, size = data.shape
        z = Zrecord(path, codec="zstd" if codec == "zstd_dict" else codec)
        t = time.perf_counter()
        if codec == "zstd_dict":
            sample = np.ascontiguousarray(data[:: max(1, n // 1000)][:1000])
            z.train_dict(sample, np.full(len(sample), size), 112 * 1024)
        step = max(1, (64 << 20) // size)
        for i in range(0, n, step):
            block = data[i : i + step]
            z.append(block, np.arange(len(block), dtype=np.uint64) * size, codec=codec)
        z.sync()
        write = time.perf_counter() - t
        st = z.stats()

        # Destination offsets depend only on the batch size (every batch here holds BATCH
        # records): computed once, as a client would.
        offsets = np.arange(BATCH, dtype=np.uint64) * size

        def gather(idx: np.ndarray) -> np.ndarray:
            out = np.empty((BATCH, size), dtype=np.uint8)
            z.gather(idx, out, offsets)
            return out

        gather.compressed = st["compressed_records"] / st["records"]  # type: ignore[attr-defined]
        return write, gather, path

    return build


def _copy_gather(flat: np.ndarray, size: int) -> Callable[[np.ndarray], np.ndarray]:
    """Gathers by copying records out of ``flat`` on loaderx's pool with its copy routine."""
    from loaderx import _native

    def gather(idx: np.ndarray) -> np.ndarray:
        out = np.empty((len(idx), size), dtype=np.uint8)
        _native.copy_records(flat, size, idx.astype(np.uint64), out.reshape(-1))
        return out

    return gather


def ceiling(data: np.ndarray, root: pathlib.Path):
    # Page-aligned, as records are in a chunk file and in the page-cache ceiling's map, so that
    # every row copies each record with the same alignment against the same destination.
    raw = np.empty(data.nbytes + 4096, dtype=np.uint8)
    skip = -raw.ctypes.data % 4096
    flat = raw[skip : skip + data.nbytes]
    flat[:] = data.reshape(-1)
    return None, _copy_gather(flat, data.shape[1]), None


def ceiling_page_cache(data: np.ndarray, root: pathlib.Path):
    n, size = data.shape
    path = root / "ceiling.bin"
    data.tofile(path)
    flat = np.memmap(path, dtype=np.uint8, mode="r", shape=(n * size,))
    flat[:].sum(dtype=np.uint64)  # map every page once, as a warmed-up store has
    return None, _copy_gather(flat, size), None


def npy_mmap(data: np.ndarray, root: pathlib.Path):
    path = root / "data.npy"
    t = time.perf_counter()
    np.save(path, data)
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    write = time.perf_counter() - t
    arr = np.load(path, mmap_mode="r")
    return write, (lambda idx: arr[idx]), path


def h5py_store(compression: str | None):
    def build(data: np.ndarray, root: pathlib.Path):
        import h5py

        n, size = data.shape
        path = root / f"h5-{compression}.h5"
        t = time.perf_counter()
        with h5py.File(path, "w") as f:
            opts = {"compression": "gzip", "compression_opts": 4} if compression else {}
            f.create_dataset("x", data=data, chunks=(1, size), **opts)
        write = time.perf_counter() - t
        ds = h5py.File(path, "r")["x"]
        return write, (lambda idx: ds[idx]), path

    return build


def blosc2_store(data: np.ndarray, root: pathlib.Path):
    import blosc2

    n, size = data.shape
    path = root / "b2.b2nd"
    t = time.perf_counter()
    cparams = blosc2.CParams(codec=blosc2.Codec.ZSTD, clevel=3)
    blosc2.asarray(data, chunks=(1, size), blocks=(1, size), urlpath=str(path), mode="w",
                   cparams=cparams)
    write = time.perf_counter() - t
    arr = blosc2.open(str(path))
    return write, (lambda idx: np.stack([arr[int(i)] for i in idx])), path


def array_record_store(options: str):
    def build(data: np.ndarray, root: pathlib.Path):
        from array_record.python import array_record_module as ar

        n, size = data.shape
        path = root / f"ar-{options.replace(':', '').replace(',', '-')}.array_record"
        t = time.perf_counter()
        w = ar.ArrayRecordWriter(str(path), options)
        for row in data:
            w.write(row.tobytes())
        w.close()
        write = time.perf_counter() - t
        r = ar.ArrayRecordReader(str(path))

        def gather(idx: np.ndarray) -> np.ndarray:
            recs = r.read([int(i) for i in idx])
            return np.frombuffer(b"".join(recs), dtype=np.uint8).reshape(len(idx), size)

        return write, gather, path

    return build


def tensorstore_store(data: np.ndarray, root: pathlib.Path):
    import tensorstore as ts

    n, size = data.shape
    path = root / "ts.zarr"
    spec = {
        "driver": "zarr",
        "kvstore": {"driver": "file", "path": str(path)},
        "metadata": {"shape": [n, size], "chunks": [1, size], "dtype": "|u1",
                     "compressor": {"id": "zstd", "level": 3}},
        "create": True, "delete_existing": True,
    }
    t = time.perf_counter()
    arr = ts.open(spec).result()
    arr.write(data).result()
    write = time.perf_counter() - t
    return write, (lambda idx: arr[idx].read().result()), path


CONTENDERS: list[tuple[str, Callable]] = [
    ("ceiling (memcpy)", ceiling),
    ("ceiling (page cache)", ceiling_page_cache),
    ("zrecord-raw", zrecord("raw")),
    ("zrecord-zstd", zrecord("zstd")),
    ("zrecord-zstdict", zrecord("zstd_dict")),
    ("npy-mmap", npy_mmap),
    ("arrayrecord", array_record_store("group_size:1,uncompressed")),
    ("arrayrecord-zstd", array_record_store("group_size:1,zstd:3")),
    ("hdf5", h5py_store(None)),
    ("hdf5-gzip", h5py_store("gzip")),
    ("blosc2", blosc2_store),
    ("tensorstore", tensorstore_store),
]
# Slow contenders read fewer batches so the run stays short; their MiB/s is still a median.
SLOW = {"hdf5", "hdf5-gzip", "blosc2", "tensorstore", "arrayrecord", "arrayrecord-zstd"}


def run(repeats: int = 5, workloads=WORKLOADS, only: set[str] | None = None) -> list[dict]:
    """Builds every store, then measures them round-robin, so that a noisy moment on the shared
    machine hits all contenders alike rather than one of them; ratios between rows are paired
    by repeat (:func:`paired_ratio`)."""
    results = []
    for n, size in workloads:
        data = make_data(n, size)
        logical = data.nbytes
        batch_mib = BATCH * size / 2**20
        with common.scratch("loaderx-bench-") as root:
            built = []
            for name, build in CONTENDERS:
                if only and name not in only:
                    continue
                try:
                    built.append((name, *build(data, root)))
                except ImportError:
                    continue
            # Flush every contender's dirty pages now, so that background writeback of one store
            # does not land inside another's timings.
            os.sync()
            time.sleep(2)
            times: dict[str, tuple[list[float], list[float]]] = {b[0]: ([], []) for b in built}
            for r in range(repeats):
                # Each repeat runs every contender's random gathers back to back, then their
                # sequential ones, starting from a different contender each time.
                order = built[r % len(built):] + built[: r % len(built)]
                # pick(k): k batches of indices, random then sequential; partial binds this
                # workload's n and this repeat's r now, not when pick is called.
                for kind, pick in enumerate((partial(draws, n, seed=r), partial(windows, n))):
                    for name, _write, gather, _path in order:
                        batches = 10 if name in SLOW else max(20, (256 << 20) // (BATCH * size))
                        times[name][kind].append(timed(gather, pick(batches), data) / batches)
            for name, write, gather, path in built:
                rnd_s, seq_s = (statistics.median(t) for t in times[name])
                disk = disk_bytes(path) if path is not None else None
                results.append({
                    "workload": f"{size // 1024} KiB", "store": name,
                    "write": logical / 2**20 / write if write else None,
                    "rnd": batch_mib / rnd_s, "seq": batch_mib / seq_s, "ms": rnd_s * 1e3,
                    "disk": disk, "ratio": logical / disk if disk else None,
                    "compressed": getattr(gather, "compressed", None),
                    "rnd_times": times[name][0],
                })
    return results


def paired_ratio(row: dict, base: dict | None) -> float:
    """How fast ``row`` gathers at random relative to ``base``: the median over repeats of the
    two rows' speed ratio within each repeat. The rows of one repeat run back to back, so a
    slow moment of the shared machine that spans both cancels out of their ratio."""
    if base is None:
        return 0.0
    return statistics.median(
        b / r for b, r in zip(base["rnd_times"], row["rnd_times"], strict=True))


def table(results: list[dict]) -> str:
    lines = []
    for workload in dict.fromkeys(r["workload"] for r in results):
        rows = [r for r in results if r["workload"] == workload]
        base = {r["store"]: r for r in rows}
        ceil = base.get("ceiling (memcpy)")
        npy = base.get("npy-mmap")
        cache = base.get("ceiling (page cache)")
        lines.append(f"\n{workload} records, batch {BATCH}:\n")
        lines.append(common.head(
            "store", "write MiB/s", "gather rnd MiB/s", "gather seq MiB/s", "ms/batch (rnd)",
            "on disk MiB", "ratio", "stored compressed", "rnd vs ceiling",
            "rnd vs page-cache ceiling", "rnd vs npy-mmap"))
        for r in rows:
            f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
            lines.append(
                f"| {r['store']} | {f(r['write'], '.0f')} | {r['rnd']:.0f} | {r['seq']:.0f} "
                f"| {r['ms']:.2f} | {f(r['disk'] and r['disk'] / 2**20, '.0f')} "
                f"| {f(r['ratio'], '.2f')}x "
                f"| {f(r['compressed'], '.0%')} | {paired_ratio(r, ceil):.2f}x "
                f"| {paired_ratio(r, cache):.2f}x | {paired_ratio(r, npy):.2f}x |"
            )
    return "\n".join(lines)


DICT_SCRIPT = """
import sys, time, numpy as np
from loaderx.converter import from_numpy
data = np.load(sys.argv[1], mmap_mode="r")
t = time.perf_counter()
from_numpy(sys.argv[2], data, codec="zstd_dict")
print(time.perf_counter() - t)
"""


def dict_write(repeats: int = 3, n: int = 2400, size: int = 12 * 1024) -> str:
    """``from_numpy(codec="zstd_dict")`` (dictionary training plus level-19 compression) in
    MiB/s: loaderx on all cores, loaderx on one (``LOADERX_NUM_THREADS=1``), and loaderx 0.9.11
    from its virtual environment when there is one; each conversion in its own process."""
    import subprocess
    import sys

    ref = pathlib.Path(__file__).resolve().parent.parent / ".cache" / "loaderx-0.9.11-venv"
    with common.scratch("loaderx-bench-dict-") as root:
        np.save(root / "data.npy", make_data(n, size))
        mib = n * size / 2**20
        pythons = {"loaderx (all cores)": (sys.executable, {}),
                   "loaderx (1 thread)": (sys.executable, {"LOADERX_NUM_THREADS": "1"})}
        if (ref / "bin" / "python").exists():
            pythons["loaderx 0.9.11"] = (str(ref / "bin" / "python"), {})
        times: dict[str, list[float]] = {k: [] for k in pythons}
        for r in range(repeats):
            for name, (py, env) in pythons.items():
                out = root / f"out-{r}-{len(times[name])}-{name.split()[-1].strip(')')}"
                p = subprocess.run([py, "-c", DICT_SCRIPT, str(root / "data.npy"), str(out)],
                                   capture_output=True, text=True, env={**os.environ, **env},
                                   cwd=ref if "0.9.11" in name else None)
                if p.returncode == 0:
                    times[name].append(float(p.stdout.strip().splitlines()[-1]))
                shutil.rmtree(out, ignore_errors=True)
        lines = [f"\nzstd_dict conversion of {n} records of {size // 1024} KiB ({mib:.1f} MiB), "
                 f"medians of {repeats}:\n", common.head("converter", "MiB/s", "vs 1 thread")]
        one = statistics.median(times["loaderx (1 thread)"])
        for name, ts in times.items():
            if ts:
                t = statistics.median(ts)
                lines.append(common.row(name, f"{mib / t:.2f}", f"{one / t:.2f}x"))
        return "\n".join(lines)


def main(repeats: int = 5) -> None:
    print(f"\n## Store: zrecord against the alternatives (medians of {repeats} runs)")
    print(table(run(repeats)))
    print(dict_write(min(repeats, 3)))


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (median)")
    parser.add_argument("--dict-write", action="store_true",
                        help="only the zstd_dict conversion table (dict_write)")
    args = parser.parse_args(argv)
    if args.dict_write:
        print(dict_write(args.repeats))
    else:
        main(args.repeats)


if __name__ == "__main__":
    common.standalone(cli)
