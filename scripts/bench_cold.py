"""Cold layer of the benchmark: random gathers and the loader when nothing is in the page cache.

Stores of about 1 GiB each (12 KiB and 128 KiB records of the store benchmark's data) are
written once: a dense dataset as zrecord-raw and as zrecord-zstd, and the same array as a
``.npy`` file. Before every batch, every file of the store about to be read is evicted
(``posix_fadvise(DONTNEED)``; ``fincore`` confirms that nothing of it stays resident), so each
batch of 256 sorted random records comes from the device. For each contender: ms per batch,
MiB/s of records returned, and the bytes the process read from the device per batch
(``read_bytes`` of ``/proc/self/io``) against the bytes of the records (raw), which shows
readahead amplification.

Contenders: the parallel-pread ceiling (plain ``pread`` of exactly each record from the
``.npy`` file on 32 and on 64 threads, in Rust: what parallel reads get from this device; the
ratio column is against the faster of the two in the same repeat), zrecord-raw and zrecord-zstd
(``Zrecord.gather``), ``np.load(mmap_mode='r')`` fancy indexing, and loaderx 0.9.11 when its
virtual environment exists (``.cache/loaderx-0.9.11-venv``, made by the compatibility test),
reading the zrecord-raw store. ``fio`` (random reads with ``O_DIRECT``, queue depth 128), when
installed, gives the device's own figure.

The loader rows run a ``DataLoader`` over the 12 KiB zrecord-raw dataset in a child process
whose memory cgroup allows 512 MiB (so the 1 GiB dataset cannot stay cached, the way a data set
larger than RAM cannot), with readahead on (the default) and off, against the pread ceiling in
batches per second.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

import _bench_common as common
from bench_store import BATCH, make_data

ROOT = pathlib.Path(__file__).resolve().parent.parent
REF_VENV = pathlib.Path(os.environ.get("LOADERX_REF_VENV",
                                       ROOT / ".cache" / "loaderx-0.9.11-venv"))
WORKLOADS = [(12 * 1024, 1 << 30), (128 * 1024, 1 << 30)]
BATCHES = 6


def read_bytes() -> int:
    for line in open("/proc/self/io"):
        if line.startswith("read_bytes"):
            return int(line.split()[1])
    return 0


def evict(paths: list[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_bytes(paths: list[str]) -> int | None:
    """What ``fincore`` says is cached of ``paths`` (None without fincore)."""
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *paths],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum(int(v) for v in out.split())


def store_files(path: str) -> list[str]:
    return [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".zr")]


def build(root: pathlib.Path, size: int, total: int) -> dict[str, str]:
    from loaderx.converter import from_numpy

    n = total // size
    npy = root / f"data{size}.npy"
    out = np.lib.format.open_memmap(npy, mode="w+", dtype=np.uint8, shape=(n, size))
    step = max(1, (64 << 20) // size)
    for i in range(0, n, step):
        block = make_data(min(step, n - i), size, seed=i)
        out[i:i + len(block)] = block.reshape(len(block), size)
    out.flush()
    del out
    paths = {"npy": str(npy)}
    for codec in ("raw", "zstd"):
        paths[codec] = str(root / f"zrecord-{codec}-{size}")
        from_numpy(paths[codec], np.load(npy, mmap_mode="r"), codec=codec, progress=False)
    os.sync()
    return paths


def contenders(paths: dict[str, str], size: int):
    """(name, files to evict, gather(idx, dst)) for each contender."""
    from loaderx import _native
    from loaderx.zrecord import Zrecord

    header = int(np.load(paths["npy"], mmap_mode="r").offset)
    npy_files = [paths["npy"]]
    offs = np.arange(BATCH, dtype=np.uint64) * np.uint64(size)

    def pread(threads: int):
        def gather(idx: np.ndarray, dst: np.ndarray) -> None:
            _native.pread_records(paths["npy"], idx * np.uint64(size) + np.uint64(header), size,
                                  dst, threads)
        return gather

    out = [("pread ceiling (32 threads)", npy_files, pread(32)),
           ("pread ceiling (64 threads)", npy_files, pread(64))]
    for codec in ("raw", "zstd"):
        z = Zrecord(paths[codec])
        out.append((f"zrecord-{codec}", store_files(paths[codec]),
                    lambda idx, dst, z=z: z.gather(idx, dst, offs)))
    def npy_gather(idx: np.ndarray, dst: np.ndarray) -> None:
        # A fresh map per batch: pages a live map holds cannot be evicted, and would then be
        # cached for the next batch (of every contender reading the same file).
        arr = np.load(paths["npy"], mmap_mode="r")
        dst.reshape(BATCH, size)[:] = arr[idx]
        del arr
    out.append(("npy-mmap", npy_files, npy_gather))
    return out


REF_SCRIPT = """
import json, os, sys, time
import numpy as np
from loaderx.zrecord import Zrecord
path, size, draws = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
files = [os.path.join(path, f) for f in os.listdir(path) if f.endswith('.zr')]
def io():
    for l in open('/proc/self/io'):
        if l.startswith('read_bytes'):
            return int(l.split()[1])
