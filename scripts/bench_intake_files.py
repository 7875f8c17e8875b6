#!/usr/bin/env python3
"""Converting image folders and WebDataset shards (``loaderx.from_image_folder``,
``loaderx.from_webdataset``) against reading the same files plainly, in the same run:
``python scripts/bench.py intake-files [--repeats N] [--images N]``.

Data: ``--images`` (default 5000) small JPEGs (64x64 noise at quality 90, about 8 KiB each)
in 10 class folders, written once to a temporary directory, and the same images as 10
WebDataset shards (``.jpg`` and ``.cls`` members), plain and gzip-compressed. Everything is
in the page cache but in the "not cached" rows (each figure is a median of ``--repeats`` runs
after one warm-up), so most figures are the converters' own cost, not the disk's.

Rows (images per second, and the ratio to the plain read of the same bytes; the "not cached"
rows drop the folder's files from the page cache before each run):

* image folder -- ``os.walk`` + ``open().read()`` of every file (the floor: what any
  converter must do) vs ``from_image_folder`` into a new directory (walk through directory
  descriptors, magic-byte check, threads, the dataset directory written and synced);
* shards -- ``tarfile`` iterating every shard and reading every member (``r|``, and ``r|gz``)
  and the ``webdataset`` package's own iteration where it imports (samples grouped, nothing
  decoded) vs ``from_webdataset`` (the strict tar reader, shards read in parallel threads, the
  dataset written and synced), for ``workers`` 1 and the default.
"""

from __future__ import annotations

import argparse
import io
import os
import pathlib
import shutil
import tarfile
import warnings

import numpy as np

import _bench_common as common

SHARDS = 10
CLASSES = 10


