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
a glob (``data/*.parquet``, ``**`` allowed), or a list of those, read in sorted order.
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
other extension types                  mapped by their storage type
=====================================  ==========================================================

Refused, with a DatasetError naming the column, its type and the fix: **nulls** anywhere (a
null value, list or element: fill them first -- ``pyarrow.compute.fill_null``, polars
``fill_null``, pandas ``fillna`` -- or drop the rows, or leave the column out with
``columns=``), decimals (cast to float64 or to strings), lists of strings or of binary, lists
of lists, maps, unions, the null type, variable-shape tensors. Nothing is written then.

Hugging Face ``ClassLabel`` names (in the table's ``huggingface`` metadata, which Parquet files
of the Hub carry too) are kept as ``"classes"``; the index columns pandas adds
(``__index_level_0__``) are left out unless ``columns=`` names them.

Parquet files are checked against what their footers declare: a file that holds another number
of rows than it says, or cannot be decoded, is a CorruptStoreError naming it, and nothing is
written. Every file must have the same column types as the first.

A conversion is one transaction (:class:`~loaderx.intake.directory.DirectoryWriter`): when it
fails or is killed, nothing is left at ``dst``; running it again gives exactly the dataset an
uninterrupted run gives (``overwrite=True`` replaces a finished one).

**Resuming.** A long conversion of many Parquet files need not start over after a kill:
``from_arrow(dst, "data/*.parquet", resume=True)`` converts file ``k`` into part ``k``
(``<dst>.parts/0000k``, each published whole in one rename), then joins the parts into ``dst``
(:mod:`loaderx.intake.joining`). Run again after an interruption, it keeps every part that
an earlier run finished from the same file -- same real path, inode, size, modification and
change times -- with the same ``columns``, ``codec`` and ``checksums``, and converts the
others (the one the kill cut short is rewritten from its start); a finished conversion run again
returns its row count and writes nothing. Every file is checked before any part is written, as
without resume. The parts are then joined into one store per column without copying a record
(:func:`loaderx.intake.joining.assemble`), so the result reads as one conversion's. Sources
other than Parquet files are one stream and are not resumed (``resume=True`` refuses them); an
interrupted conversion of them leaves nothing behind, so it is simply run again.
"""

from __future__ import annotations

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
    assemble,
    discard_parts,
    part_path,
    parts_dir,
    shares_chunks,
)
from loaderx.zrecord import MAX_RECORD_BYTES, MAX_RECORDS, Codec

__all__ = ["from_arrow", "DEFAULT_CHUNK_BYTES"]

#: About this many bytes of decoded columns per append.
DEFAULT_CHUNK_BYTES = 32 << 20
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
    writes one part per file and, run again after an interruption, keeps the parts already
    finished (see "Resuming" in the module docstring). See the module docstring for sources
    and type mapping."""
    pa = _pyarrow()
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
        raise DatasetError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
    if isinstance(columns, str):
        raise LoaderxTypeError(f"columns must be a list of names, got the string {columns!r} "
                               f"(write columns=[{columns!r}])")
    if resume is not False and resume is not True:
        raise LoaderxTypeError(f"resume must be True or False, got {resume!r}")
    src = _open_source(pa, source, chunk_bytes)
    plan = _plan(pa, src.schema, columns)
    exact = dict(codec) if isinstance(codec, Mapping) else {}
    unknown = sorted(set(exact) - {leaf.name for leaf in plan})
    if unknown:
        raise DatasetError(f"codec names columns that are not converted: {unknown}; the "
                           f"columns are {[leaf.name for leaf in plan]}")
    options = _Options(columns, codec, chunk_bytes, progress, checksums)
    if resume:
        if src.kind != "parquet":
            raise LoaderxValueError(
                f"resume=True resumes a conversion of Parquet files (one part per file); a "
                f"{type(source).__name__} is read as one stream. Run it again without resume "
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
                         extra=extra) as writer:
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


def _resumable(pa: Any, dst: str | os.PathLike[str], files: list[str], options: _Options,
               overwrite: bool) -> int:
    """Parquet file ``k`` into part ``k`` of ``dst`` -- unless a finished part of an earlier
    run of the same conversion is there -- then the parts joined into ``dst``."""
    dst = os.path.abspath(os.fspath(dst))
    prints = [_fingerprint(f, options) for f in files]
    plan_digest = hashlib.sha256(json.dumps(prints).encode()).hexdigest()
    if os.path.lexists(dst) and not overwrite:
        done = read_manifest(dst) if is_dataset_directory(dst) else None
        if done is not None and done.extra.get("resume") == plan_digest:
            discard_parts(dst)  # what a kill just after publishing left
            return done.rows  # this very conversion finished already
        raise DatasetError(f"{dst} exists (and is not this conversion, finished); pass "
                           "overwrite=True to replace it")
    if len(files) > MAX_PARTS:
        raise LimitExceededError(f"resume=True writes a part per file: {len(files)} files, at "
                                 f"most {MAX_PARTS}; merge files first")
    os.makedirs(parts_dir(dst), exist_ok=True)
    for k, (file, fp) in enumerate(zip(files, prints, strict=True)):
        part = part_path(dst, k)
        if (is_dataset_directory(part) and read_manifest(part).extra.get("resume") == fp
                and not shares_chunks(part)):
            continue  # finished by an earlier run, from this very file
        src = _parquet_source(pa, [file], options.chunk_bytes)
        _write(part, src, _plan(pa, src.schema, options.columns), options, True,
               {"source": "parquet", "resume": fp})
    return assemble(dst, len(files), overwrite=overwrite, extra={"resume": plan_digest})


def _fingerprint(file: str, options: _Options) -> str:
    """What a finished part must have been converted from: the file (its real path, inode,
    size, modification and change times) and the options that decide the stored bytes."""
    st = os.stat(file)
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


def _open_source(pa: Any, source: Any, chunk_bytes: int) -> _Source:
    if isinstance(source, (str, os.PathLike)) or (
            isinstance(source, (list, tuple)) and source
            and all(isinstance(s, (str, os.PathLike)) for s in source)):
        return _parquet_source(pa, _expand(source), chunk_bytes)
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
        return _reader_source(pa, source.to_reader(), source.num_rows, chunk_bytes, "arrow")
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
    rows = len(ds)
    size = getattr(ds.data, "nbytes", 0) or 0
    step = max(1, min(1 << 16, int(rows * chunk_bytes // size) if size else 1 << 16))

    def batches(wanted: list[str]) -> Iterator[tuple[Any, str]]:
        for t in ds.select_columns(wanted).with_format("arrow").iter(batch_size=step):
            for b in t.to_batches():
                yield b.replace_schema_metadata(schema.metadata), "the datasets.Dataset"

    return _Source("huggingface", schema, rows, batches)


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

    return _Source("parquet", schema, sum(declared), batches, check_end)


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

    def array(self, batch: Any) -> Any:
        arr = batch.column(self.fields[0])  # by name: a Parquet read projects the columns
        for i in self.path[1:]:
            arr = arr.flatten()[i]  # the struct's slice and its nulls applied to the field
        return arr

    def convert(self, batch: Any, start: int, where: str) -> Any:
        arr = self.array(batch)
        _check_nulls(arr, self.name, start, where)
        try:
            records = self.to_records(arr)
        except _NullElement as e:
            raise DatasetError(
                f"column {self.name!r} has a list with a null element (at depth {e.level}) in "
                f"rows {start}..{start + len(arr) - 1}{_in(where)}: nulls are not converted. "
                "Fill them first (pyarrow.compute.fill_null on the list values), drop those "
                "rows, or leave the column out with columns=") from None
        except LoaderxError:
            raise
        except Exception as e:  # pyarrow's errors (a type it cannot take apart, ...)
            raise DatasetError(f"column {self.name!r} ({arr.type}) could not be converted"
                               f"{_in(where)}: {type(e).__name__}: {e}; cast it to a plainer "
                               "type first, or leave it out with columns=") from None
        if self.kind == "ragged":
            _check_record_sizes(records, self, start, where)
        return records


def _check_nulls(arr: Any, name: str, start: int, where: str) -> None:
    if arr.null_count:
        row = start + _first_null(arr)
        raise DatasetError(
            f"column {name!r} has a null at row {row}{_in(where)}: nulls are not converted. "
            "Fill them first (pyarrow.compute.fill_null, polars fill_null, pandas fillna), drop "
            "those rows, or leave the column out with columns=")


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


def _plan(pa: Any, schema: Any, columns: Sequence[str] | None) -> list[_Leaf]:
    """The leaf columns of ``schema`` to convert, in order, each with its mapping; refusals are
    raised here, before anything is written."""
    meta = schema.metadata or {}
    classes = _class_names(meta)
    index_cols = _pandas_index_columns(meta)
    leaves: list[_Leaf] = []
    for i, f in enumerate(schema):
        # Only the fields asked for are mapped: a column left out is never refused.
        if columns is None and f.name in index_cols:
            continue
        if columns is not None and not any(c == f.name or c.startswith(f.name + ".")
                                           for c in columns):
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
                raise DatasetError(f"columns names {name!r}, which the source does not have; "
                                   f"it has {', '.join(repr(n) for n in schema.names)}")
            chosen.extend(p for p in picked if p not in chosen)
    names: dict[str, str] = {}
    for leaf in chosen:
        if leaf.name in names:
            raise DatasetError(f"two source columns become column {leaf.name!r} (a struct "
                               "field flattened onto a column of that name, or a name given "
                               "twice): rename one before converting")
        names[leaf.name] = leaf.name
    return chosen


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
    except (ValueError, AttributeError, TypeError):
        return {}  # metadata we cannot read is only metadata
    return found


def _pandas_index_columns(meta: dict[bytes, bytes]) -> set[str]:
    try:
        cols = json.loads(meta[b"pandas"]).get("index_columns", []) if b"pandas" in meta else []
    except (ValueError, AttributeError, TypeError):
        return set()
    return {c for c in cols if isinstance(c, str)}


def _refuse(name: str, typ: Any, fix: str) -> DatasetError:
    return DatasetError(f"column {name!r} has the Arrow type {typ}, which loaderx does not "
                        f"convert: {fix}")


def _map_field(pa: Any, name: str, typ: Any, path: tuple[int, ...], fields: tuple[str, ...],
               classes: dict[str, list[str]]) -> list[_Leaf]:
    t = pa.types
    extra: dict[str, Any] = {"arrow_type": str(typ)}
    if t.is_struct(typ):
        out = []
        for j in range(typ.num_fields):
            child = typ.field(j)
            out.extend(_map_field(pa, f"{name}.{child.name}", child.type, path + (j,),
                                  fields + (child.name,), classes))
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
        extra["extension"] = typ.extension_name
        inner = _map_field(pa, name, typ.storage_type, path, fields, classes)
        for leaf in inner:
            leaf.extra = {**leaf.extra, **extra, "storage_type": str(typ.storage_type)}
            leaf.to_records = _compose(_storage, leaf.to_records)
        return inner
    kind, dtype, shape, to_records, more = _map_type(pa, name, typ)
    extra.update(more)
    if fields[-1] in classes and len(fields) == 1 and dtype.kind in "iu" and kind == "dense":
        extra["classes"] = classes[fields[-1]]
    if decode is not None:
        to_records = _compose(decode, to_records)
    return [_Leaf(name, path, kind, dtype, shape, extra, to_records, fields=fields)]


def _compose(first: Callable[[Any], Any], then: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda arr: then(first(arr))


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
        more = {"dim_names": list(typ.dim_names)} if typ.dim_names else {}
        return "dense", value, shape, _tensor(shape), more
    if t.is_fixed_size_list(typ):
        value, shape = _fixed_lists(pa, name, typ)
        return "dense", value, shape, _fixed_list_values(len(shape), shape), {}
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


def _tensor(shape: tuple[int, ...]) -> Callable[[Any], np.ndarray]:
    def convert(arr: Any) -> np.ndarray:
        if len(arr) == 0:
            return np.empty((0, *shape), np.dtype(arr.type.value_type.to_pandas_dtype()))
        return np.ascontiguousarray(arr.to_numpy_ndarray())

    return convert


def _fixed_list_values(depth: int, shape: tuple[int, ...]) -> Callable[[Any], np.ndarray]:
    def convert(arr: Any) -> np.ndarray:
        n = len(arr)
        values = arr
        for level in range(depth):
            values = values.flatten()  # offset-aware: the slice's values only
            if values.null_count:
                raise _NullElement(level + 1)
        return values.to_numpy(zero_copy_only=False).reshape(n, *shape)

    return convert


class _NullElement(DatasetError):
    """A list holds a null element (raised with the column's name by :meth:`_Leaf.convert`)."""

    def __init__(self, level: int) -> None:
        super().__init__(f"a null list element at depth {level}")
        self.level = level


def _lists(shape: tuple[int, ...]) -> Callable[[Any], RaggedBatch]:
    def convert(arr: Any) -> RaggedBatch:
        offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        flat = _list_values(arr.flatten(), shape)  # offset-aware: the slice's values only
        return RaggedBatch(flat, offsets - offsets[0])

    return convert


def _list_values(values: Any, shape: tuple[int, ...]) -> np.ndarray:
    """The elements of a list array's values as ``(m, *shape)``, refusing null elements."""
    if values.null_count:
        raise _NullElement(1)
    for level in range(len(shape)):
        values = values.flatten()
        if values.null_count:
            raise _NullElement(level + 2)
    return values.to_numpy(zero_copy_only=False).reshape(-1, *shape)


def _list_views(shape: tuple[int, ...]) -> Callable[[Any], RaggedBatch]:
    """List views may point anywhere in their values (out of order, overlapping): each list's
    elements are gathered into place (pyarrow 26's cast to a list gets the offsets wrong)."""
    def convert(arr: Any) -> RaggedBatch:
        starts = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        sizes = arr.sizes.to_numpy(zero_copy_only=False).astype(np.int64)
        values = _list_values(arr.values, shape)
        bounds = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=bounds[1:])
        picks = np.repeat(starts - bounds[:-1], sizes) + np.arange(bounds[-1])
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
