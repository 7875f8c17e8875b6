"""The ``loaderx`` command (also ``python -m loaderx``).

Commands::

    loaderx info STORE [--json]       what a store or dataset holds
    loaderx convert INPUT.npy OUT [--codec zstd] [--checksums] [--overwrite] ...
    loaderx convert 'data/*.parquet' OUT [--columns a,b]   a table as a dataset directory
    loaderx convert data.arrow OUT    Arrow IPC files (file or stream format), or a Hugging
                                      Face save_to_disk directory, likewise
    loaderx verify STORE [--json]     decode every record, check checksums; exit 1 on damage
    loaderx verify DIR [--json]       ... of every column's store of a dataset directory, and
                                      that each is what the manifest says (exit 3 if not)
    loaderx copy SRC DST [--overwrite]   copy a store or dataset directory, holes kept, checked
    loaderx archive SRC ARCHIVE       one tar archive of a store or dataset directory (.tar,
                                      .tar.gz, .tar.xz, ...); ``loaderx pack`` is its old
                                      name (unrelated to ``loaderx.pack()``, packed sequences)
    loaderx unpack ARCHIVE DST [--overwrite]   the store or dataset directory of an archive,
                                      checked, into a new directory
    loaderx compact STORE             reclaim the space of deleted records
    loaderx bench [LAYER [OPTIONS]]   run the benchmark harness (scripts/bench.py LAYER)
    loaderx profile DATA [--transform module:function] [--plot out.png]   the loader's speed
                                      at several worker counts in both worker modes, each
                                      stage's time, and the ceilings (loaderx.profiling)

Exit status (one per kind of failure, so scripts can tell them apart):

    0  success
    1  ``verify`` found damaged records (the store itself opened; in a dataset directory,
       every store opened and is what the manifest says)
    2  bad usage or input: a missing path, a file that is not a store, an unreadable .npy,
       an argument or dataset that does not fit (DatasetError, LoaderxValueError, ...);
       for ``profile``, a transform that cannot be imported or that raises, or ``--plot``
       without matplotlib
    3  a store or archive that cannot be trusted (CorruptStoreError, MissingDictionaryError);
       from ``verify`` of a dataset directory: a column's store is missing, cannot be opened,
       or is not of the kind, dtype, shape or row count its manifest says
    4  the store is busy or changed under us: another process writes it (StoreBusyError,
       StoreChangedError); try again later
    5  the system refused: permissions, a full disk, an I/O error (OSError)
    6  an internal error: a bug in loaderx (InternalError, or anything unexpected); please
       report it with the command that was run
  130  interrupted

Errors print one line to stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from loaderx._store import schema as _schema
from loaderx.errors import (
    CorruptStoreError,
    InternalError,
    LoaderxError,
    MissingDictionaryError,
    StoreBusyError,
    StoreChangedError,
)
from loaderx.zrecord import CODECS

EXIT_OK, EXIT_DAMAGED, EXIT_USAGE, EXIT_CORRUPT, EXIT_BUSY, EXIT_SYSTEM, EXIT_INTERNAL = range(7)
EXIT_INTERRUPTED = 130

# The exit status of each error class (the first that matches); other LoaderxErrors are bad
# input. OSErrors that name a path the user gave that is not there are bad input too.
_EXIT_OF: tuple[tuple[type[BaseException], int], ...] = (
    (CorruptStoreError, EXIT_CORRUPT), (MissingDictionaryError, EXIT_CORRUPT),
    (StoreBusyError, EXIT_BUSY), (StoreChangedError, EXIT_BUSY),
    (InternalError, EXIT_INTERNAL), (LoaderxError, EXIT_USAGE),
    (FileNotFoundError, EXIT_USAGE), (NotADirectoryError, EXIT_USAGE),
    (IsADirectoryError, EXIT_USAGE), (FileExistsError, EXIT_USAGE),
    (OSError, EXIT_SYSTEM), (ValueError, EXIT_USAGE),
)


class _UsageError(Exception):
    """Bad input: printed as one line, exit status 2."""


def _store_dir(path: str) -> str:
    if not os.path.exists(path):
        raise _UsageError(f"{path}: no such file or directory")
    if not _schema.is_store(path):
        raise _UsageError(f"{path}: not a loaderx store (no {_schema.META_FILE})")
    return path


def _dataset_schema(path: str) -> _schema.Schema | None:
    """The schema of a dataset, or None for a raw store (no schema.msgpack)."""
    # lexists: a dangling symlink in its place is a hostile store for _schema.read to refuse,
    # not a raw store.
    if not os.path.lexists(os.path.join(path, _schema.SCHEMA_FILE)):
        return None
    return _schema.read(path)


def _open(path: str) -> Any:
    from loaderx.zrecord import Zrecord

    return Zrecord(_store_dir(path))


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError


def cmd_info(args: argparse.Namespace) -> int:
    from loaderx.intake.directory import is_dataset_directory

    if is_dataset_directory(args.store):
        return _info_dataset_directory(args)
    path = _store_dir(args.store)
    info: dict[str, Any] = {"path": os.path.abspath(path)}
    s = _dataset_schema(path)
    if s is not None:
        info.update(kind=s.kind, dtype=s.dtype.str, dtype_name=s.dtype.name,
                    item_shape=list(s.item_shape), codec=s.codec)
    else:
        info.update(kind="raw", dtype=None, dtype_name=None, item_shape=None, codec=None)
    with _open(path) as z:
        st = z.stats()
        if s is not None and s.kind == "ragged" and st["records"]:
            info["rows"] = _row_stats(z, s)
    info.update(records=st["records"], live_bytes=st["live_bytes"],
                logical_bytes=st["logical_bytes"], chunk_bytes=st["chunk_bytes"],
                reclaimable=st["reclaimable"], chunks=st["chunks"],
                compressed_records=st["compressed_records"], dict_bytes=st["dict_bytes"],
                checksums=st["checksums"])
    if args.json:
        print(json.dumps(info, indent=2))
        return EXIT_OK
    shape = "" if info["item_shape"] is None else f"  item shape {tuple(info['item_shape'])}"
    lines = [
        f"store        {info['path']}",
        f"kind         {info['kind']}"
        + (f"  dtype {info['dtype_name']} ({info['dtype']}){shape}" if info["dtype"]
           else "  (no schema.msgpack: byte records)"),
        f"codec        {info['codec'] or '-'} (last conversion); "
        f"{info['compressed_records']} of {info['records']} records stored compressed",
        f"records      {info['records']}",
        f"live bytes   {_size(info['live_bytes'])} stored, {_size(info['logical_bytes'])} "
        "decoded",
        f"chunk bytes  {_size(info['chunk_bytes'])} in {info['chunks']} chunk file(s), "
        f"{_size(info['reclaimable'])} reclaimable by compact",
        f"dictionary   {_size(info['dict_bytes']) if info['dict_bytes'] else 'none'}",
        f"checksums    {'yes (sums.zr)' if info['checksums'] else 'no'}",
    ]
    if "rows" in info:
        r = info["rows"]
        lines.insert(4, f"rows/record  min {r['min']}  median {r['median']}  max {r['max']}  "
                        f"mean {r['mean']:.1f}")
    print("\n".join(lines))
    return EXIT_OK


def _row_stats(z: Any, s: Any) -> dict[str, float]:
    """Rows (first-axis length) per record of a ragged store, from the table alone (no record
    is read): min, median, max and mean."""
    n = len(z)
    rows = np.empty(n, np.uint64)
    step = 1 << 20
    for start in range(0, n, step):  # bounded memory for the index array
        idx = np.arange(start, min(n, start + step), dtype=np.uint64)
        rows[start:start + len(idx)] = z.lengths(idx)
    unit = max(1, s.item_bytes)
    rows //= np.uint64(unit)
    return {"min": int(rows.min()), "median": float(np.median(rows)), "max": int(rows.max()),
            "mean": float(rows.mean())}


def cmd_convert(args: argparse.Namespace) -> int:
    from loaderx.converter import from_numpy

    if _is_table(args.input, sniff=args.split_at is None):
        return _convert_parquet(args)
    if args.resume:
        raise _UsageError("--resume is for Parquet files (converted in parts); other inputs "
                          "are converted in one transaction: run the command again")
    files = _files_source(args.input)
    if files is not None:
        return files(args)
    if not os.path.isfile(args.input):
        raise _UsageError(f"{args.input}: no such file")
    if args.split_at is not None:
        return _convert_tokens(args)
    if args.dtype is not None or args.max_record_bytes is not None:
        raise _UsageError("--dtype and --max-record-bytes are for token streams: pass "
                          "--split-at END_TOKEN")
    try:
        arr = np.load(args.input, mmap_mode="r", allow_pickle=False)
    except Exception as e:  # numpy raises several types for a file that is not a .npy
        raise _UsageError(f"{args.input}: not a readable .npy file ({e})") from None
    if not isinstance(arr, np.ndarray):
        raise _UsageError(f"{args.input}: holds several arrays (.npz); convert one .npy")
    _refuse_existing(args, "records")
    progress = None if args.progress == "auto" else args.progress == "on"
    args.codec = args.codec or "zstd"
    n = from_numpy(args.out, arr, codec=args.codec, chunk_bytes=args.chunk_bytes,
                   dict_size=args.dict_size, overwrite=args.overwrite,
                   append=True if args.append else None, progress=progress,
                   checksums=args.checksums)
    print(f"{args.out}: {n} records ({arr.dtype.str} {tuple(arr.shape[1:])}, {args.codec})")
    return EXIT_OK


def _refuse_existing(args: argparse.Namespace, what: str) -> None:
    """A dataset at the destination is only appended to or replaced when asked."""
    if _schema.is_store(args.out) and not (args.append or args.overwrite):
        raise _UsageError(f"{args.out} already holds a dataset; pass --append to add these "
                          f"{what} to it or --overwrite to replace it")


def _convert_tokens(args: argparse.Namespace) -> int:
    """A flat token stream (a 1-D .npy, or a raw file such as nanoGPT's train.bin with
    --dtype) cut into documents at --split-at and written for loaderx.pack."""
    from loaderx.intake.tokens import from_token_stream

    if args.input.endswith(".npy"):
        if args.dtype is not None:
            raise _UsageError("a .npy file names its own dtype; drop --dtype")
        try:
            tokens = np.load(args.input, mmap_mode="r", allow_pickle=False)
        except Exception as e:  # numpy raises several types for a file that is not a .npy
            raise _UsageError(f"{args.input}: not a readable .npy file ({e})") from None
    else:
        if args.dtype is None:
            raise _UsageError(f"{args.input} is not a .npy file: name its token type with "
                              "--dtype (uint16 for nanoGPT's .bin files)")
        try:
            dtype = np.dtype(args.dtype)
        except TypeError:
            raise _UsageError(f"--dtype {args.dtype!r} is not a NumPy dtype") from None
        if dtype.kind not in "iu":
            raise _UsageError(f"--dtype must be an integer type, got {dtype}")
        size = os.path.getsize(args.input)
        if size % dtype.itemsize:
            raise _UsageError(f"{args.input} holds {size} bytes, not a whole number of "
                              f"{dtype.itemsize}-byte tokens; is --dtype right?")
        tokens = (np.memmap(args.input, dtype=dtype, mode="r") if size
                  else np.empty(0, dtype))
    _refuse_existing(args, "documents")
    progress = None if args.progress == "auto" else args.progress == "on"
    codec = args.codec or "raw"
    n = from_token_stream(args.out, tokens, args.split_at, codec=codec,
                          max_record_bytes=args.max_record_bytes, overwrite=args.overwrite,
                          append=True if args.append else None, progress=progress,
                          checksums=args.checksums, chunk_bytes=args.chunk_bytes)
    print(f"{args.out}: {n} documents ({tokens.dtype.str} tokens, {codec}); read it with "
          f"loaderx.pack(RaggedDataset({args.out!r}), seq_len, eos_id={args.split_at})")
    return EXIT_OK


# -- convert: image folders and WebDataset shards (loaderx.intake.files) -----------------------

_SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2")


def _files_source(given: str) -> Any:
    """The converter of ``loaderx convert`` for an image folder (a directory that is not a
    dataset) or WebDataset shards (a .tar path, glob or brace pattern); None for others."""
    if os.path.isdir(given):
        from loaderx.intake.directory import is_dataset_directory

        if _schema.is_store(given) or is_dataset_directory(given):
            raise _UsageError(f"{given} is already a loaderx dataset; convert takes a .npy "
                              "file, an image folder or WebDataset shards")
        return _convert_image_folder
    if given.endswith(_SHARD_SUFFIXES):
        return _convert_webdataset
    return None


def _files_options(args: argparse.Namespace, what: str) -> dict[str, Any]:
    # --append: onto the dataset at OUT, every column at once (loaderx.intake.growing).
    return {"codec": args.codec or "raw", "overwrite": args.overwrite, "append": args.append,
            "checksums": args.checksums, "workers": args.workers,
            "progress": None if args.progress == "auto" else args.progress == "on"}


def _print_skipped(report: dict[str, Any]) -> None:
    skipped = {k: n for k, n in report["skipped"].items() if n}
    if skipped:
        examples = report.get("skipped_examples", {})
        print("skipped " + "; ".join(f"{n} {k} (e.g. {', '.join(examples.get(k, []))})"
                                     for k, n in skipped.items())
              + " (--strict refuses them)", file=sys.stderr)


def _convert_image_folder(args: argparse.Namespace) -> int:
    import warnings

    from loaderx.intake.files import SkippedFilesWarning, from_image_folder

    options = _files_options(args, "an image folder")
    with warnings.catch_warnings():  # the skipped files are printed below, in one line
        warnings.simplefilter("ignore", SkippedFilesWarning)
        r = from_image_folder(args.out, args.input, strict=args.strict, **options)
    empty = f", {len(r['empty_classes'])} without images" if r["empty_classes"] else ""
    if "appended" in r:
        empty += f"; {r['appended']} appended, {len(r['new_classes'])} new classes"
    print(f"{args.out}: {r['rows']} images in {len(r['classes'])} classes{empty} "
          f"({_size(r['bytes'])}; columns image, label, path)")
    _print_skipped(r)
    return EXIT_OK


def _convert_webdataset(args: argparse.Namespace) -> int:
    import warnings

    from loaderx.intake.files import SkippedFilesWarning, from_webdataset

    options = _files_options(args, "WebDataset shards")
    extensions = args.extensions.split(",") if args.extensions else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedFilesWarning)
        r = from_webdataset(args.out, args.input, extensions=extensions, missing=args.missing,
                            label=args.label, **options)
    print(f"{args.out}: {r['rows']} samples from {len(r['shards'])} shard(s) "
          f"({_size(r['bytes'])}; columns {', '.join(r['columns'])})")
    _print_skipped(r)
    return EXIT_OK


# -- convert and info: Parquet tables and dataset directories (loaderx.intake) --------------------


def _is_table(given: str, sniff: bool = True) -> bool:
    """Whether ``loaderx convert`` got a table: a Parquet or Arrow IPC path or glob
    (``'data/*.parquet'``, ``'data/*.arrow'``, quoted so that the shell leaves it alone), a
    file that begins as one of them does (unless it is a token stream: ``sniff=False``), or a
    Hugging Face ``save_to_disk`` directory (a ``DatasetDict``'s too, which from_arrow refuses
    naming its splits)."""
    from loaderx.intake import _arrow_files as af

    if given.endswith((".parquet",) + af.IPC_SUFFIXES):
        return True
    if os.path.isdir(given):
        return af.is_hf_directory(given) or af.is_hf_dataset_dict(given)
    return sniff and af.sniff(given) is not None


def _convert_parquet(args: argparse.Namespace) -> int:
    """A table: Parquet or Arrow IPC files, or a Hugging Face dataset directory."""
    from loaderx.intake.directory import read_manifest
    from loaderx.intake.tables import from_arrow

    columns = [c for c in args.columns.split(",") if c] if args.columns else None
    n = from_arrow(args.out, args.input, columns=columns, codec=args.codec or "zstd",
                   overwrite=args.overwrite, chunk_bytes=args.chunk_bytes,
                   progress=None if args.progress == "auto" else args.progress == "on",
                   checksums=args.checksums, resume=args.resume, append=args.append)
    names = ", ".join(c.name for c in read_manifest(args.out).columns)
    print(f"{args.out}: {n} rows; columns {names}")
    return EXIT_OK


def _info_dataset_directory(args: argparse.Namespace) -> int:
    """``loaderx info`` of a dataset directory: its manifest, and each column's store sizes
    (summed over the parts of a directory of parts)."""
    from loaderx.intake.directory import open_dataset, read_manifest

    path = os.path.abspath(args.store)
    manifest = read_manifest(path)
    datasets = open_dataset(path)
    columns = []
    try:
        for col in manifest.columns:
            ds = datasets[col.name]
            group = getattr(ds, "column_group", None)  # a grouped column: its group's stores
            stores = group.stores if group is not None else [
                p.store for p in getattr(ds, "parts", [ds])]
            stats = [z.stats() for z in stores]
            columns.append({
                "name": col.name, "store": col.store, "kind": col.kind, "dtype": col.dtype.str,
                "item_shape": list(col.item_shape), "codec": col.codec, "extra": col.extra,
                "live_bytes": sum(st["live_bytes"] for st in stats),
                "logical_bytes": sum(st["logical_bytes"] for st in stats),
                "checksums": all(st["checksums"] for st in stats),
            })
    finally:
        for ds in datasets.values():
            ds.close()
    info = {"path": path, "format": "loaderx-dataset", "rows": manifest.rows,
            "parts": [{"path": p.path, "rows": p.rows} for p in manifest.parts],
            "extra": manifest.extra, "columns": columns}
    if args.json:
        print(json.dumps(info, indent=2))
        return EXIT_OK
    width = max([len(repr(c["name"])) for c in columns] + [6])
    lines = [f"dataset      {path}",
             f"rows         {manifest.rows}"
             + (f" in {len(manifest.parts)} parts" if manifest.parts else ""),
             f"columns      {len(columns)}"]
    for c in columns:
        shape = f"{c['kind']} {np.dtype(c['dtype']).name}" + (
            f" {tuple(c['item_shape'])}" if c["item_shape"] else "")
        notes = []
        if c["extra"].get("string"):
            notes.append("UTF-8 text")
        if "classes" in c["extra"]:
            notes.append(f"{len(c['extra']['classes'])} classes")
        if "arrow_type" in c["extra"]:
            notes.append(f"from {c['extra']['arrow_type']}")
        lines.append(f"  {c['name']!r:<{width}}  {shape:<24} {c['codec']:<9} "
                     f"{_size(c['live_bytes'])} stored, {_size(c['logical_bytes'])} decoded"
                     + (f"  ({'; '.join(notes)})" if notes else ""))
    print("\n".join(lines))
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from loaderx._archives.verifying import verify_store
    from loaderx.intake.directory import is_dataset_directory

    if args.max_listed < 0:
        raise _UsageError("--max-listed must be 0 or more")
    if is_dataset_directory(args.store):
        return _verify_dataset_directory(args)
    path = _store_dir(args.store)
    report = verify_store(path, max_listed=args.max_listed)
    damaged = report["damaged"]
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_DAMAGED if damaged else EXIT_OK
    for index, message in report["failures"]:
        print(f"record {index}: {message}")
    if damaged > args.max_listed:
        print(f"... and {damaged - len(report['failures'])} more damaged records "
              "(--max-listed N lists more)")
    summary = (f"{path}: {report['records']} records decoded, {report['checked']} checked "
               f"against checksums, {report['unchecked']} without one; "
               f"{damaged} damaged; {_scope(report)}")
    print(summary, file=sys.stderr if damaged else sys.stdout)
    return EXIT_DAMAGED if damaged else EXIT_OK


def _scope(report: dict[str, Any]) -> str:
    """What a verification could check: without checksums a raw record's bytes cannot be told
    from damaged ones, only decoded (compressed records carry zstd's own frame checks)."""
    if report["unchecked"] == 0:
        return "every record checked against its checksum"
    if report["checked"] == 0:
        return ("no checksums kept (convert with --checksums, or Zrecord.enable_checksums()): "
                "compressed records were decoded and their frames checked, raw records only "
                "read, so damage to raw bytes cannot be seen")
    return (f"{report['unchecked']} records have no checksum (raw bytes among them could be "
            "damaged unseen)")


def _verify_dataset_directory(args: argparse.Namespace) -> int:
    """``loaderx verify`` of a dataset directory: a line per column, its damaged records (up to
    --max-listed in all) and problems below it -- in a directory of parts under the part and
    store they are in -- then a summary. Exit 3 when the directory cannot be used as it is (a
    store missing, unopenable, or not as the manifest says), else 1 when records are damaged."""
    from loaderx._archives.verifying import verify_dataset

    report = verify_dataset(args.store, max_listed=args.max_listed)
    status = (EXIT_CORRUPT if report["problem_count"] else
              EXIT_DAMAGED if report["damaged"] else EXIT_OK)
    if args.json:
        print(json.dumps(report, indent=2))
        return status
    listed = 0
    for col in report["columns"]:
        if not col["stores"] and col.get("group"):  # its rows are checked with its group's
            print(f"column {col['name']!r}: in {col['group']}")
            continue
        if not report["parts"]:
            store = col["stores"][0]
            print(f"column {col['name']!r} ({store['path']}): {_counts(store)}")
            listed += _print_faults(store, "  ")
            continue
        print(f"column {col['name']!r} ({len(col['stores'])} of {len(report['parts'])} parts): "
              f"{_counts(col)}")
        for problem in col["problems"]:
            print(f"  {problem}")
        for store in col["stores"]:
            if store["problems"] or store["damaged"]:
                print(f"  part {store['part']} ({store['path']}): {_counts(store)}")
                listed += _print_faults(store, "    ")
    for problem in report["problems"]:
        print(f"{report['path']}: {problem}")
    if report["damaged"] > listed:
        print(f"... and {report['damaged'] - listed} more damaged records (--max-listed N "
              "lists more)")
    faults = [f"{s['damaged']} damaged in column {c['name']!r} ({s['path']})"
              for c in report["columns"] for s in c["stores"] if s["damaged"]]
    for c in report["columns"]:
        n = len(c["problems"]) + sum(len(s["problems"]) for s in c["stores"])
        if n:
            faults.append(f"{n} problem(s) with column {c['name']!r}")
    if report["problems"]:
        faults.append(f"{len(report['problems'])} problem(s) with its parts")
    parts = f" in {len(report['parts'])} parts" if report["parts"] else ""
    found = "; ".join(faults) if faults else "nothing damaged, every store as the manifest says"
    groups = {c["group"] for c in report["columns"] if c.get("group")}  # (entries of their own)
    own = [c for c in report["columns"] if c["name"] not in groups]
    print(f"{args.store}: a dataset directory of {len(own)} columns and "
          f"{report['rows']} rows{parts}; {report['records']} records decoded, "
          f"{report['checked']} checked against checksums, {report['unchecked']} without one; "
          f"{found}; {_scope(report)}", file=sys.stderr if status else sys.stdout)
    return status


def _counts(entry: dict[str, Any]) -> str:
    """What a store's (or a column's) entry of a dataset report says, in one line."""
    if entry["records"] is None:
        return "not checked: " + "; ".join(entry["problems"])
    return (f"{entry['records']} records decoded, {entry['checked']} checked against "
            f"checksums, {entry['unchecked']} without one; {entry['damaged']} damaged")


def _print_faults(store: dict[str, Any], indent: str) -> int:
    """Prints the problems and listed damaged records of a store's entry; returns how many
    records it listed."""
    if store["records"] is not None:
        for problem in store["problems"]:
            print(f"{indent}{problem}")
    for index, message in store["failures"]:
        print(f"{indent}record {index}: {message}")
    return len(store["failures"])


def cmd_copy(args: argparse.Namespace) -> int:
    from loaderx._archives.copying import copy

    _source(args.src)
    r = copy(args.src, args.dst, overwrite=args.overwrite)
    print(f"{args.dst}: {_holds(r)}, {r['bytes_copied']} bytes copied of "
          f"{r['apparent_bytes']} apparent (holes kept); {_verified(r['verify'])}")
    return EXIT_OK


def _source(path: str) -> str:
    """``path``, a store or a dataset directory (else a usage error)."""
    from loaderx.intake.directory import MANIFEST_FILE, is_dataset_directory

    if is_dataset_directory(path):
        return path
    if os.path.exists(path) and not _schema.is_store(path):
        raise _UsageError(f"{path}: not a loaderx store (no {_schema.META_FILE}) nor a dataset "
                          f"directory (no {MANIFEST_FILE})")
    return _store_dir(path)


def _holds(report: dict[str, Any]) -> str:
    """What a copy, a pack or an unpack carried, in a few words."""
    if report["kind"] == "store":
        return f"{report['records']} records"
    parts = f" in {report['parts']} parts" if report["parts"] else ""
    return (f"a dataset directory of {report['rows']} rows{parts}, {report['columns']} "
            f"columns ({report['stores']} stores, {report['records']} records)")


def _verified(report: dict[str, Any]) -> str:
    return (f"verified: {report['checked']} against checksums, {report['unchecked']} decoded "
            "without one")


def cmd_pack(args: argparse.Namespace) -> int:
    from loaderx._archives.archive import pack

    if args.command == "pack":
        print("loaderx: 'loaderx pack' is the old name of 'loaderx archive' (a tar archive of a "
              "store or dataset directory; loaderx.pack() in Python packs token sequences)",
              file=sys.stderr)
    _source(args.src)
    r = pack(args.src, args.archive)
    print(f"{args.archive}: {_holds(r)}, {r['bytes_packed']} bytes of data of "
          f"{r['apparent_bytes']} apparent (holes kept), archive {r['archive_bytes']} bytes")
    if r["skipped"]:
        print(f"left out {len(r['skipped'])} file(s) that are not a store's: "
              f"{', '.join(r['skipped'][:10])}{' ...' if len(r['skipped']) > 10 else ''}",
              file=sys.stderr)
    return EXIT_OK


def cmd_unpack(args: argparse.Namespace) -> int:
    from loaderx._archives.archive import unpack

    r = unpack(args.archive, args.dst, overwrite=args.overwrite)
    print(f"{args.dst}: {_holds(r)}, {r['bytes_written']} bytes written (holes "
          f"kept); {_verified(r['verify'])}")
    return EXIT_OK


def cmd_upgrade(args: argparse.Namespace) -> int:
    from loaderx.intake.directory import is_dataset_directory
    from loaderx.intake.upgrading import upgrade

    if not is_dataset_directory(args.dataset):
        raise _UsageError(f"{args.dataset}: not a dataset directory (no manifest.json); "
                          "upgrade rewrites dataset directories")
    r = upgrade(args.dataset)
    if not r["upgraded"]:
        print(f"{args.dataset}: already in the current layout ({r['rows']} rows)")
    else:
        print(f"{args.dataset}: {r['rows']} rows rewritten; {len(r['grouped'])} column(s) in a "
              f"column group: {', '.join(r['grouped']) or '(none)'}")
    return EXIT_OK


def cmd_compact(args: argparse.Namespace) -> int:
    with _open(args.store) as z:
        r = z.compact()
    print(f"{args.store}: moved {r['moved']} records, chunk bytes "
          f"{_size(r['chunk_bytes_before'])} -> {_size(r['chunk_bytes_after'])}, "
          f"{r['chunks_removed']} chunk file(s) removed")
    return EXIT_OK


def cmd_profile(args: argparse.Namespace) -> int:
    from loaderx import profiling

    if args.plot is not None:
        try:
            profiling.check_plot(args.plot)
        except profiling.ProfileError as e:
            raise _UsageError(f"--plot: {e}; nothing was run") from None
    if args.transform is not None and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: a module of this directory
    workers = _int_list(args.workers, "--workers")
    modes = [m for m in args.modes.split(",") if m] if args.modes else list(profiling.MODES)
    for mode in modes:
        if mode not in profiling.MODES:
            raise _UsageError(f"--modes: {mode!r} is not a worker mode (thread, process)")
    for path in args.data:
        if not os.path.exists(path):
            raise _UsageError(f"{path}: no such file or directory")
    quiet = args.json or not sys.stderr.isatty()

    def progress(line: str) -> None:
        if not quiet:
            print(f"  {line}", file=sys.stderr)

    try:
        report = profiling.profile(args.data if len(args.data) > 1 else args.data[0],
                                   args.batch_size, args.transform, workers=workers,
                                   modes=modes,
                                   seconds=args.seconds, budget=args.budget,
                                   start_method=args.start_method, plot=args.plot,
                                   progress=progress)
    except profiling.ProfileError as e:
        raise _UsageError(str(e)) from None
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.table())
        if args.plot is not None:
            print(f"plot: {args.plot}")
    failed = [r for r in report.runs if r.error is not None]
    if report.runs and len(failed) == len(report.runs):
        raise _UsageError(f"every run failed; the first ({failed[0].mode}, "
                          f"num_workers={failed[0].workers}): {failed[0].error}")
    return EXIT_OK


