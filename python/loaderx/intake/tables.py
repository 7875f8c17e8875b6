"""Tables into loaderx: :func:`from_arrow` converts anything that speaks Arrow, or Parquet files,
into a dataset directory (one store per column; see :mod:`loaderx.intake.directory`).

>>> import pyarrow as pa, tempfile, os
>>> from loaderx.intake import open_dataset, decode_strings
>>> table = pa.table({"label": [3, 1, 2], "text": ["a", "bé", ""],
...                   "vec": pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.float32(), 2))})
>>> dst = os.path.join(tempfile.mkdtemp(), "ds")
>>> from_arrow(dst, table)
3
>>> ds = open_dataset(dst)
>>> ds["label"][[0, 2]].tolist(), decode_strings(ds["text"][[1, 2]]), ds["vec"][1].tolist()
([3, 2], ['bé', ''], [3.0, 4.0])

Sources: an object with ``__arrow_c_stream__`` (a pyarrow Table or RecordBatchReader, a polars
DataFrame, a DuckDB relation, a pandas DataFrame), a ``pyarrow.dataset.Dataset``, a
``pyarrow.RecordBatch``, a Hugging Face ``datasets.Dataset`` (read through its Arrow table, in
its current order), or Parquet files: a path, a directory (its ``*.parquet`` files, recursively),
a glob (``data/*.parquet``, ``**`` allowed), or a list of those, read in sorted order. Files
that begin as Arrow IPC files do (either format: ``pyarrow.ipc.new_file`` / Feather, or
``new_stream``, as Hugging Face's ``.arrow`` files are) are read as those, and a Hugging Face
``save_to_disk`` directory as the files its ``state.json`` names; a ``DatasetDict``'s directory
is refused, naming its splits. These are read as untrusted input
(:mod:`loaderx.intake._arrow_files`).
Record batches are streamed -- read ahead by one thread while the previous one is written, sliced
to about ``chunk_bytes`` -- so memory stays bounded whatever the table's size; pyarrow decodes
with its thread pool and the store engine compresses each append on every core.

How Arrow types map (``arrow_type`` in the column's manifest entry keeps the original type):

=====================================  ==========================================================
bool, int8..uint64, float16..float64   dense scalars of that NumPy dtype
fixed_size_list (nested), fixed-shape  dense, ``item_shape`` the list sizes / the tensor shape
tensor, fixed_size_binary(k)           (fixed_size_binary: ``uint8`` of shape ``(k,)``)
list / large_list of numerics (or of   ragged: record ``i`` has the list's ``n_i`` elements
fixed_size_lists of numerics)          (``item_shape`` the inner fixed sizes); empty lists kept
binary, large_binary, binary_view      ragged ``uint8``: the bytes
string, large_string, string_view      ragged ``uint8``: the UTF-8 bytes, with ``"string": true``
                                       (:func:`~loaderx.intake.directory.decode_strings`)
timestamp, date32/64, duration,        dense ``datetime64`` / ``timedelta64`` of the same unit
time32/64                              (date32 widened to ``datetime64[D]``; time-of-day as
                                       ``timedelta64`` since midnight); a timestamp's time zone
                                       is kept as ``tz`` (values are UTC, as in Arrow)
dictionary (pandas categorical)        decoded to its values, then mapped as those
struct                                 flattened: field ``b`` of ``a`` is column ``a.b``
other extension types                  mapped by their storage type (a struct storage flattened
                                       as a struct is)
=====================================  ==========================================================

Refused, with a DatasetError naming the column, its type and the fix: **nulls** anywhere (a
null value, list or element, a null in a tensor or in the dictionary values a row takes -- the
first row holding one is named: fill them first -- ``pyarrow.compute.fill_null``, polars
``fill_null``, pandas ``fillna`` -- or drop the rows, or leave the column out with
``columns=``), decimals (cast to float64 or to strings), lists of strings or of binary, lists
of lists, maps, unions, the null type, variable-shape tensors, tensors with a permutation
(store them row-major first). Nothing is written then. A struct field that is null in every
row -- where the source tells that without a second read: a table, Parquet footers' statistics,
uncompressed IPC files -- is refused before anything is written, naming the columns to keep;
a struct field of a refused type is refused only if chosen.

Hugging Face ``ClassLabel`` names (in the table's ``huggingface`` metadata, which Parquet files
of the Hub carry too) are kept as ``"classes"``; the index columns pandas adds
(``__index_level_0__``) are left out unless ``columns=`` names them. A top-level ``Image``
(``Audio``, ``Video``, ``Pdf``) feature, stored as ``struct<bytes, path>``, becomes the column of
its name -- the encoded bytes, ragged ``uint8`` with ``"encoded": "image"`` (as
:func:`~loaderx.intake.files.from_image_folder` stores images) and the feature under
``"huggingface"`` -- and ``<name>.path``, text (``""`` where a row has none), left out when it
is null in every row unless ``columns=`` names it. A row without bytes is refused, naming the
fix (an image kept only as a file's path: ``Dataset.save_to_disk`` embeds the files).

Parquet files are checked against what their footers declare: a file that holds another number
of rows than it says, or cannot be decoded, is a CorruptStoreError naming it, and nothing is
written. Every file must have the same column types as the first.

A conversion is one transaction (:class:`~loaderx.intake.directory.DirectoryWriter`): when it
fails or is killed, nothing is left at ``dst``; running it again gives exactly the dataset an
uninterrupted run gives (``overwrite=True`` replaces a finished one).

**Resuming.** A long conversion of many Parquet files need not start over after a kill:
``from_arrow(dst, "data/*.parquet", resume=True)`` converts consecutive files, up to
:data:`RESUME_PART_BYTES` (128 MiB) of them, into one part (``<dst>.parts/<k:05d>``, ``k`` the
index of its first file; each published whole in one rename, its record naming the files it
covers), then joins the parts into ``dst`` (:mod:`loaderx.intake.joining`); files that one part
holds, all of them, are converted straight into ``dst``, as one transaction. Run again after an
interruption, it keeps every part that an earlier run finished from the same files -- same real
paths, inodes, sizes, modification and change times -- with the same ``columns``, ``codec`` and
``checksums``, and converts the others (the part the kill cut short is rewritten from its
start, and a part with a file changed since, whole); a finished conversion run again returns
its row count and writes nothing. Every file is checked before any part is written, as without
resume. The parts are then joined into one store per column without copying a record
(:func:`loaderx.intake.joining.assemble`), so the result reads as one conversion's. Sources
other than Parquet files are one stream and are not resumed (``resume=True`` refuses them); an
interrupted conversion of them leaves nothing behind, so it is simply run again.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib
import json
import math
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loaderx.converter import _progress
from loaderx.errors import (
    CorruptStoreError,
    DatasetError,
    InternalError,
    LimitExceededError,
    LoaderxError,
    LoaderxTypeError,
    LoaderxValueError,
)
from loaderx.intake.directory import (
    MAX_PARTS,
    DirectoryWriter,
    RaggedBatch,
    is_dataset_directory,
    read_manifest,
)
from loaderx.intake.joining import (
    assemble_named,
    discard_parts,
    hold_parts,
    part_path,
    parts_dir,
    shares_chunks,
)
from loaderx.zrecord import MAX_RECORD_BYTES, MAX_RECORDS, Codec

__all__ = ["from_arrow", "DEFAULT_CHUNK_BYTES"]

#: About this many bytes of decoded columns per append: small enough that reading the next
#: batch overlaps writing this one for files of tens of megabytes, large enough that the
#: per-append costs vanish.
DEFAULT_CHUNK_BYTES = 8 << 20
#: Record batches read ahead of the one being written.
_READ_AHEAD = 2
_PANDAS_INDEX = "__index_level_0__"


def _pyarrow(module: str = "pyarrow") -> Any:
    """pyarrow (or one of its modules), imported when a table is converted: it is optional."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DatasetError("from_arrow needs pyarrow: pip install pyarrow") from None


