"""Loader layer of the benchmark: the whole input pipeline (sample, fetch, collate, hand over).

Workload: 20000 records of 12 KiB (the store benchmark's data) plus int64 labels, batch 256,
4 workers, identity transform. Rows:

* loaderx / loaderx-raw -- ``DataLoader`` over zstd and raw stores (mode cyclic);
* gathers / gathers-raw -- the same stores read back to back with ``DenseDataset.gather`` at the
  loader's exact indices, one new array per stream per batch: what the pipeline costs over the
  store is the ratio of the two;
* loaderx, no recycling -- the loader with its buffer pool disabled (every batch a fresh array);
* loaderx, finite pass -- ``loader.epoch()``, every record once in index order (its own worker
  threads, started inside the timing);
* loaderx, in process -- ``num_workers=0``: each batch built on the consumer's thread;
* torch -- ``torch.utils.data.DataLoader`` over a map-style dataset on the
  ``np.load(mmap_mode='r')`` arrays, 4 worker processes, ``persistent_workers=True``, shuffled,
  batches of 256; the better of per-item fetching and batched ``__getitems__`` fetching;
* grain -- ``grain.python.DataLoader`` over the same arrays, 4 worker processes;
* augment -- a CPU-heavy Python transform (a per-sample Python loop) on loaderx and torch.

A second table, ragged JPEG stream (issue 20): 1536 JPEG-encoded images of 96..191 pixels a
side (smooth gradients plus noise, quality 90, about 5-20 KiB each) stored one record per image
with ``from_iterator`` (raw codec: JPEG is compressed already), batch 64, the same worker count
on both sides, and the same decode: Pillow ``Image.open(...).convert("RGB")``, a centre crop to
96 x 96 and a stack into one ``(64, 96, 96, 3)`` uint8 batch. Rows:

* loaderx, JPEG decode -- ``DataLoader({"jpeg": RaggedDataset})`` with the decode as its
  transform, on the loader's worker threads (Pillow releases the GIL while it decodes);
* torch, JPEG decode -- ``torch.utils.data.DataLoader`` over the same ``RaggedDataset`` as a
  map-style dataset (``ds[i]`` then the same decode per sample, default collate stacking the
  crops), worker processes, ``persistent_workers=True``, shuffled;
* loaderx, JPEG bytes only -- the loader without a transform (the list of record views): what
  the ragged read costs next to the decode.

``python scripts/bench.py loader --jpeg [--repeats N] [--workers W] [--batches B]`` runs this
table alone.

Every figure is the median of several runs; each run times a fixed number of batches after a
warm-up (which also starts worker processes). RssAnon growth over a long loaderx run is reported
against the size of the prefetch buffers.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np

import _bench_common as common
from bench_store import make_data

N, SIZE, BATCH, WORKERS = 20000, 12 * 1024, 256, 4
SAMPLE_BYTES = SIZE + 8


def anon_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def augment(batch):
    """A Python-bound per-sample loop: the kind of transform the GIL serializes."""
    out = []
    for img in batch["data"]:
        v = img[::16]
        out.append(float(v.sum()) / (1 + len(v)))
    return {"data": batch["data"], "label": batch["label"], "score": out}


WARM = 20  # batches before the clock (they also start the workers)


# -- loaderx -------------------------------------------------------------------------------------


def loaderx_run(root: pathlib.Path, kind: str, batches: int, transform=None, recycle=True,
                workers=WORKERS, finite=False):
    from loaderx.dataloader import DataLoader
    from loaderx.dataset import DenseDataset

    streams = {"data": DenseDataset(root / f"data-{kind}"), "label": DenseDataset(root / "label")}
    kw = {} if transform is None else {"transform": transform}
    with DataLoader(streams, batch_size=BATCH, num_workers=workers, **kw) as loader:
        if not recycle:
            for pool in loader._pipe.pools:
                pool.keep = 0
        if finite:  # one pass in index order, N / BATCH batches
            t = time.perf_counter()
            n = sum(1 for _ in loader.epoch())
            assert n == batches, n
            elapsed = time.perf_counter() - t
        else:
            elapsed = common.time_next(loader, batches, WARM)
    for ds in streams.values():
        ds.close()
    return elapsed


def gathers_run(root: pathlib.Path, kind: str, batches: int):
    from loaderx.dataloader import DataLoader
    from loaderx.dataset import DenseDataset

    data, label = DenseDataset(root / f"data-{kind}"), DenseDataset(root / "label")
    with DataLoader({"data": data, "label": label}, batch_size=BATCH) as loader:
        steps = [loader.batch_indices(s) for s in range(batches + 20)]

    def it():
        for idx in steps:
            yield data.gather(idx), label.gather(idx)

    elapsed = common.time_next(it(), batches, WARM)
    data.close()
    label.close()
    return elapsed


def anon_growth(root: pathlib.Path, batches: int) -> tuple[int, int, int]:
    """RssAnon growth in KiB from before the loader to its peak, the same from batch 100 on,
    and the size of the prefetch buffers in KiB."""
    from loaderx.dataloader import DataLoader
    from loaderx.dataset import DenseDataset

    streams = {"data": DenseDataset(root / "data-zstd"), "label": DenseDataset(root / "label")}
    start = anon_kib()
    with DataLoader(streams, batch_size=BATCH, num_workers=WORKERS) as loader:
        for _ in range(100):
            next(loader)
        base = anon_kib()
        peak = base
        for i in range(batches):
            next(loader)
            if i % 50 == 0:
                peak = max(peak, anon_kib())
        buffers = (loader._pipe.window + 2) * BATCH * SAMPLE_BYTES // 1024
    return peak - start, peak - base, buffers


# -- torch ---------------------------------------------------------------------------------------


class NpyItems:
    """Map-style dataset over the memmapped .npy files, one sample per ``__getitem__``."""

    def __init__(self, root: str, transform=None):
        self.root, self.transform = root, transform
        self.data = self.label = None

    def _open(self):
        if self.data is None:
            self.data = np.load(os.path.join(self.root, "data.npy"), mmap_mode="r")
            self.label = np.load(os.path.join(self.root, "label.npy"), mmap_mode="r")

    def __len__(self):
        return N

    def __getitem__(self, i):
        self._open()
        return {"data": np.array(self.data[i]), "label": int(self.label[i])}

    def __getstate__(self):
        return {"root": self.root, "transform": self.transform, "data": None, "label": None}


class NpyBatches(NpyItems):
    """The same, fetching a whole batch with one fancy index (``__getitems__``)."""

    def __getitems__(self, idxs):
        self._open()
        idx = np.sort(np.asarray(idxs))
        batch = {"data": self.data[idx], "label": self.label[idx]}
        return [self.transform(batch) if self.transform else batch]


def torch_collate_batches(items):
    import torch

    b = items[0]
    return {k: torch.from_numpy(np.asarray(v)) if isinstance(v, np.ndarray) else v
            for k, v in b.items()}


def torch_run(root: pathlib.Path, batches: int, batched: bool, transform=None):
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    if batched:
        ds = NpyBatches(str(root), transform)
        loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                            persistent_workers=True, collate_fn=torch_collate_batches)
    else:
        if transform is not None:
            return None
        ds = NpyItems(str(root))
        loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                            persistent_workers=True)

    try:
        return common.time_next(common.endless(loader), batches, WARM)
    finally:
        del loader


# -- grain ---------------------------------------------------------------------------------------


class GrainSource:
    """Random-access source over the memmapped .npy files; reopened after unpickling."""

    def __init__(self, root: str):
        self.__setstate__({"root": root})

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"data": np.asarray(self.data[i]), "label": self.label[i]}

    def __getstate__(self):
        return {"root": self.root}

    def __setstate__(self, state):
        self.root = state["root"]
        self.data = np.load(os.path.join(self.root, "data.npy"), mmap_mode="r")
        self.label = np.load(os.path.join(self.root, "label.npy"), mmap_mode="r")


def grain_run(root: pathlib.Path, batches: int):
    import grain.python as gp

    common.absl_parsed()
    sampler = gp.IndexSampler(N, shard_options=gp.NoSharding(), shuffle=True, num_epochs=None,
                              seed=0)
    loader = gp.DataLoader(data_source=GrainSource(str(root)), sampler=sampler,
                           operations=[gp.Batch(BATCH, drop_remainder=True)],
                           worker_count=WORKERS)
    return common.time_next(iter(loader), batches, 5)


# -- ragged JPEG stream ---------------------------------------------------------------------------

JPEG_N, JPEG_BATCH, CROP = 1536, 64, 96


def make_jpegs(path: pathlib.Path, n: int = JPEG_N) -> int:
    """Writes ``n`` JPEG-encoded images as a ragged uint8 store; returns their total bytes."""
    import io

    from PIL import Image

    from loaderx.converter import from_iterator

    rng = np.random.default_rng(20)
    encoded = []
    for _ in range(n):
        h, w = (int(x) for x in rng.integers(CROP, 2 * CROP, size=2))
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (h + w)], axis=-1)
        pixels = np.clip(base + rng.normal(0, 12, size=(h, w, 3)), 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="JPEG", quality=90)
        encoded.append(out.getvalue())
    from_iterator(path, encoded, codec="raw", progress=False)
    return sum(len(e) for e in encoded)


def decode_crop(record: np.ndarray) -> np.ndarray:
    """One JPEG record to a centre-cropped (CROP, CROP, 3) uint8 image (both loaders use it)."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(record)) as img:
        pixels = np.asarray(img.convert("RGB"))
    h, w = pixels.shape[:2]
    top, left = (h - CROP) // 2, (w - CROP) // 2
    return pixels[top:top + CROP, left:left + CROP].copy()  # writable, as a tensor wants


