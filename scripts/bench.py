#!/usr/bin/env python3
"""loaderx benchmarks, one entry point: ``python scripts/bench.py LAYER [options]``.

Prints a machine block first, then the layer's tables. Every figure is a median of several
runs, rows interleaved, and every claim is a ratio against a contender or a ceiling measured in
the same run on the same data. Contenders that are not installed are skipped (``pip install
h5py blosc2 array-record tensorstore torch grain`` brings the store and loader ones in).
Performance is never asserted by the test suite: this script is where it is measured.

``python scripts/bench.py LAYER --help`` lists a layer's options.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _bench_common as common

# The layers of the specification: a layer module's main(repeats=...) and, with them, more rows
# from modules of their own (main(repeats=...) prints them) and the cold rows (bench_cold's
# function that prints them).
GROUPS = {"sampler": "bench_sampler", "store": "bench_store", "loader": "bench_loader"}
MORE = {"loader": ("bench_packing", "bench_workers", "bench_fixed", "bench_contender_loaders"),
        "store": ("bench_parts", "bench_intake", "bench_contenders")}
COLD = {"store": "main", "loader": "loader_main"}

# Every layer: its module (whose cli(argv, prog) parses the options) and what it measures.
LAYERS = {
    "sampler": ("bench_sampler", "index sampler against NumPy's generators"),
    "store": ("bench_store", "zrecord against the other stores; with the parts, intake, "
              "contenders and cold store rows"),
    "loader": ("bench_loader", "the whole input pipeline against torch and grain; with the "
               "packing, workers, fixed, contender-loaders and cold loader rows"),
    "cold": ("bench_cold", "gathers and the loader with nothing in the page cache"),
    "packing": ("bench_packing", "packed sequences against nanoGPT-style slices and grain"),
    "parts": ("bench_parts", "converting on a Dask cluster; resumable conversions"),
    "intake": ("bench_intake", "Parquet -> loaderx against pyarrow's read_table"),
    "intake-files": ("bench_intake_files", "image folders and WebDataset shards"),
    "workers": ("bench_workers", "worker threads against worker processes and torch"),
    "contenders": ("bench_contenders", "conversion and reads against Lance, HF, Mosaic, LitData"),
    "contender-loaders": ("bench_contender_loaders", "the loaders those formats ship"),
    "fixed": ("bench_fixed", "fixed costs on small records; zstd on small records"),
    "mix": ("bench_mix", "data mixtures against Megatron's blending index"),
    "stats": ("bench_stats", "what loader.stats() costs"),
    "freethreaded": ("bench_freethreaded", "the GIL build against free-threaded 3.13t"),
    "loader-ab": ("bench_loader_ab", "the thread loader of another revision against this one"),
    "write": ("bench_write", "write paths"),
    "tables": ("bench_tables", "a click log of 40 narrow columns: column groups against NumPy "
               "memmaps and torch; conversion; disk"),
}
# `all`: the three layers of the specification (with their rows), then every layer that needs
# nothing more than this checkout (freethreaded needs a second interpreter, loader-ab a revision).
EXTRA = ("intake-files", "mix", "stats", "write")


def group(layer: str, repeats: int | None, warm_only: bool, alone: bool = False) -> None:
    """A layer of the specification: its own tables, then the rows of MORE and COLD."""
    try:
        mod = importlib.import_module(GROUPS[layer])
    except ImportError as e:
        print(f"\n## {layer}: not available ({e})")
        return
    kwargs = {} if repeats is None else {"repeats": repeats}
    mod.main(**kwargs)
    if alone:
        return
    for more in MORE.get(layer, ()):
        more_main = importlib.import_module(more).main
        # A module with cold rows of its own (bench_contenders) skips them with --warm-only.
        skip_cold = ({"cold_batches": 0} if warm_only and "cold_batches"
                     in inspect.signature(more_main).parameters else {})
        more_main(**kwargs, **skip_cold)
    # Store and loader also run cold: nothing cached (bench_cold.py).
    if layer in COLD and not warm_only:
        getattr(importlib.import_module("bench_cold"), COLD[layer])(
            **({} if repeats is None else {"repeats": min(repeats, 3)}))


def group_parser(layer: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"bench.py {layer}", description=LAYERS[layer][1]
                                     if layer != "all" else "every layer but freethreaded and "
                                     "loader-ab")
    parser.add_argument("--repeats", type=int, default=None,
                        help="runs per figure (median); default: each table's own")
    parser.add_argument("--warm-only", action="store_true",
                        help="skip the cold rows (nothing cached), the contenders' included")
    if layer in ("store", "loader"):
        parser.add_argument("--alone", action="store_true",
                            help=f"only {GROUPS[layer]}'s own tables, no rows of other layers")
    if layer == "store":
        parser.add_argument("--dict-write", action="store_true",
                            help="only the zstd_dict conversion table")
    if layer == "loader":
        parser.add_argument("--jpeg", action="store_true", help="only the ragged JPEG table")
        parser.add_argument("--workers", type=int, default=4, help="with --jpeg: workers")
        parser.add_argument("--batches", type=int, default=60, help="with --jpeg: batches a run")
    return parser


def run_layer(layer: str, argv: list[str]) -> None:
    """A layer that is one module: its cli parses the options it has always had."""
    module = LAYERS[layer][0]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        print(f"\n## {layer}: skipped (scripts/{module}.py is not in this checkout)")
        return
    if hasattr(mod, "cli"):
        mod.cli(argv, prog=f"bench.py {layer}")
        return
    # A layer with main(repeats=...) alone.
    parser = argparse.ArgumentParser(prog=f"bench.py {layer}", description=LAYERS[layer][1])
    parser.add_argument("--repeats", type=int, default=None, help="runs per figure (median)")
    args = parser.parse_args(argv)
    mod.main(**({} if args.repeats is None else {"repeats": args.repeats}))


def run_all(repeats: int | None, warm_only: bool) -> None:
    for layer in GROUPS:
        group(layer, repeats, warm_only)
    for layer in EXTRA:
        run_layer(layer, [] if repeats is None or layer == "stats"
                  else ["--repeats", str(repeats)])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["all", *argv]  # options alone: every layer, as before there were layers
    epilog = "layers:\n" + "\n".join(f"  {name:<19}{what}" for name, (_, what) in LAYERS.items())
    epilog += f"\n  {'all':<19}sampler, store and loader with their rows, then {', '.join(EXTRA)}"
    parser = argparse.ArgumentParser(description=__doc__, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("layer", nargs="?", default="all", choices=[*LAYERS, "all"],
                        metavar="LAYER", help="one of the layers below (default all)")
    parser.add_argument("options", nargs=argparse.REMAINDER,
                        help="the layer's options (bench.py LAYER --help)")
    args = parser.parse_args(argv[:1])
    rest = argv[1:]
    helping = bool({"-h", "--help"} & set(rest))
    if args.layer in ("all", "store", "loader"):
        opts = group_parser(args.layer).parse_args(rest)
    if not helping:
        common.print_machine()
    if args.layer == "all":
        run_all(opts.repeats, opts.warm_only)
    elif args.layer == "store" and opts.dict_write:
        print(importlib.import_module("bench_store").dict_write(opts.repeats or 3))
    elif args.layer == "loader" and opts.jpeg:
        importlib.import_module("bench_loader").jpeg_main(opts.repeats or 5, opts.workers,
                                                          opts.batches)
    elif args.layer in GROUPS and args.layer != "sampler":
        group(args.layer, opts.repeats, opts.warm_only, opts.alone)
    else:
        run_layer(args.layer, rest)


if __name__ == "__main__":
    main()
