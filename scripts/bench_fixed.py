#!/usr/bin/env python3
"""Fixed costs on small records (issue 23): rows of ``python scripts/bench.py loader``, or alone
with ``python scripts/bench.py fixed [--repeats N] [--quick]``.

Every table runs its rows interleaved (each repeat runs every row once, so a change of load
hits all of them), on the same data in the same run, and shows medians of ``--repeats`` runs
(default 5); a ratio of two rows is also given per repeat (the two ran back to back), its median
and range. Tables:

* small records -- scikit-learn-digits-sized data: 1,797 records of 8x8 float32 (256 B) plus
  int64 labels, batch 256. The images are made as the UCI digits were: strokes drawn on a
  32x32 bitmap, then the on-pixels of each 4x4 block counted (integers 0..16, stored as
  float32), from a fixed-seed generator, so zstd sees bytes like the real ones. Both streams
  are stored raw and zstd. Rows, in microseconds per batch: the NumPy loop a JAX user writes
  (a fresh ``rng.permutation`` per epoch, batch ``k`` = ``perm[k*256:(k+1)*256]``, then
  ``X[idx]`` and ``Y[idx]`` on the in-RAM arrays); ``DataLoader`` over the raw and the zstd
  stores with ``num_workers`` 0, 1 and 2 (mode cyclic, fixed seed), ``next()`` timed after a
  warm-up; ``DenseDataset[idx]`` (one call, 256 random int64 indices) and
  ``DenseDataset.gather`` (uint64 indices) on the 256 B stream, and on both streams back to
  back; the copy ceiling ``loaderx._native.copy_records`` on the same records from an in-RAM
  copy into a preallocated buffer (only in builds with the ``bench`` cargo feature);
* zstd on small records -- token-like int32 rows (``rng.zipf(1.3) % 50000``, 16 MiB per
  record size) of 256 B, 1 KiB and 4 KiB, stored raw and zstd (level 3, one frame per
  record, as the store writes them). Decode MB/s (10^6 bytes of records per second) inside a
  gather of 256 random records on one core (``gather_fixed`` with ``max_shards=1``), against
  ``zstd -b3 -B<size>`` on a file of the same bytes (one core, blocks of the record size, each
  compressed on its own), and the raw store's gather of the same records; then, per size, the
  decode cost per record against the raw copy per record, and whether the size is better
  stored raw.

``--quick`` runs everything once with few batches (and ``zstd -b`` for 1 s instead of 3 s): a
smoke check, not figures.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import _bench_common as common

DIGITS_N, BATCH, CLASSES = 1797, 256, 10
WORKER_COUNTS = (0, 1, 2)
TOKEN_SIZES = (256, 1024, 4096)
TOKEN_STORE_BYTES = 16 * 2**20
VOCAB = 50_000
ZSTD = "/usr/bin/zstd"
#: Cold reads of the reference machine are of this order (fio random reads, issue 23); a size
#: whose zstd decode costs more than reading the bytes it saves at this rate is better raw.
DEVICE_MB_S = 1000.0
#: A store that does not shrink by at least this much is not worth decoding.
MIN_RATIO = 1.1


class Plan:
    """Work per timed run (``--quick`` shrinks it)."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.batches = 200 if quick else 3000  # loader and NumPy-loop batches per run
        self.warm = 20 if quick else 100
        self.calls = 200 if quick else 5000  # single gathers per run
        self.decode_bytes = 4 * 2**20 if quick else 32 * 2**20  # records decoded per run
        self.zstd_seconds = 1 if quick else 3


# -- data ----------------------------------------------------------------------------------------