def decode_batch(batch):
    """loaderx's transform: the batch's list of JPEG records, decoded and stacked."""
    return np.stack([decode_crop(r) for r in batch["jpeg"]])


def loaderx_jpeg_run(path: pathlib.Path, batches: int, workers: int, decode=True):
    from loaderx.dataloader import DataLoader
    from loaderx.dataset import RaggedDataset

    ds = RaggedDataset(path)
    kw = {"transform": decode_batch} if decode else {}
    with DataLoader({"jpeg": ds}, batch_size=JPEG_BATCH, num_workers=workers, **kw) as loader:
        elapsed = common.time_next(loader, batches, 5)
    ds.close()
    return elapsed


class JpegItems:
    """torch's map-style dataset over the same ragged store: one record, decoded, per item."""

    def __init__(self, path: str):
        from loaderx.dataset import RaggedDataset

        self.ds = RaggedDataset(path)  # pickles by path: each worker reopens the store

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return decode_crop(self.ds[i])


def torch_jpeg_run(path: pathlib.Path, batches: int, workers: int):
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    loader = DataLoader(JpegItems(str(path)), batch_size=JPEG_BATCH, shuffle=True,
                        num_workers=workers, persistent_workers=workers > 0)

    try:
        return common.time_next(common.endless(loader), batches, 5)
    finally:
        del loader