z = Zrecord(path)
offs = np.arange(len(draws[0]), dtype=np.uint64) * np.uint64(size)
out = []
for idx in draws:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    dst = np.empty(len(idx) * size, dtype=np.uint8)
    b = io(); t = time.perf_counter()
    z.gather(np.array(idx, dtype=np.uint64), dst, offs)
    out.append((time.perf_counter() - t, io() - b))
print(json.dumps(out))
"""


def reference(path: str, size: int, draws: list[np.ndarray]) -> list[tuple[float, int]] | None:
    py = REF_VENV / "bin" / "python"
    if not py.exists():
        return None
    r = subprocess.run([str(py), "-c", REF_SCRIPT, path, str(size),
                        json.dumps([d.tolist() for d in draws])],
                       capture_output=True, text=True, cwd=REF_VENV)
    if r.returncode:
        print(f"loaderx 0.9.11 failed (exit {r.returncode}): {r.stderr[-500:]}", file=sys.stderr)
        return None
    return [tuple(x) for x in json.loads(r.stdout)]


def fio(path: str, size: int) -> float | None:
    """The device's random-read MiB/s at this block size (O_DIRECT, queue depth 128)."""
    if shutil.which("fio") is None:
        return None
    r = subprocess.run(["fio", "--name=cold", f"--filename={path}", "--rw=randread",
                        f"--bs={size}", "--direct=1", "--ioengine=libaio", "--iodepth=128",
                        "--runtime=8", "--time_based", "--output-format=json",
                        f"--size={os.path.getsize(path) // size * size}"],
                       capture_output=True, text=True)
    if r.returncode:
        return None
    return json.loads(r.stdout)["jobs"][0]["read"]["bw_bytes"] / 2**20