def digits(n: int = DIGITS_N, seed: int = 23) -> tuple[np.ndarray, np.ndarray]:
    """``n`` digit-like 8x8 float32 images (on-pixel counts 0..16 of 4x4 blocks of a 32x32
    bitmap of 2..4 thick strokes) and int64 labels 0..9."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:32, 0:32]
    images = np.empty((n, 8, 8), np.float32)
    for i in range(n):
        bitmap = np.zeros((32, 32), bool)
        for _ in range(int(rng.integers(2, 5))):
            points = rng.uniform(5, 27, size=(int(rng.integers(2, 5)), 2))
            radius2 = rng.uniform(1.5, 3.5) ** 2
            t = np.linspace(0, 1, 24)[:, None]
            centres = np.concatenate([a + t * (b - a)
                                      for a, b in zip(points[:-1], points[1:], strict=True)])
            d2 = ((yy - centres[:, 0, None, None]) ** 2 + (xx - centres[:, 1, None, None]) ** 2)
            bitmap |= (d2 <= radius2).any(axis=0)
        images[i] = bitmap.reshape(8, 4, 8, 4).sum(axis=(1, 3))
    labels = rng.integers(0, CLASSES, size=n).astype(np.int64)
    return images, labels


def tokens(record_bytes: int, seed: int = 23) -> np.ndarray:
    """16 MiB of token-like int32 rows of ``record_bytes`` each (Zipf-distributed ids)."""
    rng = np.random.default_rng(seed + record_bytes)
    n = TOKEN_STORE_BYTES // record_bytes
    ids = rng.zipf(1.3, size=n * (record_bytes // 4)) % VOCAB
    return ids.astype(np.int32).reshape(n, record_bytes // 4)


def stored_ratio(path: pathlib.Path) -> float:
    """Logical bytes over stored bytes of a store."""
    from loaderx.dataset import DenseDataset

    with DenseDataset(path) as ds:
        stats = ds.store.stats()
    return stats["logical_bytes"] / stats["live_bytes"]


# -- timing --------------------------------------------------------------------------------------


def numpy_loop(x: np.ndarray, y: np.ndarray, batches: int, seed: int = 0) -> float:
    """Seconds for ``batches`` batches of the plain NumPy loop over in-RAM arrays."""
    rng = np.random.default_rng(seed)
    n = len(x)
    per_epoch = n // BATCH
    done = 0
    t = time.perf_counter()
    while done < batches:
        perm = rng.permutation(n)
        for k in range(min(per_epoch, batches - done)):
            idx = perm[k * BATCH:(k + 1) * BATCH]
            x[idx], y[idx]
        done += per_epoch
    return time.perf_counter() - t


def loader_run(root: pathlib.Path, kind: str, workers: int, plan: Plan) -> float:
    """Seconds for ``plan.batches`` ``next()`` calls of a ``DataLoader`` after a warm-up."""
    from loaderx.dataloader import DataLoader
    from loaderx.dataset import DenseDataset

    streams = {"image": DenseDataset(root / f"image-{kind}"),
               "label": DenseDataset(root / f"label-{kind}")}
    try:
        with DataLoader(streams, batch_size=BATCH, num_workers=workers, mode="cyclic",
                        seed=0) as loader:
            for _ in range(plan.warm):
                next(loader)
            t = time.perf_counter()
            for _ in range(plan.batches):
                next(loader)
            return time.perf_counter() - t
    finally:
        for ds in streams.values():
            ds.close()


def calls_run(fn: Callable[[np.ndarray], Any], idxs: list[np.ndarray], calls: int) -> float:
    """Seconds for ``calls`` calls of ``fn``, cycling through the prepared index arrays."""
    for idx in idxs[:8]:  # warm-up
        fn(idx)
    t = time.perf_counter()
    for i in range(calls):
        fn(idxs[i % len(idxs)])
    return time.perf_counter() - t


def zstd_cli(path: pathlib.Path, record_bytes: int, seconds: int) -> tuple[float, float]:
    """``zstd -b3 -B<record_bytes>`` on ``path``: (compression ratio, decode MB/s)."""
    out = subprocess.run([ZSTD, "-b3", f"-B{record_bytes}", f"-i{seconds}", str(path)],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True)
    # A progress line rewritten with carriage returns: the last figures are the result.
    text = out.stdout + out.stderr
    found = re.findall(r"\(x\s*([\d.]+)\),\s*([\d.]+)\s*MB/s,\s*([\d.]+)\s*MB/s", text)
    if not found:
        raise RuntimeError(f"cannot parse zstd -b output: {text[-300:]!r}")
    return float(found[-1][0]), float(found[-1][2])


def both_streams(image: Any, label: Any, idx: np.ndarray) -> tuple[Any, Any]:
    """``image[idx], label[idx]``: one batch of two streams, back to back."""
    return image[idx], label[idx]


# -- small records -------------------------------------------------------------------------------


def small_main(root: pathlib.Path, repeats: int, plan: Plan) -> None:
    import loaderx._native as native
    from loaderx.converter import from_numpy
    from loaderx.dataset import DenseDataset

    x, y = digits()
    for kind in ("raw", "zstd"):
        from_numpy(root / f"image-{kind}", x, codec=kind, progress=False)
        from_numpy(root / f"label-{kind}", y, codec=kind, progress=False)
    ratios = {kind: stored_ratio(root / f"image-{kind}") for kind in ("raw", "zstd")}
    label_ratio = stored_ratio(root / "label-zstd")

    rng = np.random.default_rng(1)
    idx64 = [rng.integers(0, DIGITS_N, size=BATCH, dtype=np.int64) for _ in range(64)]
    idx_u64 = [i.astype(np.uint64) for i in idx64]
    opened = {f"{s}-{kind}": DenseDataset(root / f"{s}-{kind}")
              for s in ("image", "label") for kind in ("raw", "zstd")}
    x_bytes = np.ascontiguousarray(x).reshape(-1).view(np.uint8).copy()
    y_bytes = np.ascontiguousarray(y).view(np.uint8).copy()
    x_dst = np.empty(BATCH * 256, np.uint8)
    y_dst = np.empty(BATCH * 8, np.uint8)
    copy = getattr(native, "copy_records", None)

    two: dict[str, Callable[[], float]] = {
        "NumPy loop: permutation per epoch, X[idx], Y[idx]": lambda: numpy_loop(x, y,
                                                                                plan.batches)}
    for kind in ("raw", "zstd"):
        for w in WORKER_COUNTS:
            two[f"DataLoader, {kind}, num_workers={w}"] = partial(loader_run, root, kind, w,
                                                                   plan)
    for kind in ("raw", "zstd"):
        two[f"DenseDataset[idx], {kind}, both streams back to back"] = partial(
            calls_run, partial(both_streams, opened[f"image-{kind}"], opened[f"label-{kind}"]),
            idx64, plan.calls)
    if copy is not None:
        two["copy_records ceiling, both streams"] = lambda: calls_run(
            lambda i: (copy(x_bytes, 256, i, x_dst), copy(y_bytes, 8, i, y_dst)), idx_u64,
            plan.calls)
    one: dict[str, Callable[[], float]] = {
        "NumPy X[idx] (in RAM)": lambda: calls_run(lambda i: x[i], idx64, plan.calls)}
    for kind in ("raw", "zstd"):
        im = opened[f"image-{kind}"]
        one[f"DenseDataset[idx] (int64), {kind}"] = partial(calls_run, im.__getitem__, idx64,
                                                            plan.calls)
        one[f"DenseDataset.gather(uint64), {kind}"] = partial(calls_run, im.gather, idx_u64,
                                                              plan.calls)
    if copy is not None:
        one["copy_records ceiling"] = lambda: calls_run(
            lambda i: copy(x_bytes, 256, i, x_dst), idx_u64, plan.calls)

    per_run = {name: (plan.batches if name.startswith(("NumPy loop", "DataLoader"))
                      else plan.calls) for name in two}
    per_run.update({name: plan.calls for name in one})
    times = common.interleaved(  # microseconds per batch
        {name: partial(lambda fn, per: fn() / per * 1e6, fn, per_run[name])
         for name, fn in (*two.items(), *one.items())}, repeats)
    for ds in opened.values():
        ds.close()
    us = {name: statistics.median(t) for name, t in times.items()}

    print(f"\n## Small records -- {DIGITS_N} digit-like 8x8 float32 records (256 B) + int64 "
          f"labels, batch {BATCH}, medians of {repeats}\n")
    print(f"zstd store ratio: images {ratios['zstd']:.2f}x, labels {label_ratio:.2f}x "
          f"(logical / stored bytes). Loader runs: {plan.batches} batches after "
          f"{plan.warm} warm-up; single calls: {plan.calls} per run.\n")
    ref = us["NumPy loop: permutation per epoch, X[idx], Y[idx]"]
    print(common.head("per batch of 256, two streams", "µs per batch", "batches/s",
                      "speed vs NumPy loop"))
    for name in two:
        print(common.row(name, f"{us[name]:.1f}", f"{1e6 / us[name]:,.0f}",
                         f"{ref / us[name]:.2f}x"))
    ref1 = us["NumPy X[idx] (in RAM)"]
    print("\n" + common.head("one call, 256 records of the 256 B stream", "µs per call",
                             "speed vs NumPy X[idx]"))
    for name in one:
        print(common.row(name, f"{us[name]:.1f}", f"{ref1 / us[name]:.2f}x"))

    print("\nSpeed vs NumPy loop = the loop's µs per batch / the row's (above 1: faster than "
          "the loop). Per repeat (the two rows back to back):")
    loop_t = times["NumPy loop: permutation per epoch, X[idx], Y[idx]"]
    for kind in ("raw", "zstd"):
        for w in WORKER_COUNTS:
            name = f"DataLoader, {kind}, num_workers={w}"
            print(f"- {name} / NumPy loop: "
                  f"{common.spread(common.paired(loop_t, times[name]))}")

    print("\nTargets (issue 23):")
    for kind, speed_target in (("raw", 2.0), ("zstd", 1.0)):
        rows = {w: us[f"DataLoader, {kind}, num_workers={w}"] for w in WORKER_COUNTS}
        best = min(rows, key=rows.__getitem__)
        figures = ", ".join(f"w={w} {rows[w]:.1f} µs ({ref / rows[w]:.2f}x)" for w in rows)
        met_speed = ref / rows[best] >= speed_target
        line = (f"- loader {kind}: {figures}; best w={best}: speed vs NumPy loop "
                f"{ref / rows[best]:.2f}x, target >= {speed_target:.1f}x: "
                f"{'met' if met_speed else 'NOT met'}")
        if kind == "raw":
            line += (f"; <= 20 µs per batch: "
                     f"{'met' if rows[best] <= 20 else 'NOT met'}")
        print(line)
    for kind in ("raw", "zstd"):
        v = us[f"DenseDataset[idx] (int64), {kind}"]
        print(f"- DenseDataset[idx] of 256 records, {kind}: {v:.1f} µs, target <= 10 µs: "
              f"{'met' if v <= 10 else 'NOT met'}")
    if copy is None:
        print("\n(copy_records is missing: this build has no `bench` cargo feature)")


# -- zstd on small records -----------------------------------------------------------------------


def tokens_main(root: pathlib.Path, repeats: int, plan: Plan) -> None:
    from loaderx.converter import from_numpy
    from loaderx.dataset import DenseDataset

    rng = np.random.default_rng(2)
    sizes: dict[int, dict[str, Any]] = {}
    for size in TOKEN_SIZES:
        rows = tokens(size)
        (root / f"tokens-{size}.bin").write_bytes(rows.tobytes())
        for kind in ("raw", "zstd"):
            from_numpy(root / f"tokens-{size}-{kind}", rows, codec=kind, progress=False)
        batches = max(16, plan.decode_bytes // (BATCH * size))
        sizes[size] = {
            "n": len(rows),
            "ratio": stored_ratio(root / f"tokens-{size}-zstd"),
            "batches": batches,
            "idxs": [rng.integers(0, len(rows), size=BATCH, dtype=np.uint64)
                     for _ in range(min(batches, 256))],
            "dst": np.empty(BATCH * size, np.uint8),
            "ds": {kind: DenseDataset(root / f"tokens-{size}-{kind}")
                   for kind in ("raw", "zstd")},
        }
        del rows

    def gather_run(size: int, kind: str) -> float:
        """MB/s of records gathered on one core (``max_shards=1``)."""
        s = sizes[size]
        ds, dst = s["ds"][kind], s["dst"]

        def one(idx: np.ndarray) -> None:
            ds._native_gather_fixed(idx, dst, size, 1, None)

        seconds = calls_run(one, s["idxs"], s["batches"])
        return s["batches"] * BATCH * size / seconds / 1e6

    results: dict[tuple[int, str], list[float]] = {}
    cli_ratio: dict[int, float] = {}
    for _ in range(repeats):
        for size in TOKEN_SIZES:
            for kind in ("raw", "zstd"):
                results.setdefault((size, kind), []).append(gather_run(size, kind))
            ratio, mb_s = zstd_cli(root / f"tokens-{size}.bin", size, plan.zstd_seconds)
            results.setdefault((size, "cli"), []).append(mb_s)
            cli_ratio[size] = ratio
    for s in sizes.values():
        for ds in s["ds"].values():
            ds.close()
    med = {key: statistics.median(v) for key, v in results.items()}

    print(f"\n## zstd on small records -- token-like int32 rows (zipf(1.3) % {VOCAB}), "
          f"16 MiB per size, gathers of {BATCH} random records on one core, medians of "
          f"{repeats}\n")
    print(f"`zstd -b3 -B<size> -i{plan.zstd_seconds}` on a file of the same bytes (one core, "
          "each block compressed on its own, as the store compresses each record); MB = "
          "10^6 bytes of records.\n")
    print(common.head("record", "records", "ratio, store", "ratio, zstd -b", "gather raw MB/s",
                      "gather zstd MB/s", "zstd -b decode MB/s", "gather zstd / zstd -b"))
    for size in TOKEN_SIZES:
        s = sizes[size]
        print(common.row(f"{size} B", f"{s['n']:,}", f"{s['ratio']:.2f}x",
                         f"{cli_ratio[size]:.2f}x", f"{med[(size, 'raw')]:,.0f}",
                         f"{med[(size, 'zstd')]:,.0f}", f"{med[(size, 'cli')]:,.0f}",
                         f"{med[(size, 'zstd')] / med[(size, 'cli')]:.2f}x"))
    print("\nPer repeat, gather zstd / zstd -b (the two ran back to back):")
    for size in TOKEN_SIZES:
        pairs = common.paired(results[(size, "zstd")], results[(size, "cli")])
        print(f"- {size} B: {common.spread(pairs)}")

    print(f"\nRaw or zstd: zstd saves (1 - 1/ratio) x size bytes per record on a cold read and "
          f"costs its decode on every read. Break-even device rate = bytes saved / extra time "
          f"per record on one core: zstd pays only where the device reads slower than that "
          f"(warm, raw always wins). A size is better raw when its break-even rate is below "
          f"{DEVICE_MB_S:,.0f} MB/s (cold random reads of the reference machine are of that "
          f"order) or the store shrinks by less than {MIN_RATIO}x.\n")
    print(common.head("record", "µs per record, zstd", "µs per record, raw", "zstd / raw cost",
                      "ratio", "break-even device MB/s", "better stored"))
    for size in TOKEN_SIZES:
        zstd_us = size / med[(size, "zstd")]  # bytes / (10^6 bytes/s) = µs
        raw_us = size / med[(size, "raw")]
        ratio = sizes[size]["ratio"]
        saved = size * (1 - 1 / ratio)
        extra = zstd_us - raw_us
        breakeven = saved / extra if extra > 0 else float("inf")
        verdict = "raw" if ratio < MIN_RATIO or breakeven < DEVICE_MB_S else "zstd"
        print(common.row(f"{size} B", f"{zstd_us:.3f}", f"{raw_us:.3f}",
                         f"{zstd_us / raw_us:.1f}x", f"{ratio:.2f}x", f"{breakeven:,.0f}", verdict))
    k = (1024, "zstd")
    ratio_1k = med[k] / med[(1024, "cli")]
    print(f"\nTarget (issue 23): zstd decode of 1 KiB records inside a gather >= 0.7x zstd -b: "
          f"{ratio_1k:.2f}x, {'met' if ratio_1k >= 0.7 else 'NOT met'}")


# -- entry ---------------------------------------------------------------------------------------


def main(repeats: int = 5, quick: bool = False) -> None:
    plan = Plan(quick)
    print("\n## Fixed costs (issue 23)\n")
    print(f"command: `{' '.join(['python', *sys.argv])}`")  # bench.py's, with the layer
    with common.scratch("loaderx-bench-fixed-") as root:
        small_main(root, repeats, plan)
        tokens_main(root, repeats, plan)


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    options = argparse.ArgumentParser(prog=prog, description=__doc__,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_argument("--repeats", type=int, default=5, help="runs per figure (median)")
    options.add_argument("--quick", action="store_true",
                         help="everything once with few batches: a smoke check")
    args = options.parse_args(argv)
    main(1 if args.quick else args.repeats, args.quick)


if __name__ == "__main__":
    common.standalone(cli)