def jpeg_main(repeats: int = 5, workers: int = WORKERS, batches: int = 60) -> None:
    try:
        import PIL  # noqa: F401
    except ImportError:
        print("\n## Ragged JPEG stream: Pillow not installed")
        return
    with common.scratch("loaderx-bench-jpeg-") as root:
        total = make_jpegs(root / "jpeg")
        runs = {"loaderx, JPEG decode": lambda: loaderx_jpeg_run(root / "jpeg", batches,
                                                                 workers),
                "loaderx, JPEG bytes only": lambda: loaderx_jpeg_run(root / "jpeg", batches,
                                                                     workers, decode=False)}
        try:
            import torch  # noqa: F401

            runs["torch, JPEG decode"] = lambda: torch_jpeg_run(root / "jpeg", batches, workers)
        except ImportError:
            pass
        times = common.interleaved(runs, repeats)
        results = {name: statistics.median(t) / batches for name, t in times.items()}
        ref = results.get("torch, JPEG decode")
        print(f"\n## Ragged JPEG stream -- {JPEG_N} JPEGs ({total / JPEG_N / 1024:.1f} KiB "
              f"average), Pillow decode + {CROP}x{CROP} crop + stack, batch {JPEG_BATCH}, "
              f"{workers} workers on both sides, medians of {repeats} x {batches} batches\n")
        print(common.head("loader", "batches/s", "ms/batch", "images/s", "vs torch"))
        for name, per in results.items():
            vs = f"{ref / per:.2f}x" if ref else "-"
            print(common.row(name, f"{1 / per:,.1f}", f"{per * 1e3:.2f}",
                             f"{JPEG_BATCH / per:,.0f}", vs))
        if ref:
            # Also per repeat: both rows ran back to back, so their ratio is less exposed to
            # load from elsewhere than the ratio of the medians.
            pairs = common.paired(times["torch, JPEG decode"], times["loaderx, JPEG decode"])
            print(f"\nloaderx / torch with the same decode: "
                  f"{ref / results['loaderx, JPEG decode']:.2f}x (ratio of medians); per "
                  f"repeat {common.spread(pairs)}")


