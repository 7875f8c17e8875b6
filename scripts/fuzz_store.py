#!/usr/bin/env python3
"""Seeded mutation fuzzing of a loaderx dataset:
``python scripts/fuzz_store.py --cases N --seed S``.

Builds a small ragged dataset (zstd_dict, raw and zstd records, with checksums, so it has
``dict.zr``, ``sums.zr`` and ``schema.msgpack``), then for each case flips, overwrites,
truncates or extends bytes where they matter -- the header, the live table entries, the live
chunk bytes, ``dict.zr``, ``schema.msgpack``, ``sums.zr`` -- opens the dataset and reads every
record (half the cases with checksum-checked reads, a quarter also run ``verify()``), and
restores the files. Each outcome must be data or a clear exception (a ``ZrecordError``
subclass or an ``OSError``); any other exception is reported with its case, and a crash or a
hang (caught by faulthandler after ``--hang-seconds``) ends the process with a non-zero status.
Prints a JSON summary.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import shutil
import sys
import tempfile
import traceback

import numpy as np

from loaderx.converter import from_iterator
from loaderx.dataset import RaggedDataset
from loaderx.errors import ZrecordError
from loaderx.zrecord import Zrecord

HEADER = 16


def build(path: str) -> int:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, size=400, dtype=np.uint8)
    similar = [np.roll(base, int(k))[: int(n)]
               for k, n in zip(rng.integers(0, 50, 300), rng.integers(1, 400, 300), strict=True)]
    from_iterator(path, similar, codec="zstd_dict", dict_size=4096, progress=False,
                  checksums=True)
    from_iterator(path, [rng.integers(0, 255, int(n), dtype=np.uint8) for n in (0, 5, 900)],
                  codec="raw", progress=False, append=True)
    from_iterator(path, [np.full(int(n), 7, np.uint8) for n in (1, 3000, 17)], codec="zstd",
                  progress=False, append=True)
    with Zrecord(path) as z:
        return len(z)


class Files:
    """The pristine bytes of the dataset files, to mutate from and restore to."""

    def __init__(self, path: str, records: int) -> None:
        self.path = path
        self.table_end = HEADER + 16 * records
        self.saved: dict[str, tuple[bytes, int]] = {}
        for name in os.listdir(path):
            full = os.path.join(path, name)
            size = os.path.getsize(full)
            with open(full, "rb") as f:
                sparse = name in ("meta.zr", "sums.zr")  # 256 MiB, mostly holes
                keep = f.read(self.table_end if sparse else size)
            self.saved[name] = (keep, size)

    def restore(self, name: str) -> None:
        data, size = self.saved[name]
        full = os.path.join(self.path, name)
        with open(full, "r+b") as f:
            f.write(data)
            f.truncate(size)

    def region(self, name: str) -> tuple[int, int]:
        """The byte range of ``name`` worth mutating."""
        if name in ("meta.zr", "sums.zr"):
            return 0, self.table_end
        return 0, self.saved[name][1]


def mutate(files: Files, rng: random.Random) -> str:
    name = rng.choice(sorted(files.saved))
    if name == "meta.zr" and rng.random() < 0.4:
        lo, hi = 0, HEADER  # the header deserves its own share
    else:
        lo, hi = files.region(name)
    full = os.path.join(files.path, name)
    size = files.saved[name][1]
    op = rng.choice(["flip", "flip", "set", "truncate", "extend"])
    if op in ("flip", "set") and hi > lo:
        with open(full, "r+b") as f:
            for _ in range(rng.randint(1, 8)):
                at = rng.randrange(lo, hi)
                f.seek(at)
                old = f.read(1)[0]
                new = old ^ (1 << rng.randrange(8)) if op == "flip" else rng.choice(
                    [0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
                f.seek(at)
                f.write(bytes([new]))
        return f"{op} {name}[{lo}:{hi}]"
    if op == "truncate":
        cut = rng.randrange(0, max(size, 1))
        os.truncate(full, cut)
        return f"truncate {name} to {cut}"
    extra = rng.randint(1, 5000)
    with open(full, "ab") as f:
        f.write(os.urandom(extra))
    return f"extend {name} by {extra}"


def read_everything(path: str, checked: bool, verify: bool) -> int:
    with RaggedDataset(path, verify_reads=checked) as rs:
        n = len(rs)
        total = 0
        for start in range(0, n, 97):
            total += sum(r.nbytes for r in rs[start:start + 97])
        if verify:
            report = rs.store.verify()
            assert report["records"] == n and isinstance(report["failures"], list)
        return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-seconds", type=int, default=60)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="loaderx-fuzz-")
    path = os.path.join(root, "d")
    try:
        records = build(path)
        files = Files(path, records)
        rng = random.Random(args.seed)
        outcomes = {"data": 0, "error": 0}
        errors: dict[str, int] = {}
        bad: list[str] = []
        for case in range(args.cases):
            faulthandler.dump_traceback_later(args.hang_seconds, exit=True)
            what = mutate(files, rng)
            try:
                read_everything(path, checked=rng.random() < 0.5, verify=rng.random() < 0.25)
                outcomes["data"] += 1
            except (ZrecordError, OSError) as e:
                outcomes["error"] += 1
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            except Exception as e:
                bad.append(f"case {case} ({what}): {type(e).__name__}: {e}\n"
                           f"{traceback.format_exc(limit=3)}")
            for name in files.saved:
                files.restore(name)
            faulthandler.cancel_dump_traceback_later()
        print(json.dumps({"cases": args.cases, "seed": args.seed, **outcomes,
                          "error_types": errors, "unclear": len(bad)}))
        for b in bad[:20]:
            print(b, file=sys.stderr)
        sys.exit(1 if bad else 0)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
