"""The ``loaderx`` command (also ``python -m loaderx``).

Commands::

    loaderx info STORE [--json]       what a store or dataset holds
    loaderx convert INPUT.npy OUT [--codec zstd] [--checksums] [--overwrite] ...
    loaderx convert 'data/*.parquet' OUT [--columns a,b]   a table as a dataset directory
    loaderx verify STORE              decode every record, check checksums; exit 1 on damage
    loaderx copy SRC DST              copy a store, holes kept, then verify the copy
    loaderx pack STORE ARCHIVE        one tar archive of a store (.tar, .tar.gz, .tar.xz, ...)
    loaderx unpack ARCHIVE DST        the store of an archive, checked, into a new directory
    loaderx compact STORE             reclaim the space of deleted records
    loaderx bench [LAYER]             run the benchmark harness (scripts/bench.py)

Exit status (one per kind of failure, so scripts can tell them apart):

    0  success
    1  ``verify`` found damaged records (the store itself opened)
    2  bad usage or input: a missing path, a file that is not a store, an unreadable .npy,
       an argument or dataset that does not fit (DatasetError, LoaderxValueError, ...)
    3  a store or archive that cannot be trusted (CorruptStoreError, MissingDictionaryError)
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
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from loaderx import _schema
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

    if _is_parquet(args.input):
        return _convert_parquet(args)
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
    if args.append:
        raise _UsageError(f"--append is not available for {what}: convert into a new "
                          "directory (or --overwrite)")
    return {"codec": args.codec or "raw", "overwrite": args.overwrite,
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


def _is_parquet(given: str) -> bool:
    """Whether ``loaderx convert`` got Parquet: a .parquet path or glob (``'data/*.parquet'``,
    quoted so that the shell leaves it alone)."""
    return given.endswith(".parquet")


def _convert_parquet(args: argparse.Namespace) -> int:
    from loaderx.intake.directory import read_manifest
    from loaderx.intake.tables import from_arrow

    if args.append:
        raise _UsageError("--append is not available for Parquet: convert into a new "
                          "directory (or --overwrite)")
    columns = [c for c in args.columns.split(",") if c] if args.columns else None
    n = from_arrow(args.out, args.input, columns=columns, codec=args.codec or "zstd",
                   overwrite=args.overwrite, chunk_bytes=args.chunk_bytes,
                   progress=None if args.progress == "auto" else args.progress == "on",
                   checksums=args.checksums)
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
            parts = getattr(ds, "parts", [ds])
            stats = [p.store.stats() for p in parts]
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
    path = _store_dir(args.store)
    if args.max_listed < 0:
        raise _UsageError("--max-listed must be 0 or more")
    schema = _dataset_schema(path)
    with _open(path) as z:
        # Only the first failures are kept (the engine counts the rest): memory stays bounded
        # however much of the store is damaged.
        report = z.verify(max_listed=args.max_listed)
        failures = list(report["failures"])
        damaged = report["failed"]
        if schema is not None and len(z):
            # A record the engine listed is not counted twice; one it only counted may be.
            listed, misfits = _schema_failures(z, schema, {i for i, _ in failures},
                                               args.max_listed)
            failures += listed
            damaged += misfits
    failures.sort()
    for index, message in failures[:args.max_listed]:
        print(f"record {index}: {message}")
    if damaged > args.max_listed:
        print(f"... and {damaged - min(args.max_listed, len(failures))} more damaged records "
              f"(--max-listed N lists more)")
    # Say what could be checked: without checksums a raw record's bytes cannot be told from
    # damaged ones, only decoded (compressed records carry zstd's own frame checks).
    if report["unchecked"] == 0:
        scope = "every record checked against its checksum"
    elif report["checked"] == 0:
        scope = ("no checksums kept (convert with --checksums, or Zrecord.enable_checksums()): "
                 "compressed records were decoded and their frames checked, raw records only "
                 "read, so damage to raw bytes cannot be seen")
    else:
        scope = (f"{report['unchecked']} records have no checksum (raw bytes among them could "
                 "be damaged unseen)")
    summary = (f"{path}: {report['records']} records decoded, {report['checked']} checked "
               f"against checksums, {report['unchecked']} without one; "
               f"{damaged} damaged; {scope}")
    print(summary, file=sys.stderr if damaged else sys.stdout)
    return EXIT_DAMAGED if damaged else EXIT_OK


def _schema_failures(z: Any, s: _schema.Schema, known: set[int],
                     max_listed: int) -> tuple[list[tuple[int, str]], int]:
    """Records whose length does not fit the dataset's schema, not in ``known``: the first
    ``max_listed`` of them (index, message) and how many there are. Lengths are read a
    million at a time, so memory stays bounded."""
    unit = s.item_bytes
    if s.kind == "dense":
        why = f"holds {{}} bytes, a {s.describe()} record is {unit}"
    elif unit:
        why = f"holds {{}} bytes, not a whole number of {unit}-byte rows"
    else:
        return [], 0
    listed: list[tuple[int, str]] = []
    count = 0
    step = 1 << 20
    for start in range(0, len(z), step):
        idx = np.arange(start, min(len(z), start + step), dtype=np.uint64)
        lengths = z.lengths(idx).astype(np.int64)
        bad = np.flatnonzero(lengths != unit if s.kind == "dense" else lengths % unit)
        for i in bad:
            if start + int(i) in known:
                continue
            count += 1
            if len(listed) < max_listed:
                listed.append((start + int(i), why.format(int(lengths[i]))))
    return listed, count


def cmd_copy(args: argparse.Namespace) -> int:
    from loaderx.copying import copy

    _store_dir(args.src)
    r = copy(args.src, args.dst)
    print(f"{args.dst}: {r['records']} records, {r['bytes_copied']} bytes copied of "
          f"{r['apparent_bytes']} apparent (holes kept); {_verified(r['verify'])}")
    return EXIT_OK


def _verified(report: dict[str, Any]) -> str:
    return (f"verified: {report['checked']} against checksums, {report['unchecked']} decoded "
            "without one")


def cmd_pack(args: argparse.Namespace) -> int:
    from loaderx.archive import pack

    _store_dir(args.src)
    r = pack(args.src, args.archive)
    print(f"{args.archive}: {r['records']} records, {r['bytes_packed']} bytes of data of "
          f"{r['apparent_bytes']} apparent (holes kept), archive {r['archive_bytes']} bytes")
    if r["skipped"]:
        print(f"left out {len(r['skipped'])} file(s) that are not a store's: "
              f"{', '.join(r['skipped'][:10])}{' ...' if len(r['skipped']) > 10 else ''}",
              file=sys.stderr)
    return EXIT_OK


def cmd_unpack(args: argparse.Namespace) -> int:
    from loaderx.archive import unpack

    r = unpack(args.archive, args.dst)
    print(f"{args.dst}: {r['records']} records, {r['bytes_written']} bytes written (holes "
          f"kept); {_verified(r['verify'])}")
    return EXIT_OK


def cmd_compact(args: argparse.Namespace) -> int:
    with _open(args.store) as z:
        r = z.compact()
    print(f"{args.store}: moved {r['moved']} records, chunk bytes "
          f"{_size(r['chunk_bytes_before'])} -> {_size(r['chunk_bytes_after'])}, "
          f"{r['chunks_removed']} chunk file(s) removed")
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    script = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench.py"
    if not script.is_file():
        raise _UsageError("the benchmark harness ships with the source tree (scripts/bench.py); "
                          "run this from a checkout of loaderx")
    cmd = [sys.executable, str(script), args.layer]
    if args.repeats:
        cmd += ["--repeats", str(args.repeats)]
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

    conv = sub.add_parser("convert", help="write a .npy array, an image folder or WebDataset "
                                          "shards as a dataset")
    conv.add_argument("input", help="a .npy file (memory-mapped, never loaded whole); a token "
                      "stream with --split-at; an image "
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
                      help="add the records to an existing dataset of the same dtype and shape")
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
    tables = conv.add_argument_group("Parquet tables (INPUT: a .parquet path or quoted glob)")
    tables.add_argument("--columns", default=None, metavar="NAME,NAME",
                        help="the columns to convert, in this order (default: all)")
    conv.set_defaults(run=cmd_convert)

    ver = sub.add_parser("verify", help="decode every record and check checksums")
    ver.add_argument("store")
    ver.add_argument("--max-listed", type=int, default=100, metavar="N",
                     help="damaged records listed one per line before a summary (default 100)")
    ver.set_defaults(run=cmd_verify)

    cp = sub.add_parser("copy", help="copy a store or dataset, holes kept, then verify it")
    cp.add_argument("src")
    cp.add_argument("dst", help="a new directory")
    cp.set_defaults(run=cmd_copy)

    pk = sub.add_parser("pack", help="write a store or dataset into one tar archive, holes "
                                     "kept (compressed by suffix: .tar.gz, .tar.xz, .tar.bz2)")
    pk.add_argument("src")
    pk.add_argument("archive", help="a new file")
    pk.set_defaults(run=cmd_pack)

    up = sub.add_parser("unpack", help="unpack a store archive (from pack or tar --sparse) "
                                       "into a new directory, then verify it")
    up.add_argument("archive")
    up.add_argument("dst", help="a new directory")
    up.set_defaults(run=cmd_unpack)

    comp = sub.add_parser("compact", help="reclaim the space of deleted records")
    comp.add_argument("store")
    comp.set_defaults(run=cmd_compact)

    bench = sub.add_parser("bench", help="run the benchmarks (from a source checkout)")
    bench.add_argument("layer", nargs="?", default="all",
                       choices=["sampler", "store", "loader", "all"],
                       help="sampler, store, loader or all (default)")
    bench.add_argument("--repeats", type=int, default=None)
    bench.set_defaults(run=cmd_bench)
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
    status = exit_status(error)
    if status == EXIT_INTERNAL:
        return (f"internal error (a bug in loaderx; please report it with this command): "
                f"{type(error).__name__}: {text}")
    return f"{type(error).__name__}: {text}"


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