# -- the table -----------------------------------------------------------------------------------


def write_stores(root: pathlib.Path, codecs: tuple[str, ...] = ("zstd", "raw")) -> None:
    """The workload under ``root``: ``data.npy`` and ``label.npy`` (torch's and grain's), and
    the stores ``data-<codec>`` and ``label`` (loaderx's), synced."""
    from loaderx.converter import from_numpy

    data = make_data(N, SIZE)
    label = np.arange(N, dtype=np.int64) % 1000
    np.save(root / "data.npy", data)
    np.save(root / "label.npy", label)
    del data
    mm = np.load(root / "data.npy", mmap_mode="r")
    for codec in codecs:
        from_numpy(root / f"data-{codec}", mm, codec=codec, progress=False)
    from_numpy(root / "label", label, codec="raw", progress=False)
    os.sync()


def row(name: str, seconds: float, batches: int, ref: float | None) -> str:
    per = seconds / batches
    bps = 1 / per
    mib = bps * BATCH * SAMPLE_BYTES / 2**20
    vs = f"{(1 / per) / (1 / ref):.2f}x" if ref else "-"
    return common.row(name, f"{bps:,.1f}", f"{per * 1e3:.2f}", f"{bps * BATCH:,.0f}", f"{mib:,.0f}",
                      vs)


