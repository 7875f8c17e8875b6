#!/usr/bin/env python3
"""loaderx benchmarks: ``python scripts/bench.py sampler|store|loader|all [--repeats N]
[--warm-only]``.

Prints a machine block first, then one table per layer. Every figure is a median of several
runs, and every claim is a ratio against a contender measured in the same run on the same data.
Contenders that are not installed are skipped (``pip install h5py blosc2 array-record
tensorstore torch grain`` brings them in). Performance is never asserted by the test suite:
this script is where it is measured.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import pathlib
import platform
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

LAYERS = {"sampler": "bench_sampler", "store": "bench_store", "loader": "bench_loader"}
# The cold rows of a layer: bench_cold's function that prints them.
COLD = {"store": "main", "loader": "loader_main"}
# More rows of a layer, from modules of their own (main(repeats=...) prints them).
MORE = {"loader": ("bench_packing", "bench_workers", "bench_fixed", "bench_contender_loaders"),
        "store": ("bench_parts", "bench_intake", "bench_contenders")}


def machine_block() -> str:
    """What the numbers were measured on."""
    import numpy as np

    def lscpu(field: str) -> str:
        try:
            out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        except OSError:
            return "?"
        for line in out.splitlines():
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
        return "?"

    mem = "?"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    try:
        import loaderx
        import loaderx._native

        lx = loaderx.__version__
        threads = loaderx._native.num_threads()
    except ImportError:
        lx, threads = "not installed", "?"
    rows = [
        ("CPU", f"{lscpu('Model name')}, {os.cpu_count()} logical CPUs"),
        ("caches", f"L1d {lscpu('L1d cache')}, L2 {lscpu('L2 cache')}, L3 {lscpu('L3 cache')}"),
        ("memory", mem),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("python", f"{platform.python_version()}, numpy {np.__version__}"),
        ("loaderx", f"{lx}, pool threads {threads}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("layer", nargs="?", default="all", choices=[*LAYERS, "all"])
    parser.add_argument("--repeats", type=int, default=None, help="runs per figure (median)")
    parser.add_argument("--warm-only", action="store_true",
                        help="skip the cold rows (nothing cached) of store and loader, "
                             "the contenders' included")
    args = parser.parse_args()
    print("## Machine\n")
    print(machine_block())
    layers = list(LAYERS) if args.layer == "all" else [args.layer]
    for layer in layers:
        try:
            mod = importlib.import_module(LAYERS[layer])
        except ImportError as e:
            print(f"\n## {layer}: not available ({e})")
            continue
        kwargs = {} if args.repeats is None else {"repeats": args.repeats}
        mod.main(**kwargs)
        for more in MORE.get(layer, ()):
            more_main = importlib.import_module(more).main
            # A module with cold rows of its own (bench_contenders) skips them with --warm-only.
            skip_cold = ({"cold_batches": 0} if args.warm_only and "cold_batches"
                         in inspect.signature(more_main).parameters else {})
            more_main(**kwargs, **skip_cold)
        # Store and loader also run cold: nothing cached (bench_cold.py).
        if layer in COLD and not args.warm_only:
            getattr(importlib.import_module("bench_cold"), COLD[layer])(
                **({} if args.repeats is None else {"repeats": min(args.repeats, 3)}))


if __name__ == "__main__":
    main()