def run(repeats: int = 3) -> list[dict]:
    results = []
    for size, total in WORKLOADS:
        with common.scratch("loaderx-cold-", os.environ.get("LOADERX_BENCH_DIR")) as root:
            paths = build(root, size, total)
            n = total // size
            rows = contenders(paths, size)
            times: dict[str, list[tuple[float, int]]] = {name: [] for name, _, _ in rows}
            ref: list[tuple[float, int]] = []
            residue = 0
            for r in range(repeats):
                rng = np.random.default_rng(r)
                draws = [np.sort(rng.choice(n, BATCH, replace=False)).astype(np.uint64)
                         for _ in range(BATCHES)]
                order = rows[r % len(rows):] + rows[:r % len(rows)]
                for name, files, gather in order:
                    dst = np.empty(BATCH * size, dtype=np.uint8)
                    for k, idx in enumerate(draws):
                        evict(files)
                        if k == 0:
                            residue = max(residue, resident_bytes(files) or 0)
                        before = read_bytes()
                        t = time.perf_counter()
                        gather(idx, dst)
                        times[name].append((time.perf_counter() - t, read_bytes() - before))
                ref += reference(paths["raw"], size, draws) or []
            if ref:
                times["loaderx 0.9.11"] = ref
            device = fio(paths["npy"], size)
            batch_bytes = BATCH * size
            per_repeat = BATCHES
            ceil = [min(a[0], b[0]) for a, b in zip(times["pread ceiling (32 threads)"],
                                                   times["pread ceiling (64 threads)"],
                                                   strict=True)]
            for name, ts in times.items():
                secs = [t for t, _ in ts]
                ms = statistics.median(secs) * 1e3
                results.append({
                    "workload": f"{size // 1024} KiB", "store": name, "ms": ms,
                    "mib_s": batch_bytes / 2**20 / (ms / 1e3),
                    "device": statistics.median(b for _, b in ts) / batch_bytes,
                    # strict=False: the "loaderx 0.9.11" row can be shorter than the ceiling's
                    # (a repeat whose reference run failed adds no times); it pairs what it has.
                    "vs_ceiling": statistics.median(
                        c / t for c, t in zip(ceil, secs, strict=False)),
                    "residue": residue, "fio": device, "batches": len(ts) // per_repeat,
                })
            ref_row = next((x for x in results if x["store"] == "loaderx 0.9.11"
                            and x["workload"] == f"{size // 1024} KiB"), None)
            for x in results:
                if x["workload"] == f"{size // 1024} KiB":
                    x["vs_ref"] = ref_row["ms"] / x["ms"] if ref_row else None
    return results


def table(results: list[dict]) -> str:
    lines = []
    for workload in dict.fromkeys(r["workload"] for r in results):
        rows = [r for r in results if r["workload"] == workload]
        fio_mib = rows[0]["fio"]
        lines.append(f"\n{workload} records, batch {BATCH}, nothing cached (evicted before each "
                     f"batch; fincore after eviction: {rows[0]['residue']} bytes resident)"
                     + (f"; fio O_DIRECT QD128: {fio_mib:.0f} MiB/s" if fio_mib else "") + ":\n")
        lines.append(common.head("store", "ms/batch", "MiB/s", "device bytes / record bytes",
                                 "vs pread ceiling", "vs loaderx 0.9.11"))
        for r in rows:
            vs_ref = "-" if r.get("vs_ref") is None else f"{r['vs_ref']:.2f}x"
            lines.append(common.row(r["store"], f"{r['ms']:.1f}", f"{r['mib_s']:.0f}",
                                    f"{r['device']:.2f}", f"{r['vs_ceiling']:.2f}x", vs_ref))
    return "\n".join(lines)


LOADER_SCRIPT = """
import json, sys, time
import numpy as np
from loaderx.dataloader import DataLoader
from loaderx.dataset import DenseDataset
path, readahead, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ds = DenseDataset(path)
options = {} if readahead < 0 else {"readahead": readahead}
with DataLoader({"x": ds}, batch_size=256, seed=1, **options) as loader:
    next(loader)
    t = time.perf_counter()
    for _ in range(steps):
        next(loader)
    print(json.dumps(steps / (time.perf_counter() - t)))
"""


def in_memory_cgroup(limit: int) -> str | None:
    """A child memory cgroup (v1 or v2) limited to ``limit`` bytes, or None if none can be
    made here; processes join it by writing their pid to the returned file."""
    for line in open("/proc/self/cgroup"):
        parts = line.strip().split(":", 2)
        if parts[1] == "memory":
            base = pathlib.Path("/sys/fs/cgroup/memory") / parts[2].lstrip("/")
            limit_file, tasks = "memory.limit_in_bytes", "tasks"
            break
    else:
        own = open("/proc/self/cgroup").read().split("::")[-1].strip().lstrip("/")
        base = pathlib.Path("/sys/fs/cgroup") / own
        limit_file, tasks = "memory.max", "cgroup.procs"
    child = base / "loaderx-bench"
    try:
        child.mkdir(exist_ok=True)
        (child / limit_file).write_text(str(limit))
    except OSError:
        return None
    return str(child / tasks)