def main(repeats: int = 5) -> None:
    with common.scratch("loaderx-bench-loader-") as root:
        write_stores(root)

        fast, slow = 1000, 150
        results: dict[str, tuple[float, int]] = {}

        def measure(name, fn, batches):
            t = common.median_of(fn, repeats)
            if t is not None:
                results[name] = (t, batches)

        measure("loaderx", lambda: loaderx_run(root, "zstd", fast), fast)
        measure("loaderx-raw", lambda: loaderx_run(root, "raw", fast), fast)
        measure("gathers (zstd store)", lambda: gathers_run(root, "zstd", fast), fast)
        measure("gathers (raw store)", lambda: gathers_run(root, "raw", fast), fast)
        measure("loaderx, no recycling", lambda: loaderx_run(root, "zstd", fast, recycle=False),
                fast)
        passes = -(-N // BATCH)
        measure("loaderx, finite pass (epoch)",
                lambda: loaderx_run(root, "zstd", passes, finite=True), passes)
        measure("loaderx, in process (num_workers=0)",
                lambda: loaderx_run(root, "zstd", fast, workers=0), fast)
        measure("loaderx-raw, no recycling",
                lambda: loaderx_run(root, "raw", fast, recycle=False), fast)
        torch_note = ""
        try:
            import torch

            per_item = common.median_of(lambda: torch_run(root, slow, batched=False), repeats)
            batched = common.median_of(lambda: torch_run(root, slow, batched=True), repeats)
            best = min(per_item, batched)
            torch_note = (f"torch per-item {slow / per_item:.1f} batches/s, "
                          f"__getitems__ {slow / batched:.1f} batches/s; the table shows the "
                          "better")
            results["torch"] = (best, slow)
        except ImportError:
            torch_note = "torch not installed"
        try:
            import grain.python  # noqa: F401

            measure("grain", lambda: grain_run(root, slow // 3), slow // 3)
        except ImportError:
            pass
        measure("loaderx, augment", lambda: loaderx_run(root, "zstd", slow, transform=augment),
                slow)
        try:
            import torch  # noqa: F401

            measure("torch, augment",
                    lambda: torch_run(root, slow, batched=True, transform=augment), slow)
        except ImportError:
            pass

        torch_t = results.get("torch")
        ref = torch_t[0] / torch_t[1] if torch_t else None
        print(f"\n## Loader -- {N} records of {SIZE // 1024} KiB + int64 labels, batch {BATCH}, "
              f"{WORKERS} workers, medians of {repeats}\n")
        print(common.head("loader", "batches/s", "ms/batch", "samples/s", "MiB/s", "vs torch"))
        for name, (t, b) in results.items():
            print(row(name, t, b, ref))
        print()
        if torch_note:
            print(torch_note)

        def rate(name):
            t, b = results[name]
            return b / t

        for kind, g in (("loaderx", "gathers (zstd store)"),
                        ("loaderx-raw", "gathers (raw store)")):
            print(f"{kind} / back-to-back gathers of the same indices: "
                  f"{rate(kind) / rate(g):.2f}")
        for kind in ("loaderx", "loaderx-raw"):
            print(f"{kind} with recycling / without: "
                  f"{rate(kind) / rate(kind + ', no recycling'):.2f}")
        if "torch" in results:
            print(f"loaderx / torch: {rate('loaderx') / rate('torch'):.2f}x; "
                  f"loaderx-raw / torch: {rate('loaderx-raw') / rate('torch'):.2f}x")
        if "torch, augment" in results:
            print(f"augment: loaderx / torch: "
                  f"{rate('loaderx, augment') / rate('torch, augment'):.2f}x")
        # In a fresh process: this one's allocator already holds the memory of the runs above.
        out = subprocess.run([sys.executable, __file__, "--anon", str(root)], check=True,
                             capture_output=True, text=True).stdout.split()
        total, grew, buffers = map(int, out[-3:])
        print(f"RssAnon, 5100 batches: peak {total / 1024:.1f} MiB over the process before the "
              f"loader, of which {grew / 1024:.1f} MiB after batch 100; the prefetch buffers "
              f"(window + 2 batches) are {buffers / 1024:.1f} MiB")
    jpeg_main(min(repeats, 5))


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (median)")
    parser.add_argument("--jpeg", action="store_true", help="the ragged JPEG table alone")
    parser.add_argument("--workers", type=int, default=WORKERS, help="with --jpeg: workers")
    parser.add_argument("--batches", type=int, default=60, help="with --jpeg: batches a run")
    args = parser.parse_args(argv)
    if args.jpeg:
        jpeg_main(args.repeats, args.workers, args.batches)
    else:
        main(args.repeats)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--anon"]:  # the RssAnon rows, in a fresh process
        print(*anon_growth(pathlib.Path(sys.argv[2]), 5000))
    else:
        common.standalone(cli)