def from_arrow(
    dst: str | os.PathLike[str],
    source: Any,
    *,
    columns: Sequence[str] | None = None,
    codec: Codec | Mapping[str, Codec] = "zstd",
    overwrite: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: bool | None = None,
    checksums: bool = False,
    resume: bool = False,
    append: bool = False,
    group_columns: bool | None = None,
) -> int:
    """Writes the table ``source`` as a dataset directory at ``dst`` and returns its row count.

    ``columns`` picks source columns (top-level names, or ``a.b`` for one field of a struct),
    in that order; the default is every column. ``codec`` (``"raw"``, ``"zstd"``,
    ``"zstd_dict"``) is every column's; ``"zstd"`` compresses where it pays -- columns whose
    first records average under 4 KiB (short strings, scalars, small vectors: decoding a frame
    costs more than copying such a record) and those a trial on their first records shrinks by
    less than 10% are stored raw (see :mod:`loaderx.intake.directory`). A dict
    ``{column: codec}`` sets the codec of the columns it names exactly (the others get
    ``"zstd"``). ``overwrite=True``
    replaces a dataset at ``dst``. ``chunk_bytes`` bounds the decoded bytes of one append
    (and so the memory used: a few times that, plus pyarrow's own). ``progress`` and
    ``checksums`` are as in :func:`loaderx.from_numpy`. ``resume=True`` (Parquet sources)
    writes parts of consecutive files and, run again after an interruption, keeps the parts
    already finished (see "Resuming" in the module docstring). ``append=True`` adds the rows to the
    dataset already at ``dst`` -- the same columns, written with its codecs -- every column
    at once and all or nothing, and returns its new row count (see
    :mod:`loaderx.intake.growing`). ``group_columns=True`` stores the fixed-width columns
    stored raw (numbers, booleans, timestamps, fixed-size lists of them) together in one column
    group, row-major in blocks (see :class:`~loaderx.intake.DirectoryWriter`): a table of many
    narrow columns then takes about the bytes of its values, reads a batch of all of them in one
    native call, and grows in place with one commit point (:mod:`loaderx.intake.appending`);
    not with ``resume=True`` (parts are joined a store per column). The default (None) groups
    them unless ``resume=True``; ``False`` writes a store per column, the layout of manifest
    version 1. See the module docstring for sources and type mapping."""
    pa = _pyarrow()
    if group_columns is not None and group_columns is not False and group_columns is not True:
        raise LoaderxTypeError(f"group_columns must be True, False or None, got "
                               f"{group_columns!r}")
    if group_columns is None:
        group_columns = not resume  # a resumable conversion's parts keep a store per column
    if group_columns and resume:
        raise LoaderxValueError(
            "group_columns=True cannot be combined with resume=True yet: a resumable "
            "conversion joins parts a store per column. Convert every file in one call (rows "
            "then go in place with append=True), or leave group_columns out")
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
        raise DatasetError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
    if isinstance(columns, str):
        raise LoaderxTypeError(f"columns must be a list of names, got the string {columns!r} "
                               f"(write columns=[{columns!r}])")
    if resume is not False and resume is not True:
        raise LoaderxTypeError(f"resume must be True or False, got {resume!r}")
    src = _open_source(pa, source, chunk_bytes)
    plan = _plan(pa, src.schema, columns, src.all_null)
    exact = dict(codec) if isinstance(codec, Mapping) else {}
    unknown = sorted(set(exact) - {leaf.name for leaf in plan})
    if unknown:
        raise DatasetError(f"codec names columns that are not converted: {unknown}; the "
                           f"columns are {[leaf.name for leaf in plan]}")
    options = _Options(columns, codec, chunk_bytes, progress, checksums, src.all_null,
                       group_columns)
    if append:
        from loaderx.intake.growing import arrow_onto

        return arrow_onto(dst, plan, options, overwrite, resume, lambda path, opts: _write(
            path, src, plan, opts, False, {"source": src.kind}))
    if resume:
        if src.kind != "parquet":
            raise LoaderxValueError(
                f"resume=True resumes a conversion of Parquet files (in parts of files); "
                f"{_stream_name(source, src.kind)} is read as one stream. Run it again "
                "without resume "
                "-- an interrupted conversion leaves nothing behind -- or write it as Parquet "
                "files first (pyarrow.dataset.write_dataset)")
        return _resumable(pa, dst, _expand(source), options, overwrite)
    return _write(dst, src, plan, options, overwrite, {"source": src.kind})


@dataclass(frozen=True)
class _Options:
    """What from_arrow was asked, beside the source and the destination."""

    columns: Sequence[str] | None
    codec: Codec | Mapping[str, Codec]
    chunk_bytes: int
    progress: bool | None
    checksums: bool
    #: The whole source's :attr:`_Source.all_null` (a part's plan decides as the whole's did).
    all_null: Callable[[list[Any]], list[bool | None]] | None = field(default=None, compare=False)
    group_columns: bool = False  # from_arrow passes what it resolved

    def digest(self) -> str:
        """What decides the stored bytes (not chunk_bytes or progress), for a resumed run to
        compare with the parts it finds."""
        codec = dict(sorted(self.codec.items())) if isinstance(self.codec, Mapping) \
            else self.codec
        return json.dumps([None if self.columns is None else list(self.columns), codec,
                           self.checksums], sort_keys=True)


def _write(dst: str | os.PathLike[str], src: _Source, plan: list[_Leaf], options: _Options,
           overwrite: bool, extra: dict[str, Any]) -> int:
    """One transaction: every column of ``src`` into the dataset directory ``dst``."""
    codec = options.codec
    exact = dict(codec) if isinstance(codec, Mapping) else {}
    desc = os.fspath(dst)
    with DirectoryWriter(dst, overwrite=overwrite, checksums=options.checksums,
                         codec="zstd" if isinstance(codec, Mapping) else codec,
                         extra=extra, group_columns=options.group_columns) as writer:
        for leaf in plan:
            writer.add_column(leaf.name, leaf.kind, leaf.dtype, leaf.item_shape,
                              extra=leaf.extra, codec=exact.get(leaf.name))
        wanted = list(dict.fromkeys(leaf.fields[0] for leaf in plan))
        with _progress(options.progress, src.rows, desc) as bar, \
                _ReadAhead(src.batches(wanted)) as batches:
            for batch, where in batches:
                start = writer.rows
                writer.append({leaf.name: leaf.convert(batch, start, where) for leaf in plan})
                bar.update(batch.num_rows)
        src.check_end()
        return writer.rows


# -- resuming ------------------------------------------------------------------------------------


#: A resumable conversion's part takes consecutive Parquet files while their sizes add up to at
#: most this many bytes (a file larger than this is a part alone). A kill loses at most the
#: part being written -- under a second of conversion here --, and a part's fixed cost (its
#: stores made, synced and published, then joined: about 10 ms here) is spread over that many
#: bytes, instead of being paid for every file.
RESUME_PART_BYTES = 128 << 20
#: At most this many bytes of fingerprints in a part's record (about 5000 files): its manifest
#: stays small, far below the manifest's limit.
_RESUME_RECORD_BYTES = 1 << 20


def _resumable(pa: Any, dst: str | os.PathLike[str], files: list[str], options: _Options,
               overwrite: bool) -> int:
    """Consecutive Parquet files, up to :data:`RESUME_PART_BYTES` of them, into one part of
    ``dst`` each, named after its first file's index (its record names the files it covers,
    by their fingerprints) -- unless a finished part of an earlier run of the same conversion
    covers them -- then the parts joined into ``dst``. Files that one part would hold, all
    of them, with no finished part to keep, are converted straight into ``dst``."""
    dst = os.path.abspath(os.fspath(dst))
    stats = [os.stat(f) for f in files]
    prints = [_fingerprint(f, options, st) for f, st in zip(files, stats, strict=True)]
    plan_digest = hashlib.sha256(json.dumps(prints).encode()).hexdigest()

    def finished() -> int | None:
        done = read_manifest(dst) if is_dataset_directory(dst) else None
        return done.rows if done is not None and done.extra.get("resume") == plan_digest \
            else None

    if not overwrite and not os.path.lexists(parts_dir(dst)):
        rows = finished()
        if rows is not None:
            return rows  # this very conversion finished already: nothing to touch
    if len(files) > MAX_PARTS:
        raise LimitExceededError(f"resume=True names each part after its first file: "
                                 f"{len(files)} files, at most {MAX_PARTS}; merge files first")
    # One run at a time (another is refused, naming this one), and what dead runs left beside
    # dst -- an interrupted join's links to the parts' chunk files -- is removed first.
    with hold_parts(dst) as durable:
        if os.path.lexists(dst) and not overwrite:
            rows = finished()
            if rows is not None:
                discard_parts(dst)  # what a kill just after publishing left
                return rows  # this very conversion finished already
            raise DatasetError(f"{dst} exists (and is not this conversion, finished); pass "
                               "overwrite=True to replace it")
        kept = _finished_parts(dst, prints)

        def batch(k: int) -> int:
            """The end of the part that starts at file ``k``: the next files up to the
            budget, never into a kept part (so a file changed since an earlier run is
            converted again with its batch, and the parts after it are kept)."""
            end, size, record = k + 1, stats[k].st_size, len(json.dumps(prints[k]))
            while end < len(files) and end not in kept \
                    and size + stats[end].st_size <= RESUME_PART_BYTES \
                    and record + len(json.dumps(prints[end])) + 2 <= _RESUME_RECORD_BYTES:
                size += stats[end].st_size
                record += len(json.dumps(prints[end])) + 2
                end += 1
            return end

        if not kept and batch(0) == len(files):
            # One part would hold everything, and a kill would lose it whole: written
            # straight into dst as one transaction instead (no part, no join).
            src = _parquet_source(pa, files, options.chunk_bytes)
            rows = _write(dst, src, _plan(pa, src.schema, options.columns, options.all_null),
                          options, overwrite, {"source": "parquet", "resume": plan_digest})
            discard_parts(dst)  # parts of earlier runs that no file matches now
            return rows
        names, k = [], 0
        while k < len(files):
            if k in kept:  # finished by an earlier run, from these very files
                names.append(f"{k:05d}")
                k += kept[k]
                continue
            end = batch(k)
            src = _parquet_source(pa, files[k:end], options.chunk_bytes)
            durable()  # <dst>.parts in its parent, before a part is published in it
            _write(part_path(dst, k), src,
                   _plan(pa, src.schema, options.columns, options.all_null), options, True,
                   {"source": "parquet", "resume": {"first": k, "files": prints[k:end]}})
            names.append(f"{k:05d}")
            k = end
        # Parts not named (left by runs that batched otherwise) go with the others, once dst
        # is published.
        return assemble_named(dst, names, overwrite=overwrite, extra={"resume": plan_digest})