def loader_run(repeats: int = 3) -> list[dict]:
    size, total = 12 * 1024, 1 << 30
    tasks = in_memory_cgroup(512 << 20)
    if tasks is None:
        return []
    with common.scratch("loaderx-cold-loader-") as root:
        paths = build(root, size, total)
        rows = contenders(paths, size)[:2]
        ceil_ms = []
        rng = np.random.default_rng(0)
        n = total // size
        for _ in range(repeats * 3):
            idx = np.sort(rng.choice(n, BATCH, replace=False)).astype(np.uint64)
            dst = np.empty(BATCH * size, dtype=np.uint8)
            best = []
            for _, files, gather in rows:
                evict(files)
                t = time.perf_counter()
                gather(idx, dst)
                best.append(time.perf_counter() - t)
            ceil_ms.append(min(best) * 1e3)
        ceiling = 1e3 / statistics.median(ceil_ms)
        out = [{"loader": "pread ceiling (one batch at a time)", "bps": ceiling}]
        # The device's own random-read rate on the store's largest chunk file (fio, O_DIRECT,
        # queue depth 128), as batches of 256 records per second.
        chunk = max(store_files(paths["raw"]), key=os.path.getsize)
        device = fio(chunk, size)
        if device is not None:
            out.append({"loader": "fio randread 12 KiB, O_DIRECT, QD128 (the device)",
                        "bps": device * 2**20 / (BATCH * size), "fio": True})
        for readahead, label in ((None, "loaderx, defaults (readahead off with workers)"),
                                 (6, "loaderx, readahead=6 (prefetch + workers here)"),
                                 (16, "loaderx, readahead=16"), (32, "loaderx, readahead=32")):
            bps = []
            for _ in range(repeats):
                evict(store_files(paths["raw"]))
                args = [sys.executable, "-c", LOADER_SCRIPT, paths["raw"],
                        "-1" if readahead is None else str(readahead), "150"]
                code = (f"import os,sys; open({tasks!r},'w').write(str(os.getpid())); "
                        "os.execv(sys.executable, [sys.executable] + sys.argv[1:])")
                r = subprocess.run([sys.executable, "-c", code, *args[1:]], capture_output=True,
                                   text=True)
                if r.returncode:
                    print(r.stderr[-800:], file=sys.stderr)
                    continue
                bps.append(json.loads(r.stdout))
            if bps:
                out.append({"loader": label, "bps": statistics.median(bps)})
        fio_bps = next((x["bps"] for x in out if x.get("fio")), None)
        for x in out:
            x["vs_ceiling"] = x["bps"] / ceiling
            x["vs_fio"] = x["bps"] / fio_bps if fio_bps else None
        return out


def loader_table(rows: list[dict]) -> str:
    if not rows:
        return "\n(cold loader rows skipped: no memory cgroup can be made here)"
    lines = ["\nDataLoader over a 1 GiB dataset of 12 KiB records in a process whose memory cgroup "
             "allows 512 MiB (batch 256, the default num_workers: min(4, cores) threads, "
             "150 steps):\n",
             common.head("loader", "batches/s", "MiB/s", "vs pread ceiling", "vs fio")]
    for r in rows:
        fio_ratio = f"{r['vs_fio']:.2f}x" if r.get("vs_fio") else "(fio not installed)"
        lines.append(common.row(r["loader"], f"{r['bps']:.1f}",
                                f"{r['bps'] * BATCH * 12 / 1024:,.0f}",
                                f"{r['vs_ceiling']:.2f}x", fio_ratio))
    return "\n".join(lines)


def main(repeats: int = 3) -> None:
    print(f"\n## Store, nothing cached (medians of {repeats} runs of {BATCHES} batches)")
    print(table(run(repeats)))


def loader_main(repeats: int = 3) -> None:
    print("\n## Loader, dataset larger than the memory the process may use")
    print(loader_table(loader_run(repeats)))


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--only", choices=["store", "loader"], default=None,
                        help="the store rows (gathers) or the loader rows alone")
    args = parser.parse_args(argv)
    if args.only in (None, "store"):
        main(args.repeats)
    if args.only in (None, "loader"):
        loader_main(args.repeats)


if __name__ == "__main__":
    common.standalone(cli)