def make_data(root: pathlib.Path, n: int) -> tuple[pathlib.Path, list[pathlib.Path],
                                                   list[pathlib.Path]]:
    from PIL import Image

    rng = np.random.default_rng(0)
    folder = root / "images"
    files = []
    for i in range(n):
        d = folder / f"class{i % CLASSES:02d}"
        d.mkdir(parents=True, exist_ok=True)
        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(
            out, format="JPEG", quality=90)
        path = d / f"{i:06d}.jpg"
        path.write_bytes(out.getvalue())
        files.append(path)
    plain, gz = [], []
    per = -(-n // SHARDS)
    for s in range(SHARDS):
        for suffix, mode, out_list in ((".tar", "w", plain), (".tar.gz", "w:gz", gz)):
            shard = root / f"shard-{s:03d}{suffix}"
            with tarfile.open(shard, mode, format=tarfile.PAX_FORMAT) as tar:
                for i in range(s * per, min(n, (s + 1) * per)):
                    data = files[i].read_bytes()
                    for ext, body in (("jpg", data), ("cls", str(i % CLASSES).encode())):
                        info = tarfile.TarInfo(f"{i:06d}.{ext}")
                        info.size = len(body)
                        tar.addfile(info, io.BytesIO(body))
            out_list.append(shard)
    return folder, plain, gz


def median_seconds(fn, repeats: int, before=None) -> float:
    """The median of ``repeats`` timed calls of ``fn`` after an untimed one (the page cache,
    imports), each after an untimed ``before()``."""
    fn()

    def once() -> float:
        if before is not None:
            before()
        return common.seconds(fn)
    return common.median_of(once, repeats)


def evict(folder: pathlib.Path) -> None:
    """Drops the folder's files from the page cache (``posix_fadvise(DONTNEED)``, as
    bench_cold does), so the next read goes to the disk."""
    for here, _dirs, names in os.walk(folder):
        for name in names:
            fd = os.open(os.path.join(here, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def read_folder(folder: pathlib.Path) -> int:
    total = 0
    for here, _dirs, names in os.walk(folder):
        for name in sorted(names):
            with open(os.path.join(here, name), "rb") as f:
                total += len(f.read())
    return total


def read_tars(shards: list[pathlib.Path], mode: str) -> int:
    total = 0
    for shard in shards:
        with tarfile.open(shard, mode) as tar:
            for member in tar:
                if member.isfile():
                    f = tar.extractfile(member)
                    assert f is not None
                    total += len(f.read())
    return total


def read_webdataset(shards: list[pathlib.Path]) -> int:
    import webdataset as wds

    total = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for sample in wds.WebDataset([str(s) for s in shards], shardshuffle=False):
            total += len(sample["jpg"])
    return total


class Fresh:
    """A new destination directory for each conversion (the old one removed outside the
    timing would be better; removing it is small next to writing it)."""

    def __init__(self, root: pathlib.Path, name: str) -> None:
        self.root, self.name, self.k = root, name, 0

    def __call__(self) -> pathlib.Path:
        old = self.root / f"{self.name}-{self.k}"
        shutil.rmtree(old, ignore_errors=True)
        self.k += 1
        return self.root / f"{self.name}-{self.k}"


def row(name: str, seconds: float, n: int, floor: float | None) -> str:
    ratio = "" if floor is None else f"{floor / seconds:.2f}x"
    return common.row(name, f"{seconds * 1e3:.0f} ms", f"{n / seconds:,.0f}", ratio)


def main(repeats: int = 5, images: int = 5000) -> None:
    from loaderx import from_image_folder, from_webdataset

    with common.scratch("loaderx-bench-intake-files-") as root:
        folder, plain, gz = make_data(root, images)
        out = root / "out"
        out.mkdir()
        print(f"\n### Image folders and WebDataset shards ({images} JPEGs of "
              f"{read_folder(folder) / images / 1024:.1f} KiB, {SHARDS} shards; medians of "
              f"{repeats}, page cache warm)\n")
        print(common.head("reading / converting", "time", "images/s", "vs plain read"))
        floor = median_seconds(lambda: read_folder(folder), repeats)
        print(row("image folder: os.walk + open().read() (floor)", floor, images, None))
        for workers in (1, None):
            fresh = Fresh(out, f"folder{workers}")
            t = median_seconds(lambda w=workers, f=fresh: from_image_folder(f(), folder,
                                                                            workers=w),
                               repeats)
            label = "default" if workers is None else workers
            print(row(f"from_image_folder (workers={label})", t, images, floor))
        cold = median_seconds(lambda: read_folder(folder), repeats, lambda: evict(folder))
        print(row("image folder, not cached: os.walk + open().read() (floor)", cold, images,
                  None))
        for workers in (1, None):
            fresh = Fresh(out, f"cold{workers}")
            t = median_seconds(lambda w=workers, f=fresh: from_image_folder(f(), folder,
                                                                            workers=w),
                               repeats, lambda: evict(folder))
            label = "default" if workers is None else workers
            print(row(f"from_image_folder, not cached (workers={label})", t, images, cold))
        for kind, shards, mode in (("tar", plain, "r|"), ("tar.gz", gz, "r|gz")):
            floor = median_seconds(lambda s=shards, m=mode: read_tars(s, m), repeats)
            print(row(f"{kind} shards: tarfile {mode} read of every member (floor)", floor,
                      images, None))
            try:
                import webdataset  # noqa: F401
            except ImportError:
                pass
            else:
                t = median_seconds(lambda s=shards: read_webdataset(s), repeats)
                print(row(f"{kind} shards: webdataset iteration (samples, not decoded)", t,
                          images, floor))
            for workers in (1, None):
                fresh = Fresh(out, f"{kind}{workers}")
                t = median_seconds(lambda w=workers, s=shards, f=fresh: from_webdataset(
                    f(), [str(p) for p in s], workers=w), repeats)
                label = "default" if workers is None else workers
                print(row(f"{kind} shards: from_webdataset (workers={label})", t, images,
                          floor))


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images", type=int, default=5000)
    args = parser.parse_args(argv)
    main(args.repeats, args.images)


if __name__ == "__main__":
    common.standalone(cli)