def _finished_parts(dst: str, prints: list[str]) -> dict[int, int]:
    """The parts of ``dst`` that earlier runs finished from the files ``prints`` describe:
    ``{first file: files covered}`` for each part whose record names exactly the files at
    those places now, and none of whose chunk files is a published dataset's too."""
    root = parts_dir(dst)
    found: dict[int, int] = {}
    for name in os.listdir(root):
        if len(name) != 5 or not (name.isascii() and name.isdigit()) or int(name) >= len(prints):
            continue
        first, part = int(name), os.path.join(root, name)
        if not is_dataset_directory(part):
            continue
        record = read_manifest(part).extra.get("resume")
        if isinstance(record, str):  # written one part per file (loaderx before batching)
            record = {"first": first, "files": [record]}
        covered = record.get("files") if isinstance(record, dict) \
            and record.get("first") == first else None
        if isinstance(covered, list) and covered \
                and covered == prints[first:first + len(covered)] and not shares_chunks(part):
            found[first] = len(covered)
    return found


def _fingerprint(file: str, options: _Options, st: os.stat_result | None = None) -> str:
    """What a finished part must have been converted from: the file (its real path, inode,
    size, modification and change times: ``st``, or the file's now) and the options that
    decide the stored bytes."""
    st = os.stat(file) if st is None else st
    return json.dumps([os.path.realpath(file), st.st_ino, st.st_size, st.st_mtime_ns,
                       st.st_ctime_ns, options.digest()])


# -- sources -------------------------------------------------------------------------------------


@dataclass
class _Source:
    kind: str  # "parquet", "arrow", "huggingface" (kept in the manifest)
    schema: Any
    rows: int | None
    #: (record batch, where it came from) given the top-level columns wanted (a source that
    #: can project reads only those)
    batches: Callable[[list[str]], Iterator[tuple[Any, str]]]
    check_end: Callable[[], None] = lambda: None
    #: Whether each of the leaves given is null in every row (True), not (False), or None where
    #: that is not known without reading the source twice (a stream): see :func:`_plan`.
    all_null: Callable[[list[Any]], list[bool | None]] = lambda leaves: [None] * len(leaves)


def _open_source(pa: Any, source: Any, chunk_bytes: int) -> _Source:
    if isinstance(source, (str, os.PathLike)) or (
            isinstance(source, (list, tuple)) and source
            and all(isinstance(s, (str, os.PathLike)) for s in source)):
        return _path_source(pa, source, chunk_bytes)
    if type(source).__module__.split(".")[0] == "datasets" and hasattr(source, "with_format"):
        return _huggingface_source(pa, source, chunk_bytes)
    pads = _pyarrow("pyarrow.dataset")
    if isinstance(source, pads.Dataset):
        def scan(wanted: list[str]) -> Iterator[tuple[Any, str]]:
            reader = source.scanner(columns=wanted, batch_size=1 << 14).to_reader()
            for batch in _read(reader, "the dataset"):
                yield from ((b, "the dataset") for b in _slices(batch, chunk_bytes))

        return _Source("arrow", source.schema, None, scan)
    if isinstance(source, pa.RecordBatch):
        source = pa.Table.from_batches([source])
    if isinstance(source, pa.Table):
        src = _reader_source(pa, source.to_reader(), source.num_rows, chunk_bytes, "arrow")
        src.all_null = _table_probe(source)
        return src
    if isinstance(source, pa.RecordBatchReader):
        return _reader_source(pa, source, None, chunk_bytes, "arrow")
    if hasattr(source, "__arrow_c_stream__"):
        try:
            reader = pa.RecordBatchReader.from_stream(source)
        except Exception as e:  # whatever the producer raises
            raise DatasetError(f"cannot read {type(source).__name__} as an Arrow stream: "
                               f"{e}") from None
        rows = len(source) if hasattr(source, "__len__") and _is_frame(source) else None
        return _reader_source(pa, reader, rows, chunk_bytes, "arrow")
    raise LoaderxTypeError(
        f"from_arrow cannot read a {type(source).__module__}.{type(source).__name__}: give "
        "an object with __arrow_c_stream__ (pyarrow Table/RecordBatchReader, polars, DuckDB, "
        "pandas), a pyarrow.dataset.Dataset, a datasets.Dataset, or Parquet paths or globs")


def _is_frame(source: Any) -> bool:
    return type(source).__module__.split(".")[0] in ("polars", "pandas")


def _reader_source(pa: Any, reader: Any, rows: int | None, chunk_bytes: int,
                   kind: str) -> _Source:
    def batches(wanted: list[str]) -> Iterator[tuple[Any, str]]:
        where = "the source"
        for batch in _read(reader, where):
            yield from ((b, where) for b in _slices(batch, chunk_bytes))

    return _Source(kind, reader.schema, rows, batches)


