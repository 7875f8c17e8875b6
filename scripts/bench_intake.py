#!/usr/bin/env python3
"""Parquet (zstd) -> loaderx conversion against reading the same file with
``pyarrow.parquet.read_table`` alone (issue 21's target: at least 0.5x its speed).

``python scripts/bench.py intake [--repeats N] [--scale X]``, also a part of ``bench.py store``.
Three tables, each written once by pyarrow with zstd: 12 KiB binary blobs (incompressible, as JPEG
files are) with labels; text rows of about 600 bytes with ids; 64-float feature vectors with
labels. Every repeat reads the file with ``read_table`` and then converts it with
``loaderx.from_arrow`` (codec zstd, and raw, which shows the pipeline without compression) into
a new directory, durably (synced), all in the page cache; the ratio is taken per repeat and its
median reported. Needs pyarrow.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from typing import Any

import numpy as np

import _bench_common as common

WORDS = ("the of and to in is was for on that with as by at from his her an were are which "
         "this be or had not but first one their its new after who they have two").split()


def tables(scale: float = 1.0) -> dict[str, Any]:
    import pyarrow as pa

    rng = np.random.default_rng(0)
    n_img, n_txt, n_vec = int(20_000 * scale), int(200_000 * scale), int(500_000 * scale)
    words = np.array(WORDS)
    text = [" ".join(words[rng.integers(0, len(words), 100)]) for _ in range(2000)]
    return {
        "images (12 KiB binary + int64)": pa.table({
            "label": rng.integers(0, 1000, n_img),
            "image": pa.array([rng.bytes(12 << 10) for _ in range(n_img)], pa.binary()),
        }),
        "text (~600 B string + int64)": pa.table({
            "id": np.arange(n_txt),
            "text": [f"{i} {text[i % len(text)]}" for i in range(n_txt)],
        }),
        "features (64 x float32 + int64)": pa.table({
            "label": rng.integers(0, 10, n_vec),
            "features": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.standard_normal(n_vec * 64).astype(np.float32)), 64),
        }),
    }


def run(repeats: int = 5, scale: float = 1.0) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    from loaderx import from_arrow

    results = []
    with common.scratch("loaderx-bench-intake-") as root:
        path = root / "table.parquet"
        for name, table in tables(scale).items():
            pq.write_table(table, path, compression="zstd")
            decoded = table.nbytes
            del table
            pq.read_table(path)  # the file in the page cache, pyarrow's pools warm
            def convert(codec: str) -> float:
                out = root / f"out-{codec}"
                took = common.seconds(lambda: from_arrow(out, path, codec=codec, progress=False))
                shutil.rmtree(out)
                return took

            times = common.interleaved({
                "read_table": lambda: common.seconds(lambda: pq.read_table(path)),
                "zstd": lambda: convert("zstd"), "raw": lambda: convert("raw")}, repeats)
            results.append({"table": name, "mib": decoded / 2**20,
                            "file_mib": path.stat().st_size / 2**20, "times": times})
            path.unlink()
    return results


def report(results: list[dict[str, Any]], repeats: int) -> str:
    lines = [f"\n## Intake: Parquet (zstd) -> loaderx against pyarrow.parquet.read_table "
             f"(medians of {repeats}, ratios paired per repeat)\n",
             common.head("table", "decoded MiB", "file MiB", "read_table MiB/s",
                         "from_arrow zstd MiB/s", "zstd vs read_table", "from_arrow raw MiB/s",
                         "raw vs read_table")]
    for r in results:
        t = r["times"]
        rate = {k: r["mib"] / statistics.median(v) for k, v in t.items()}
        ratio = {c: statistics.median(common.paired(t["read_table"], t[c]))
                 for c in ("zstd", "raw")}
        lines.append(common.row(r["table"], f"{r['mib']:.0f}", f"{r['file_mib']:.0f}",
                                f"{rate['read_table']:.0f}", f"{rate['zstd']:.0f}",
                                f"{ratio['zstd']:.2f}x", f"{rate['raw']:.0f}",
                                f"{ratio['raw']:.2f}x"))
    lines.append("\nTarget: from_arrow >= 0.5x read_table. from_arrow includes what read_table "
                 "does not: compressing every record, writing the stores and syncing them.")
    return "\n".join(lines)


def main(repeats: int = 5, scale: float = 1.0) -> None:
    if common.available("pyarrow") is not None:
        print("\n## Intake: not available (pip install pyarrow)")
        return
    print(report(run(repeats, scale), repeats))


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0, help="rows, relative")
    args = parser.parse_args(argv)
    main(args.repeats, args.scale)


if __name__ == "__main__":
    common.standalone(cli)