def _int_list(text: str | None, flag: str) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise _UsageError(f"{flag}: expected integers separated by commas, got {text!r}") \
            from None
    if not values or any(v < 1 for v in values):
        raise _UsageError(f"{flag}: expected positive integers, got {text!r}")
    return values


def cmd_bench(args: argparse.Namespace) -> int:
    script = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench.py"
    if not script.is_file():
        raise _UsageError("the benchmark harness ships with the source tree (scripts/bench.py); "
                          "run this from a checkout of loaderx")
    cmd = [sys.executable, str(script), args.layer, *args.options]
    return subprocess.run(cmd).returncode


def _version() -> str:
    from loaderx import __version__

    return __version__


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="loaderx", description="loaderx record stores and datasets")
    p.add_argument("--version", action="version", version=f"loaderx {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = sub.add_parser("info", help="what a store or dataset holds")
    info.add_argument("store")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(run=cmd_info)

    conv = sub.add_parser("convert", help="write a .npy array, a table, an image folder or "
                                          "WebDataset shards as a dataset")
    conv.add_argument("input", help="a .npy file (memory-mapped, never loaded whole); a token "
                      "stream with --split-at; Parquet or Arrow IPC files (.arrow, .feather: "
                      "either IPC format) or a Hugging Face save_to_disk directory; an image "
                      "folder (one folder per class); WebDataset shards (a .tar path, glob or "
                      "brace pattern such as 'shards-{000..099}.tar', quoted)")
    conv.add_argument("out", help="the dataset directory (must not hold one, unless --append "
                      "or --overwrite)")
    conv.add_argument("--codec", choices=CODECS, default=None,
                      help="default: zstd for arrays, raw for images and shards")
    conv.add_argument("--chunk-bytes", type=int, default=64 << 20)
    conv.add_argument("--dict-size", type=int, default=None)
    conv.add_argument("--checksums", action="store_true", help="keep a checksum per record")
    tokens = conv.add_argument_group("token streams (INPUT: a 1-D .npy, or a raw file with "
                                     "--dtype, e.g. nanoGPT's train.bin)")
    tokens.add_argument("--split-at", type=int, default=None, metavar="END_TOKEN",
                        help="cut the stream into documents at this token (dropped; "
                        "pack(..., eos_id=END_TOKEN) puts it back), one record each, "
                        "default codec raw")
    tokens.add_argument("--dtype", default=None, help="the token type of a raw file: uint16, "
                        "uint32, int32")
    tokens.add_argument("--max-record-bytes", type=int, default=None, metavar="N",
                        help="pieces for long documents (default: 1 MiB raw, 4 KiB zstd)")
    what = conv.add_mutually_exclusive_group()
    what.add_argument("--append", action="store_true",
                      help="add the records to an existing dataset of the same dtype and shape "
                      "(an image folder, shards or a table: to a dataset directory of the same "
                      "columns, every column at once, class names matched)")
    what.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    conv.add_argument("--progress", choices=["auto", "on", "off"], default="auto",
                      help="progress bar on stderr (tqdm's when installed; auto: when a terminal)")
    files = conv.add_argument_group("image folders and WebDataset shards")
    files.add_argument("--workers", type=int, default=None,
                       help="threads reading files or shards (default: by the cores)")
    files.add_argument("--strict", action="store_true",
                       help="image folder: refuse links, non-images and other entries that "
                       "would be skipped")
    files.add_argument("--extensions", default=None, metavar="EXT,EXT",
                       help="shards: the extensions to keep (default: the first sample's)")
    files.add_argument("--missing", choices=["refuse", "empty"], default="refuse",
                       help="shards: a sample lacking an extension is refused, or stored empty "
                       "with a False in __present__")
    files.add_argument("--label", default=None, metavar="EXT",
                       help="shards: also write this extension's integers (e.g. cls) as the "
                       "int64 column label")
    tables = conv.add_argument_group("tables (INPUT: Parquet or Arrow IPC files -- a path or a "
                                     "quoted glob -- or a Hugging Face save_to_disk directory)")
    tables.add_argument("--columns", default=None, metavar="NAME,NAME",
                        help="the columns to convert, in this order (default: all)")
    tables.add_argument("--resume", action="store_true",
                        help="in parts of consecutive files; run again after an interruption, "
                        "keep the parts an earlier run finished and convert the rest")
    conv.set_defaults(run=cmd_convert)

    ver = sub.add_parser(
        "verify", help="decode every record and check checksums (a store, or every store of a "
        "dataset directory)",
        description="Decodes every record of a store and checks it against its checksum and the "
        "schema. Of a dataset directory: every column's store of every part, and that each is "
        "what the manifest says (there, its kind, dtype and shape, its row count); a line per "
        "column. Exit 1: damaged records; 3: a store missing, unopenable or not as the "
        "manifest says.")
    ver.add_argument("store", help="a store or a dataset directory")
    ver.add_argument("--max-listed", type=int, default=100, metavar="N",
                     help="damaged records listed one per line before a summary (default 100; "
                     "in a dataset directory, in all)")
    ver.add_argument("--json", action="store_true", help="the report as JSON (per column and "
                     "store of a dataset directory)")
    ver.set_defaults(run=cmd_verify)

    cp = sub.add_parser(
        "copy", help="copy a store or a dataset directory, holes kept, checked",
        description="Copies a store, or a dataset directory whole (every column's store of "
        "every part, the manifests), holes kept; the copy is built aside, checked (every "
        "record decoded, the directory opened) and then renamed into place, so nothing "
        "half-made is ever at DST.")
    cp.add_argument("src", help="a store or a dataset directory")
    cp.add_argument("dst", help="a new directory (built aside, then renamed into place)")
    cp.add_argument("--overwrite", action="store_true",
                    help="replace a loaderx store or dataset directory at DST (atomically)")
    cp.set_defaults(run=cmd_copy)

    for command in ("archive", "pack"):
        old = command == "pack"
        pk = sub.add_parser(
            command, help=("the old name of 'archive'" if old else
                           "write a store or a dataset directory into one tar archive, holes "
                           "kept (compressed by suffix: .tar.gz, .tar.xz, .tar.bz2)"),
            description=("'loaderx pack' is the old name of 'loaderx archive' (unrelated to "
                         "loaderx.pack(), which packs token sequences). " if old else "")
            + "Writes a store or a dataset directory (whole: its manifests and every store, "
            "under one folder) into one tar archive, holes kept; files the manifests do not "
            "name are left out and listed.")
        pk.add_argument("src", help="a store or a dataset directory")
        pk.add_argument("archive", help="a new file")
        pk.set_defaults(run=cmd_pack)

    up = sub.add_parser(
        "unpack", help="unpack an archive of a store or a dataset directory into a new "
        "directory, checked",
        description="Unpacks an archive of a store or a dataset directory (from archive, tar "
        "--sparse or tar), read strictly: only the layout's paths, each manifest checked as "
        "it comes; the directory is built aside and renamed into place only once it holds "
        "exactly what its manifests name, every record decoded. A bad archive is refused "
        "(exit 3) and leaves nothing.")
    up.add_argument("archive")
    up.add_argument("dst", help="a new directory (built aside, then renamed into place)")
    up.add_argument("--overwrite", action="store_true",
                    help="replace a loaderx store or dataset directory at DST (atomically)")
    up.set_defaults(run=cmd_unpack)

    upg = sub.add_parser(
        "upgrade", help="rewrite a dataset directory in the current layout (column groups, "
        "one commit point)",
        description="Rewrites a dataset directory of the older layout (a store per column, "
        "manifest version 1) in the current one: its raw fixed-width columns in one column "
        "group, rows appended in place from then on. Built aside and swapped in atomically; "
        "every value kept. A directory already in the current layout is left as it is.")
    upg.add_argument("dataset", help="a dataset directory")
    upg.set_defaults(run=cmd_upgrade)

    comp = sub.add_parser("compact", help="reclaim the space of deleted records")
    comp.add_argument("store")
    comp.set_defaults(run=cmd_compact)

    bench = sub.add_parser("bench", help="run the benchmarks (from a source checkout)")
    bench.add_argument("layer", nargs="?", default="all",
                       help="a layer of the harness (sampler, store, loader, workers, ...; "
                            "all by default): `python scripts/bench.py --help` lists them")
    bench.add_argument("options", nargs=argparse.REMAINDER,
                       help="the layer's own options (--repeats N, ...), passed on as given")
    bench.set_defaults(run=cmd_bench)

    prof = sub.add_parser(
        "profile", help="how fast the loader goes on a dataset, at several worker counts in "
        "both worker modes, and what limits it",
        description="Runs the DataLoader on DATA for a bounded time at several worker counts "
        "in both worker modes and prints batches/s and the mean time per batch of each stage "
        "(index sampling, store read and decode, transform, hand-off), the consumer's wait, "
        "the workers' busy fraction and the cores busy, beside two ceilings: the store "
        "gather alone (no loader) and the transform alone on one thread. A transform that "
        "cannot be imported or that raises is reported before any loader runs (exit 2).")
    prof.add_argument("data", nargs="+", help="a dataset directory, or one or more stores "
                      "(one stream each, named after its directory)")
    prof.add_argument("--batch-size", type=int, default=256, metavar="N")
    prof.add_argument("--transform", default=None, metavar="MODULE:FUNCTION",
                      help="the transform to run on each batch (a module of the current "
                      "directory, or any importable one)")
    prof.add_argument("--workers", default=None, metavar="N,N",
                      help="worker counts to try (default: 1, 2, 4, ... and the core count)")
    prof.add_argument("--modes", default=None, metavar="MODE,MODE",
                      help="thread, process or both (default)")
    prof.add_argument("--seconds", type=float, default=2.0,
                      help="how long each run takes batches, after its warm-up (default 2)")
    prof.add_argument("--budget", type=float, default=50.0,
                      help="start no run after this many seconds (default 50)")
    prof.add_argument("--start-method", default=None, choices=["fork", "forkserver", "spawn"],
                      help="how worker processes start (default: the loader's choice)")
    prof.add_argument("--plot", default=None, metavar="OUT.png",
                      help="draw batches/s against the worker count per mode (matplotlib)")
    prof.add_argument("--json", action="store_true", help="the measurements as JSON")
    prof.set_defaults(run=cmd_profile)
    return p


def exit_status(error: BaseException) -> int:
    """The exit status for an error that ended a command (see the module docstring)."""
    for cls, status in _EXIT_OF:
        if isinstance(error, cls):
            return status
    return EXIT_INTERNAL


def _one_line(error: BaseException) -> str:
    # The library's hints name its keyword; here the user typed a flag.
    text = " ".join(str(error).split()).replace("overwrite=True", "--overwrite")
    text = re.sub(r"\bcolumns=(\[[^\]]*\])?", _columns_flag, text)
    status = exit_status(error)
    if status == EXIT_INTERNAL:
        return (f"internal error (a bug in loaderx; please report it with this command): "
                f"{type(error).__name__}: {text}")
    return f"{type(error).__name__}: {text}"


def _columns_flag(match: re.Match[str]) -> str:
    """``columns=['a', 'b.c']`` in a library hint as the flag: ``--columns a,b.c``."""
    if match.group(1) is None:
        return "--columns"
    try:
        names = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return match.group(0)
    if not isinstance(names, list) or not all(isinstance(n, str) and "," not in n
                                              for n in names):
        return match.group(0)
    return "--columns " + ",".join(names)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args))
    except _UsageError as e:
        print(f"loaderx {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"loaderx {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # every failure is one line and its own status, never a traceback
        print(f"loaderx {args.command}: {_one_line(e)}", file=sys.stderr)
        return exit_status(e)


if __name__ == "__main__":
    sys.exit(main())