def _read(reader: Any, where: str) -> Iterator[Any]:
    """The record batches of ``reader``, its failures as a CorruptStoreError naming ``where``."""
    it = iter(reader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except LoaderxError:
            raise
        except Exception as e:  # pyarrow's ArrowInvalid, OSError, ...: input it cannot decode
            raise CorruptStoreError(f"{where} cannot be read: {type(e).__name__}: {e}") from None
        yield batch


def _slices(batch: Any, chunk_bytes: int) -> Iterator[Any]:
    """``batch`` in zero-copy slices of about ``chunk_bytes``."""
    n = batch.num_rows
    size = batch.get_total_buffer_size() if n else 0
    if size <= chunk_bytes:
        yield batch
        return
    rows = max(1, int(n * chunk_bytes // size))
    for start in range(0, n, rows):
        yield batch.slice(start, rows)


def _huggingface_source(pa: Any, ds: Any, chunk_bytes: int) -> _Source:
    table = ds.with_format("arrow")[0:0]  # the schema, with Hugging Face's metadata
    schema = table.schema
    classes = {}
    for name, feature in getattr(ds, "features", {}).items():
        names = getattr(feature, "names", None)
        if isinstance(names, list):
            classes[name] = names
    if classes:
        schema = _with_classes(schema, classes)
    if b"huggingface" not in (schema.metadata or {}) and hasattr(ds, "features"):
        with contextlib.suppress(Exception):  # features it cannot describe are only metadata
            schema = _with_features(schema, ds.features.to_dict())
    rows = len(ds)
    size = getattr(ds.data, "nbytes", 0) or 0
    step = max(1, min(1 << 16, int(rows * chunk_bytes // size) if size else 1 << 16))

    def batches(wanted: list[str]) -> Iterator[tuple[Any, str]]:
        for t in ds.select_columns(wanted).with_format("arrow").iter(batch_size=step):
            for b in t.to_batches():
                yield b.replace_schema_metadata(schema.metadata), "the datasets.Dataset"

    src = _Source("huggingface", schema, rows, batches)
    table = getattr(getattr(ds, "data", None), "table", None)
    if isinstance(table, pa.Table):
        whole = _table_probe(table)
        if getattr(ds, "_indices", None) is None:
            src.all_null = whole
        else:  # rows picked from the table: null in all of it is null in them, not conversely
            src.all_null = lambda leaves: [True if n else None for n in whole(leaves)]
    return src


def _with_features(schema: Any, features: Any) -> Any:
    meta = dict(schema.metadata or {})
    meta[b"huggingface"] = json.dumps({"info": {"features": features}}).encode()
    return schema.with_metadata(meta)


def _table_probe(table: Any) -> Callable[[list[Any]], list[bool | None]]:
    """:attr:`_Source.all_null` of a table in memory (or mapped): null counts, no copies."""
    def all_null(leaves: list[Any]) -> list[bool | None]:
        return _null_in_every_row(leaves, table.to_batches(), table.num_rows)

    return all_null


def _null_in_every_row(leaves: list[Any], batches: Iterator[Any] | list[Any],
                       rows: int) -> list[bool | None]:
    if not leaves:
        return []
    if rows == 0:
        return [False] * len(leaves)
    nulls = [0] * len(leaves)
    for b in batches:
        for k, leaf in enumerate(leaves):
            nulls[k] += leaf.array(b).null_count
    return [n == rows for n in nulls]


def _with_classes(schema: Any, classes: dict[str, list[str]]) -> Any:
    meta = dict(schema.metadata or {})
    meta[b"loaderx_classes"] = json.dumps(classes).encode()
    return schema.with_metadata(meta)


_GLOB_CHARS = set("*?[")


def _expand(source: Any) -> list[str]:
    """Parquet paths from paths, directories and globs, each group sorted, no file twice."""
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    files: list[str] = []
    for item in items:
        text = os.fspath(item)
        if _GLOB_CHARS & set(text) and not os.path.exists(text):
            found = sorted(p for p in glob.glob(text, recursive=True) if os.path.isfile(p))
            if not found:
                raise DatasetError(f"{text}: no file matches")
        elif os.path.isdir(text):
            found = sorted(os.path.join(d, f) for d, _, fs in os.walk(text) for f in fs
                           if f.endswith(".parquet"))
            if not found:
                raise DatasetError(f"{text}: a directory without .parquet files")
        elif os.path.isfile(text):
            found = [text]
        else:
            raise FileNotFoundError(2, "no such file or directory", text)
        files.extend(found)
    seen: set[str] = set()
    unique = []
    for f in files:
        key = os.path.realpath(f)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def _parquet_source(pa: Any, files: list[str], chunk_bytes: int) -> _Source:
    pq = _pyarrow("pyarrow.parquet")
    opened = []
    for f in files:
        try:
            pf = pq.ParquetFile(f)
        except Exception as e:  # ArrowInvalid, OSError: not a Parquet file, or a damaged one
            raise CorruptStoreError(f"{f} is not a readable Parquet file: {e}") from None
        opened.append(pf)
    declared = [_check_footer(f, pf) for f, pf in zip(files, opened, strict=True)]
    if any(n < 0 for n in declared) or sum(declared) > MAX_RECORDS * MAX_PARTS:
        bad = next(f for f, n in zip(files, declared, strict=True)
                   if n < 0 or n > MAX_RECORDS * MAX_PARTS)
        raise CorruptStoreError(f"{bad} declares {declared[files.index(bad)]} rows, which "
                                "no table holds: the file is damaged")
    schema = opened[0].schema_arrow
    for f, pf in zip(files[1:], opened[1:], strict=True):
        if not _same_types(pf.schema_arrow, schema):
            raise DatasetError(f"{f}: its columns differ from those of {files[0]} "
                               f"({_schema_diff(pf.schema_arrow, schema)}); every file must "
                               "have the same column types")
    seen = {"rows": 0}

    def batches(wanted: list[str]) -> Iterator[tuple[Any, str]]:
        for f, pf, want in zip(files, opened, declared, strict=True):
            got = 0
            for batch in _read(_scan(pf, f, wanted, chunk_bytes), f):
                got += batch.num_rows
                if got > want:
                    raise CorruptStoreError(f"{f} holds more rows than the {want} its footer "
                                            "declares: the file is damaged")
                yield batch, f
            if got != want:
                raise CorruptStoreError(f"{f} holds {got} rows, its footer declares {want}: "
                                        "the file is damaged (or was cut short)")
            seen["rows"] += got
            pf.close()

    def check_end() -> None:
        if seen["rows"] != sum(declared):  # a bug if reached: batches() checks each file
            raise CorruptStoreError(f"read {seen['rows']} rows of {sum(declared)}")

    return _Source("parquet", schema, sum(declared), batches, check_end,
                   _parquet_probe(opened))


def _parquet_probe(opened: list[Any]) -> Callable[[list[Any]], list[bool | None]]:
    """:attr:`_Source.all_null` from the null counts of the footers' statistics (None where a
    row group has none, or the leaf is not one Parquet column outside a list)."""
    def all_null(leaves: list[Any]) -> list[bool | None]:
        return [one(leaf) for leaf in leaves]

    def one(leaf: Any) -> bool | None:
        path = ".".join(leaf.fields)
        rows = nulls = 0
        for pf in opened:
            md = pf.metadata
            cols = [j for j in range(md.num_columns) if md.schema.column(j).path == path]
            if len(cols) != 1 or md.schema.column(cols[0]).max_repetition_level:
                return None
            for g in range(md.num_row_groups):
                group = md.row_group(g)
                stats = group.column(cols[0]).statistics
                if stats is None or not stats.has_null_count:
                    return None
                nulls += stats.null_count
                rows += group.num_rows
        return rows > 0 and nulls >= rows

    return all_null


def _path_source(pa: Any, source: Any, chunk_bytes: int) -> _Source:
    """Files by path: Parquet, Arrow IPC files (either format, known by their first bytes),
    or a Hugging Face ``save_to_disk`` directory."""
    from loaderx.intake import _arrow_files as af

    if isinstance(source, (str, os.PathLike)) and os.path.isdir(source):
        root = os.fspath(source)
        if af.is_hf_dataset_dict(root):
            raise af.dataset_dict_error(root)
        if af.is_hf_directory(root):
            files, features = af.hf_data_files(root)
            return _ipc_source(pa, files, chunk_bytes, "huggingface", features)
    files = _expand(source)
    kinds = [af.sniff(f) or ("ipc_file" if f.endswith(af.IPC_SUFFIXES) else "parquet")
             for f in files]
    if "parquet" in kinds and len(set(kinds)) > 1:
        ipc = files[next(i for i, k in enumerate(kinds) if k != "parquet")]
        raise DatasetError(f"{files[kinds.index('parquet')]} is Parquet and {ipc} an Arrow "
                           "IPC file: convert Parquet files and Arrow files separately")
    if kinds and kinds[0] != "parquet":
        return _ipc_source(pa, files, chunk_bytes, "arrow_ipc", None, kinds)
    return _parquet_source(pa, files, chunk_bytes)


def _ipc_source(pa: Any, files: list[str], chunk_bytes: int, kind: str,
                features: dict[str, Any] | None, kinds: list[str] | None = None) -> _Source:
    """Arrow IPC files, checked before a batch is decoded (:mod:`loaderx.intake._arrow_files`);
    ``features`` (a Hugging Face directory's ``dataset_info.json``) stand in for schema
    metadata the files lack."""
    from loaderx.intake import _arrow_files as af

    opened = [af.open_ipc(pa, path, kinds[i] if kinds else af.sniff(path) or "ipc_stream",
                          follow=kind != "huggingface")  # resolved and checked: no link now
              for i, path in enumerate(files)]
    schema = opened[0].schema
    for other in opened[1:]:
        if not _same_types(other.schema, schema):
            raise DatasetError(f"{other.path}: its columns differ from those of {files[0]} "
                               f"({_schema_diff(other.schema, schema)}); every file must "
                               "have the same column types")
    if features is not None and b"huggingface" not in (schema.metadata or {}):
        schema = _with_features(schema, features)
    rows = sum(f.rows for f in opened)

    def batches(wanted: list[str]) -> Iterator[tuple[Any, str]]:
        for f in opened:
            for batch in af.ipc_batches(pa, f):
                batch = batch.select(wanted).replace_schema_metadata(schema.metadata)
                yield from ((b, f.path) for b in _slices(batch, chunk_bytes))

    def all_null(leaves: list[Any]) -> list[bool | None]:
        if any(f.compressed for f in opened):  # a second decoding of every batch: not worth it
            return [None] * len(leaves)
        every = (b for f in opened for b in af.ipc_batches(pa, f, full=False))
        return _null_in_every_row(leaves, every, rows)

    return _Source(kind, schema, rows, batches, all_null=all_null)


def _stream_name(source: Any, kind: str) -> str:
    if kind in ("arrow_ipc", "huggingface"):
        return "an Arrow IPC file (or a Hugging Face dataset directory)"
    return f"a {type(source).__name__}"


def _check_footer(file: str, pf: Any) -> int:
    """The rows ``file`` declares, after checking that its footer agrees with itself: the row
    groups add up to the file's count, and a column that is not repeated has one value per
    row of its row group (a repeated one at least one). A footer that contradicts itself
    would make pyarrow read fewer rows than the pages hold, silently."""
    md = pf.metadata
    groups = [md.row_group(i) for i in range(md.num_row_groups)]
    total = sum(g.num_rows for g in groups)
    if total != md.num_rows:
        raise CorruptStoreError(f"{file} declares {md.num_rows} rows, but its row groups "
                                f"declare {total}: the file is damaged")
    repeated = [md.schema.column(j).max_repetition_level > 0 for j in range(md.num_columns)]
    for i, g in enumerate(groups):
        for j in range(g.num_columns):
            values = g.column(j).num_values
            if values < g.num_rows or (values != g.num_rows and not repeated[j]):
                raise CorruptStoreError(
                    f"{file}: row group {i} declares {g.num_rows} rows, its column "
                    f"{md.schema.column(j).path!r} {values} values: the file is damaged")
    return int(md.num_rows)


def _scan(pf: Any, file: str, wanted: list[str], chunk_bytes: int) -> Iterator[Any]:
    """The record batches of one Parquet file, columns decoded on pyarrow's threads, column
    chunks read through a bounded buffer rather than whole: memory is bounded by the batch
    size, not by the file's row groups. (pyarrow's dataset scanner, which reads ahead on
    its own pools, measured no faster here and held several times the memory.)"""
    pq = _pyarrow("pyarrow.parquet")
    reader = pq.ParquetFile(file, buffer_size=_READ_BUFFER, pre_buffer=False)
    return iter(reader.iter_batches(batch_size=_batch_rows(pf, chunk_bytes), columns=wanted,
                                    use_threads=True))


#: Bytes read at once from a Parquet column chunk.
_READ_BUFFER = 4 << 20


def _batch_rows(pf: Any, chunk_bytes: int) -> int:
    """Rows per record batch of about ``chunk_bytes`` decoded, from the footer's sizes."""
    md = pf.metadata
    rows = md.num_rows
    if rows <= 0:
        return 1 << 16
    size = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    per_row = max(1.0, size / rows)
    return max(1, min(1 << 20, int(chunk_bytes // per_row)))


class _ReadAhead:
    """Iterates ``items`` on a thread of its own, up to :data:`_READ_AHEAD` items ahead, so that
    reading (Parquet decoding, a producer's work) overlaps with writing. Its exceptions are
    raised here; leaving the ``with`` early stops it."""

    _END = object()

    def __init__(self, items: Iterator[Any]) -> None:
        self._items = items
        self._queue: queue.Queue[Any] = queue.Queue(_READ_AHEAD)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loaderx-read-ahead",
                                        daemon=True)

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._items:
                if not self._put((item, None)):
                    return
        except BaseException as e:  # handed to the consumer, raised there
            self._put((None, e))
            return
        self._put((self._END, None))

    def __enter__(self) -> Iterator[Any]:
        self._thread.start()
        return self._iter()

    def _iter(self) -> Iterator[Any]:
        while True:
            item, error = self._queue.get()
            if error is not None:
                raise error
            if item is self._END:
                return
            yield item

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# -- the type mapping ----------------------------------------------------------------------------


@dataclass
class _Leaf:
    """One column of the dataset directory: where it sits in the source (top-level field and
    struct fields below it), what it becomes, and how a batch's array becomes its records."""

    name: str
    path: tuple[int, ...]
    kind: str
    dtype: np.dtype
    item_shape: tuple[int, ...]
    extra: dict[str, Any]
    to_records: Callable[[Any], Any]
    checks_nulls: bool = True
    fields: tuple[str, ...] = field(default_factory=tuple)
    #: The refusal of a null in this column, given its row and where (None: :func:`_null_error`).
    null_error: Callable[[int, str], DatasetError] | None = None
    #: A struct field's fellow columns, named in its null error as the columns to keep.
    keep: tuple[str, ...] | None = None
    #: A struct field of a type not converted: refused if chosen (:func:`_settle_nulls`).
    refused: DatasetError | None = None

    def array(self, batch: Any) -> Any:
        arr = batch.column(self.fields[0])  # by name: a Parquet read projects the columns
        extension = _pyarrow().ExtensionArray
        for i in self.path[1:]:
            if isinstance(arr, extension):  # an extension type stored as a struct
                arr = arr.storage
            arr = arr.flatten()[i]  # the struct's slice and its nulls applied to the field
        return arr

    def convert(self, batch: Any, start: int, where: str) -> Any:
        arr = self.array(batch)
        # Before the first row that is null, a null the rows' validity does not show (in a
        # dictionary's values, a list's or a tensor's elements) is found by converting them.
        first = _first_null(arr) if self.checks_nulls and arr.null_count else None
        try:
            records = self.to_records(arr if first is None else arr.slice(0, first))
        except _NullValue as e:
            raise _null_error(self.name, start + e.row, where, e.what, e.fill,
                              self.keep) from None
        except LoaderxError:
            raise
        except Exception as e:  # pyarrow's errors (a type it cannot take apart, ...)
            raise DatasetError(f"column {self.name!r} ({arr.type}) could not be converted"
                               f"{_in(where)}: {type(e).__name__}: {e}; cast it to a plainer "
                               "type first, or leave it out with columns=") from None
        if first is not None:
            if self.null_error is not None:
                raise self.null_error(start + first, where)
            raise _null_error(self.name, start + first, where, "a null", keep=self.keep)
        if self.kind == "ragged":
            _check_record_sizes(records, self, start, where)
        return records


def _null_error(name: str, row: int, where: str, what: str,
                fill: str = "pyarrow.compute.fill_null, polars fill_null, pandas fillna",
                keep: Sequence[str] | None = None) -> DatasetError:
    return DatasetError(
        f"column {name!r} has {what} at row {row}{_in(where)}: nulls are not converted. Fill "
        f"them first ({fill}), drop those rows, or leave the column out with columns="
        f"{_listing(keep) if keep is not None else ''}")


def _listing(names: Sequence[str], most: int = 30) -> str:
    """``names`` as the list to pass as ``columns=`` (cut short past ``most``)."""
    shown = ", ".join(repr(n) for n in names[:most])
    return f"[{shown}{', ...' if len(names) > most else ''}]"


class _NullValue(DatasetError):
    """A null that a row's validity does not show -- in a dictionary's values, a list's or a
    tensor's elements -- at ``row`` of the batch (raised with the column's name and the row in
    the source by :meth:`_Leaf.convert`); ``fill`` says how to fill it."""

    def __init__(self, row: int, what: str, fill: str) -> None:
        super().__init__(f"{what} at row {row} of the batch")
        self.row = row
        self.what = what
        self.fill = fill


def _first_null(arr: Any) -> int:
    pc = _pyarrow("pyarrow.compute")
    return int(pc.index(pc.is_null(arr), True).as_py())


def _in(where: str) -> str:
    return f" (in {where})" if where and where != "the source" else ""


def _check_record_sizes(records: RaggedBatch, leaf: _Leaf, start: int, where: str) -> None:
    b = np.asarray(records.bounds, dtype=np.int64)
    if len(b) < 2:
        return
    row_bytes = math.prod(leaf.item_shape) * leaf.dtype.itemsize
    sizes = np.diff(b) * row_bytes
    big = int(np.argmax(sizes))
    if int(sizes[big]) > MAX_RECORD_BYTES:
        raise LimitExceededError(
            f"column {leaf.name!r}, row {start + big}{_in(where)}: a record of {int(sizes[big])} "
            f"bytes, over the {MAX_RECORD_BYTES}-byte record limit; split such values over "
            "several rows, or leave the column out with columns=")


def _plan(pa: Any, schema: Any, columns: Sequence[str] | None,
          all_null: Callable[[list[Any]], list[bool | None]] | None = None) -> list[_Leaf]:
    """The leaf columns of ``schema`` to convert, in order, each with its mapping; refusals are
    raised here, before anything is written.

    ``all_null`` (the source's :attr:`_Source.all_null`) is asked about struct fields: the path
    of a Hugging Face Image or Audio that is null in every row is left out (unless ``columns``
    names it), and any other field null in every row is refused here, naming the columns to
    keep."""
    meta = schema.metadata or {}
    classes = _class_names(meta)
    media = _media_features(meta)
    index_cols = _pandas_index_columns(meta)
    leaves: list[_Leaf] = []
    for i, f in enumerate(schema):
        # Only the fields asked for are mapped: a column left out is never refused.
        if columns is None and f.name in index_cols:
            continue
        if columns is not None and not any(c == f.name or c.startswith(f.name + ".")
                                           for c in columns):
            continue
        storage = _media_storage(pa, f.type) if f.name in media else None
        if storage is not None:
            leaves.extend(_media_leaves(pa, f, i, media[f.name], storage))
            continue
        leaves.extend(_map_field(pa, f.name, f.type, (i,), (f.name,), classes))
    if columns is None:
        chosen = [leaf for leaf in leaves if leaf.fields[0] not in index_cols]
    else:
        chosen = []
        for name in columns:
            picked = [leaf for leaf in leaves if leaf.name == name or leaf.fields[0] == name
                      or leaf.name.startswith(name + ".")]
            if not picked:
                owner = name.rsplit(".", 1)[0]
                hint = (f" ({owner!r} is a Hugging Face {media[owner]['_type']}: its bytes are "
                        f"the column {owner!r}, its paths {owner + '.path'!r})"
                        if owner in media and name.endswith(".bytes") else "")
                raise DatasetError(f"columns names {name!r}, which the source does not have; "
                                   f"it has {', '.join(repr(n) for n in schema.names)}{hint}")
            chosen.extend(p for p in picked if p not in chosen)
    names: dict[str, str] = {}
    for leaf in chosen:
        if leaf.name in names:
            raise DatasetError(f"two source columns become column {leaf.name!r} (a struct "
                               "field flattened onto a column of that name, or a name given "
                               "twice): rename one before converting")
        names[leaf.name] = leaf.name
    return _settle_nulls(chosen, columns, all_null)


def _settle_nulls(chosen: list[_Leaf], columns: Sequence[str] | None,
                  all_null: Callable[[list[Any]], list[bool | None]] | None) -> list[_Leaf]:
    """What :func:`_plan` does with the struct fields that are null in every row (and those of a
    type it does not convert: refused, the null type as null in every row)."""
    for leaf in chosen:
        if leaf.refused is not None and leaf.extra["arrow_type"] != "null":
            raise leaf.refused
    fields = [leaf for leaf in chosen if len(leaf.fields) > 1 and leaf.refused is None]
    answers = all_null(fields) if all_null is not None and fields else []
    empty = {id(leaf) for leaf, answer in zip(fields, answers, strict=True) if answer}
    kept = [leaf for leaf in chosen if id(leaf) not in empty or leaf.checks_nulls
            or (columns is not None and leaf.name in columns)]  # a media path named: kept
    for leaf in kept:
        if len(leaf.fields) > 1 and leaf.checks_nulls:
            leaf.keep = tuple(other.name for other in kept if other is not leaf)
    for leaf in kept:
        if leaf.refused is not None or (id(leaf) in empty and leaf.checks_nulls):
            if leaf.null_error is not None:
                raise leaf.null_error(0, "")
            others = leaf.keep or ()
            raise DatasetError(
                f"column {leaf.name!r} is null in every row; leave it out with columns="
                f"{_listing(others)}" if others else
                f"column {leaf.name!r} is null in every row, and the only column: nothing to "
                "convert")
    return kept


#: Hugging Face features stored as ``struct<bytes: binary, path: string>``, and the
#: ``encoded`` each is marked with (as image folders mark their images).
_MEDIA = {"Image": "image", "Audio": "audio", "Video": "video", "Pdf": "pdf"}


def _media_features(meta: dict[bytes, bytes]) -> dict[str, dict[str, Any]]:
    """The top-level Image / Audio (/ Video / Pdf) features of Hugging Face's metadata."""
    try:
        if b"huggingface" not in meta:
            return {}
        features = json.loads(meta[b"huggingface"]).get("info", {}).get("features", {})
        return {name: feat for name, feat in features.items()
                if isinstance(feat, dict) and feat.get("_type") in _MEDIA}
    except (ValueError, AttributeError, TypeError, RecursionError):
        return {}  # metadata we cannot read is only metadata


def _media_storage(pa: Any, typ: Any) -> tuple[int, int] | None:
    """The positions of ``bytes`` (binary) and ``path`` (string) in a media feature's struct,
    or None for any other type (then mapped as any struct is)."""
    t = pa.types
    if not t.is_struct(typ) or typ.num_fields != 2:
        return None
    names = [typ.field(j).name for j in range(2)]
    if sorted(names) != ["bytes", "path"]:
        return None
    jb, jp = names.index("bytes"), names.index("path")
    b, p = typ.field(jb).type, typ.field(jp).type
    if not (t.is_binary(b) or t.is_large_binary(b) or t.is_binary_view(b)) or \
            not (t.is_string(p) or t.is_large_string(p) or t.is_string_view(p)):
        return None
    return jb, jp


def _media_leaves(pa: Any, f: Any, i: int, feature: dict[str, Any],
                  storage: tuple[int, int]) -> list[_Leaf]:
    """A Hugging Face Image (Audio, ...) as its encoded bytes, the column ``f.name`` (ragged
    ``uint8``, as image folders store images), and its paths, ``f.name + ".path"`` (text;
    ``""`` where a row has none)."""
    jb, jp = storage
    kind = _MEDIA[feature["_type"]]
    t = pa.types
    b, p = f.type.field(jb).type, f.type.field(jp).type
    described = {k: v for k, v in feature.items()
                 if k in ("_type", "mode", "decode", "sampling_rate", "mono")
                 and (v is None or isinstance(v, (str, int, float, bool)))}
    name = f.name

    def no_bytes(row: int, where: str) -> DatasetError:
        return DatasetError(
            f"column {name!r} (a Hugging Face {feature['_type']}) has no bytes at row "
            f"{row}{_in(where)}: no {kind} there, or only the path of a file outside the "
            f"table. Embed the files first (Dataset.save_to_disk(dir) embeds them: convert "
            f"dir), drop those rows, or leave the column out with columns=")

    image = _Leaf(name, (i, jb), "ragged", np.dtype(np.uint8), (),
                  {"arrow_type": str(f.type), "encoded": kind, "huggingface": described},
                  _binary(pa.large_binary() if t.is_binary_view(b) else None),
                  fields=(name, "bytes"), null_error=no_bytes)
    paths = _Leaf(f"{name}.path", (i, jp), "ragged", np.dtype(np.uint8), (),
                  {"arrow_type": str(p), "string": True,
                   "path": f"the path datasets kept with each {kind} ('' where none)"},
                  _null_as_empty(pa.large_string() if t.is_string_view(p) else None),
                  checks_nulls=False, fields=(name, "path"))
    return [image, paths]


def _null_as_empty(cast_to: Any) -> Callable[[Any], RaggedBatch]:
    then = _binary(cast_to)

    def convert(arr: Any) -> RaggedBatch:
        if arr.null_count:
            arr = _pyarrow("pyarrow.compute").fill_null(arr, "")
        return then(arr)

    return convert


def _class_names(meta: dict[bytes, bytes]) -> dict[str, list[str]]:
    """ClassLabel names from Hugging Face's schema metadata (or our own record of them)."""
    found: dict[str, list[str]] = {}
    try:
        if b"loaderx_classes" in meta:
            found.update(json.loads(meta[b"loaderx_classes"]))
        elif b"huggingface" in meta:
            features = json.loads(meta[b"huggingface"]).get("info", {}).get("features", {})
            for name, feat in features.items():
                if isinstance(feat, dict) and feat.get("_type") == "ClassLabel" and \
                        isinstance(feat.get("names"), list):
                    found[name] = [str(n) for n in feat["names"]]
    except (ValueError, AttributeError, TypeError, RecursionError):
        return {}  # metadata we cannot read is only metadata
    return found


def _pandas_index_columns(meta: dict[bytes, bytes]) -> set[str]:
    try:
        cols = json.loads(meta[b"pandas"]).get("index_columns", []) if b"pandas" in meta else []
    except (ValueError, AttributeError, TypeError):
        return set()
    return {c for c in cols if isinstance(c, str)}


class _Refused(DatasetError):
    """A type :func:`_map_type` does not convert (a struct's field is refused only if chosen)."""


def _refuse(name: str, typ: Any, fix: str) -> DatasetError:
    return _Refused(f"column {name!r} has the Arrow type {typ}, which loaderx does not "
                    f"convert: {fix}")


def _never(arr: Any) -> Any:
    raise InternalError("a refused column was converted")


def _map_field(pa: Any, name: str, typ: Any, path: tuple[int, ...], fields: tuple[str, ...],
               classes: dict[str, list[str]]) -> list[_Leaf]:
    t = pa.types
    extra: dict[str, Any] = {"arrow_type": str(typ)}
    if t.is_struct(typ):
        out = []
        for j in range(typ.num_fields):
            child = typ.field(j)
            try:
                out.extend(_map_field(pa, f"{name}.{child.name}", child.type, path + (j,),
                                      fields + (child.name,), classes))
            except _Refused as e:  # refused only if chosen: columns= may leave it out
                out.append(_Leaf(f"{name}.{child.name}", path + (j,), "dense",
                                 np.dtype(np.uint8), (), {"arrow_type": str(child.type)},
                                 _never, fields=fields + (child.name,), refused=e))
        if not out:
            raise _refuse(name, typ, "a struct without fields holds nothing; leave it out "
                          "with columns=")
        return out
    decode: Callable[[Any], Any] | None = None
    if t.is_dictionary(typ):
        decode = _dictionary_decode
        typ = typ.value_type
        extra["decoded_from"] = "dictionary"
    if isinstance(typ, pa.BaseExtensionType) and not isinstance(typ, pa.FixedShapeTensorType):
        storage = typ.storage_type
        if t.is_struct(storage) and decode is not None:
            raise _refuse(name, extra["arrow_type"], "decode the dictionary first "
                          "(DictionaryArray.dictionary_decode), or leave it out with columns=")
        inner = _map_field(pa, name, storage, path, fields, classes)
        for leaf in inner:
            if leaf.path == path:  # the storage itself
                leaf.extra = {**leaf.extra, **extra, "extension": typ.extension_name,
                              "storage_type": str(storage)}
                leaf.to_records = _decoded(_storage, leaf.to_records)
                if decode is not None:  # a dictionary of extension values: decoded first
                    leaf.to_records = _decoded(decode, leaf.to_records)
            else:  # a field of a struct storage, which _Leaf.array reaches through the storage
                leaf.extra = {"extension": typ.extension_name, "storage_type": str(storage),
                              **leaf.extra}
        return inner
    kind, dtype, shape, to_records, more = _map_type(pa, name, typ)
    extra.update(more)
    if fields[-1] in classes and len(fields) == 1 and dtype.kind in "iu" and kind == "dense":
        extra["classes"] = classes[fields[-1]]
    if decode is not None:
        to_records = _decoded(decode, to_records, "a null in its dictionary's values",
                              "pyarrow.compute.fill_null on the decoded values: "
                              "column.dictionary_decode()")
    return [_Leaf(name, path, kind, dtype, shape, extra, to_records, fields=fields)]


def _decoded(decode: Callable[[Any], Any], then: Callable[[Any], Any],
             what: str = "a null", fill: str = "pyarrow.compute.fill_null on the values"
             ) -> Callable[[Any], Any]:
    """``decode`` (a dictionary's values taken, an extension's storage), its result checked for
    nulls -- a dictionary's values may hold nulls that its indices' validity does not show --,
    then ``then``."""
    def convert(arr: Any) -> Any:
        out = decode(arr)
        if out.null_count:
            raise _NullValue(_first_null(out), what, fill)
        return then(out)

    return convert


def _dictionary_decode(arr: Any) -> Any:
    pa = _pyarrow()
    values = arr.dictionary
    if pa.types.is_string_view(values.type):  # pyarrow 26 cannot take() from views
        values = values.cast(pa.large_string())
    elif pa.types.is_binary_view(values.type):
        values = values.cast(pa.large_binary())
    return values.take(arr.indices)


def _storage(arr: Any) -> Any:
    return arr.storage


def _numpy_dtype(pa: Any, name: str, typ: Any) -> np.dtype | None:
    t = pa.types
    if t.is_boolean(typ):
        return np.dtype(np.bool_)
    if t.is_integer(typ) or t.is_floating(typ):
        return np.dtype(typ.to_pandas_dtype())
    return None


_TEMPORAL_FIX = "cast it to int64 or to a string first"


def _map_type(pa: Any, name: str, typ: Any) -> tuple[str, np.dtype, tuple[int, ...],
                                                      Callable[[Any], Any], dict[str, Any]]:
    """(kind, dtype, item_shape, array -> records, extra) of a non-struct Arrow type."""
    t = pa.types
    scalar = _numpy_dtype(pa, name, typ)
    if scalar is not None:
        if scalar == np.bool_:
            return "dense", scalar, (), _bools, {}
        return "dense", scalar, (), _numbers, {}
    temporal = _temporal(pa, name, typ)
    if temporal is not None:
        dtype, to_records, more = temporal
        return "dense", dtype, (), to_records, more
    if t.is_fixed_size_binary(typ):
        k = typ.byte_width
        return "dense", np.dtype(np.uint8), (k,), _fixed_binary(k), {}
    if isinstance(typ, pa.FixedShapeTensorType):
        value = _numpy_dtype(pa, name, typ.value_type)
        if value is None or value == np.bool_:
            raise _refuse(name, typ, "tensors of numbers are converted; cast the values")
        shape = tuple(int(d) for d in typ.shape)
        perm = [int(d) for d in typ.permutation or range(len(shape))]
        if perm != list(range(len(shape))):
            # pyarrow itself does not agree on what a permutation means: to_numpy_ndarray()
            # of permutation [2, 0, 1] gives overlapping strides, and from_numpy_ndarray() of
            # its result another permutation, so no reading of the values can be checked.
            raise _refuse(name, typ, f"its permutation {perm} (values stored in the order of "
                          f"shape {list(shape)}, read as another layout) is not converted; "
                          "store the tensors in row-major order first "
                          "(FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(x)) "
                          "of the layout you mean), or convert the storage (column.storage, "
                          "a fixed_size_list), or leave it out with columns=")
        more = {"dim_names": list(typ.dim_names)} if typ.dim_names else {}
        return "dense", value, shape, _tensor(shape), more
    if t.is_fixed_size_list(typ):
        value, shape = _fixed_lists(pa, name, typ)
        return "dense", value, shape, _fixed_list_values(shape), {}
    if t.is_list(typ) or t.is_large_list(typ) or t.is_list_view(typ) or \
            t.is_large_list_view(typ):
        inner = typ.value_type
        if t.is_fixed_size_list(inner):
            value, shape = _fixed_lists(pa, name, inner)
        else:
            scalar = _numpy_dtype(pa, name, inner)
            if scalar is None or scalar == np.bool_:
                raise _refuse(name, typ, _list_fix(pa, inner))
            value, shape = scalar, ()
        view = t.is_list_view(typ) or t.is_large_list_view(typ)
        return "ragged", value, shape, _list_views(shape) if view else _lists(shape), {}
    if t.is_string(typ) or t.is_large_string(typ) or t.is_string_view(typ):
        cast_to = pa.large_string() if t.is_string_view(typ) else None
        return "ragged", np.dtype(np.uint8), (), _binary(cast_to), {"string": True}
    if t.is_binary(typ) or t.is_large_binary(typ) or t.is_binary_view(typ):
        cast_to = pa.large_binary() if t.is_binary_view(typ) else None
        return "ragged", np.dtype(np.uint8), (), _binary(cast_to), {}
    if t.is_decimal(typ):
        raise _refuse(name, typ, "cast it to float64 (pyarrow.compute.cast(col, "
                      "pyarrow.float64())) or to strings first")
    if t.is_null(typ):
        raise _refuse(name, typ, "the column holds only nulls; leave it out with columns=")
    if t.is_map(typ):
        raise _refuse(name, typ, "encode each map (e.g. as JSON strings) or split it into "
                      "key and value list columns first")
    if t.is_union(typ):
        raise _refuse(name, typ, "split the union into one column per member type first")
    raise _refuse(name, typ, "cast it to a number, a string or binary first, or leave it "
                  "out with columns=")


def _list_fix(pa: Any, inner: Any) -> str:
    t = pa.types
    if t.is_string(inner) or t.is_large_string(inner) or t.is_string_view(inner) or \
            t.is_binary(inner) or t.is_large_binary(inner):
        return ("a list of strings or bytes per row is not converted; join each list into one "
                "string (e.g. JSON), or explode the lists into rows, or leave it out with "
                "columns=")
    if t.is_boolean(inner):
        return "cast the booleans to uint8 first (pyarrow.compute.cast)"
    if t.is_list(inner) or t.is_large_list(inner):
        return ("lists of variable-length lists are not converted; flatten them into one list "
                "per row with a second column of lengths, or leave it out with columns=")
    return "lists of numbers (or of fixed-size lists of numbers) are converted; cast the values"


def _fixed_lists(pa: Any, name: str, typ: Any) -> tuple[np.dtype, tuple[int, ...]]:
    shape = []
    inner = typ
    while pa.types.is_fixed_size_list(inner):
        shape.append(int(inner.list_size))
        inner = inner.value_type
    value = _numpy_dtype(pa, name, inner)
    if value is None or value == np.bool_:
        raise _refuse(name, typ, "fixed-size lists of numbers are converted; cast the values "
                      "to a numeric type first")
    return value, tuple(shape)


def _temporal(pa: Any, name: str, typ: Any) -> tuple[np.dtype, Callable[[Any], Any],
                                                     dict[str, Any]] | None:
    t = pa.types
    if t.is_timestamp(typ):
        more = {"tz": typ.tz} if typ.tz else {}
        return np.dtype(f"datetime64[{typ.unit}]"), _as_int64(f"datetime64[{typ.unit}]"), more
    if t.is_date32(typ):
        return np.dtype("datetime64[D]"), _as_int64("datetime64[D]", widen=True), {}
    if t.is_date64(typ):
        return np.dtype("datetime64[ms]"), _as_int64("datetime64[ms]"), {}
    if t.is_duration(typ):
        return np.dtype(f"timedelta64[{typ.unit}]"), _as_int64(f"timedelta64[{typ.unit}]"), {}
    if t.is_time32(typ) or t.is_time64(typ):
        return (np.dtype(f"timedelta64[{typ.unit}]"),
                _as_int64(f"timedelta64[{typ.unit}]", widen=t.is_time32(typ)),
                {"time_of_day": True})
    if t.is_interval(typ):
        raise _refuse(name, typ, _TEMPORAL_FIX)
    return None


# -- array -> records ----------------------------------------------------------------------------


def _numbers(arr: Any) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=True)


def _bools(arr: Any) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)


def _as_int64(dtype: str, widen: bool = False) -> Callable[[Any], np.ndarray]:
    def convert(arr: Any) -> np.ndarray:
        pa = _pyarrow()
        width = pa.int32() if widen else pa.int64()
        ints = arr.view(width).to_numpy(zero_copy_only=True)
        return (ints.astype(np.int64) if widen else ints).view(dtype)

    return convert


def _fixed_binary(k: int) -> Callable[[Any], np.ndarray]:
    def convert(arr: Any) -> np.ndarray:
        n = len(arr)
        data = arr.buffers()[1]
        if data is None or n == 0:
            return np.empty((0, k), np.uint8)
        return np.frombuffer(data, np.uint8, count=n * k, offset=arr.offset * k).reshape(n, k)

    return convert


_FILL_ELEMENTS = ("pyarrow.compute.fill_null on the flattened values, rebuilt with "
                  "FixedSizeListArray.from_arrays / ListArray.from_arrays")


def _tensor(shape: tuple[int, ...]) -> Callable[[Any], np.ndarray]:
    """A fixed-shape tensor without a permutation (a permuted one is refused): its storage, a
    fixed-size list, holds each tensor's values in row-major order, nulls in them refused."""
    size = math.prod(shape)

    def convert(arr: Any) -> np.ndarray:
        values, nulls = _nested(arr.storage, (size,), 0)
        if nulls is not None:
            raise _NullValue(int(np.flatnonzero(nulls)[0]), "a null tensor element",
                             _FILL_ELEMENTS)
        return values.reshape(len(arr), *shape)

    return convert


def _fixed_list_values(shape: tuple[int, ...]) -> Callable[[Any], np.ndarray]:
    def convert(arr: Any) -> np.ndarray:
        values, nulls = _nested(arr, shape, 0)
        if nulls is not None:
            row = int(np.flatnonzero(nulls)[0])
            raise _NullValue(row, f"a null list element (at depth {nulls[row]})", _FILL_ELEMENTS)
        return values

    return convert


def _nested(values: Any, shape: tuple[int, ...], depth: int) -> tuple[np.ndarray,
                                                                     np.ndarray | None]:
    """The elements of ``values`` (each ``shape``-nested fixed-size lists of numbers) as
    ``(len(values), *shape)``, and -- None where nothing is null -- the depth of each element's
    shallowest null: ``depth`` for the element itself, one more a level down, 0 for none.
    Every level is checked in full, under a null list too (which flatten() would drop, and
    with it the mapping of values to rows); the numbers under a null are left as their bytes,
    for the caller to refuse (or, in a list view, to leave out)."""
    pc = _pyarrow("pyarrow.compute")
    nulls: np.ndarray | None = None
    level, per = values, 1
    for d in range(len(shape) + 1):
        if d:
            # The values of the slice, null lists kept in place (flatten() drops them).
            level = level.values.slice(level.offset * shape[d - 1], len(level) * shape[d - 1])
            per *= shape[d - 1]
        if level.null_count:
            hit = pc.is_null(level).to_numpy(zero_copy_only=False).reshape(-1, per).any(axis=1)
            if nulls is None:
                nulls = np.zeros(len(values), np.int64)
            nulls[(nulls == 0) & hit] = depth + d
    if level.null_count:  # the numbers under the nulls, without the validity (no float cast)
        level = _pyarrow().Array.from_buffers(level.type, len(level), [None, level.buffers()[1]],
                                              offset=level.offset)
    return level.to_numpy(zero_copy_only=False).reshape(-1, *shape), nulls


def _first_null_row(nulls: np.ndarray | None, bounds: np.ndarray) -> None:
    """Raises :class:`_NullValue` for the first list (``bounds[i]..bounds[i+1]`` its elements)
    that holds a null element, if one does."""
    if nulls is None or not nulls.any():
        return
    j = int(np.flatnonzero(nulls)[0])
    row = int(np.searchsorted(bounds, j, side="right")) - 1  # empty lists skipped
    raise _NullValue(row, f"a null list element (at depth {nulls[j]})", _FILL_ELEMENTS)


def _lists(shape: tuple[int, ...]) -> Callable[[Any], RaggedBatch]:
    def convert(arr: Any) -> RaggedBatch:
        offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        bounds = offsets - offsets[0]
        flat, nulls = _nested(arr.flatten(), shape, 1)  # offset-aware: the slice's values only
        _first_null_row(nulls, bounds)
        return RaggedBatch(flat, bounds)

    return convert


def _list_views(shape: tuple[int, ...]) -> Callable[[Any], RaggedBatch]:
    """List views may point anywhere in their values (out of order, overlapping): each list's
    elements are gathered into place (pyarrow 26's cast to a list gets the offsets wrong).
    Only the elements some list takes are checked for nulls: the values may hold others."""
    def convert(arr: Any) -> RaggedBatch:
        starts = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        sizes = arr.sizes.to_numpy(zero_copy_only=False).astype(np.int64)
        values, nulls = _nested(arr.values, shape, 1)
        bounds = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=bounds[1:])
        picks = np.repeat(starts - bounds[:-1], sizes) + np.arange(bounds[-1])
        _first_null_row(None if nulls is None else nulls[picks], bounds)
        return RaggedBatch(values[picks], bounds)

    return convert


def _binary(cast_to: Any) -> Callable[[Any], RaggedBatch]:
    def convert(arr: Any) -> RaggedBatch:
        if cast_to is not None:
            arr = arr.cast(cast_to)
        pa = _pyarrow()
        large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
        width = np.int64 if large else np.int32
        n = len(arr)
        bufs = arr.buffers()
        if n == 0:
            return RaggedBatch(np.empty(0, np.uint8), np.zeros(1, np.int64))
        offsets = np.frombuffer(bufs[1], width, count=n + 1,
                                offset=arr.offset * np.dtype(width).itemsize)
        data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else \
            np.empty(0, np.uint8)
        return RaggedBatch(data, offsets)

    return convert


def _same_types(a: Any, b: Any) -> bool:
    return a.names == b.names and all(x.type == y.type for x, y in zip(a, b, strict=True))


def _schema_diff(a: Any, b: Any) -> str:
    if a.names != b.names:
        return f"columns {a.names} instead of {b.names}"
    for x, y in zip(a, b, strict=True):
        if x.type != y.type:
            return f"column {x.name!r} is {x.type}, not {y.type}"
    return "same types"
