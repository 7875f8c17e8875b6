"""The *dataset directory*: several aligned columns, one loaderx store each, and a manifest.

Every converter of :mod:`loaderx.intake` (tables, image folders, WebDataset shards) writes this
layout through :class:`DirectoryWriter`, and :func:`open_dataset` opens it as
``{column: dataset}``, a dict the :class:`~loaderx.dataloader.DataLoader` and
:func:`~loaderx.subset.split` take as they are (row ``i`` of every column belongs to sample
``i``)::

    dst/
      manifest.json        what the directory holds (written last: its presence makes it one)
      label/               one loaderx store per column (schema.msgpack, meta.zr, 0.zr, ...)
      image/
      _00002_caption_en/   a column whose name is not a safe directory name (see below)

or, for a dataset written as several parts (more rows than one store holds, 2**24, or parts
written by separate tasks)::

    dst/
      manifest.json        the columns, the total row count and the parts, in order
      parts/00000/         each part a complete dataset directory of the same columns
      parts/00001/
      ...

``manifest.json`` is UTF-8 JSON, at most :data:`MAX_MANIFEST_BYTES`::

    {"format": "loaderx-dataset", "version": 1, "rows": 3,
     "columns": [{"name": "label", "store": "label", "kind": "dense", "dtype": "<i8",
                  "item_shape": [], "codec": "raw", "extra": {"classes": ["cat", "dog"]}},
                 {"name": "text", "store": "text", "kind": "ragged", "dtype": "|u1",
                  "item_shape": [], "codec": "zstd",
                  "extra": {"string": true, "arrow_type": "string"}}],
     "parts": [{"path": "parts/00000", "rows": 2}, {"path": "parts/00001", "rows": 1}],
     "extra": {"source": "parquet"}}

``parts`` is present only in a directory of parts (whose ``columns`` then have no ``store``:
each part's own manifest names its stores). ``columns`` keeps the order the columns were
added in. ``extra`` (per column and for the whole directory) is what the converter wants to
remember: ``"string": true`` marks a column of UTF-8 text (stored as ragged ``uint8``; decode it
with :func:`decode_strings`), ``"classes"`` the names of integer labels, ``arrow_type`` the
type the column had in its source.

Column names are any strings (``"a/b"``, ``".."``, ``"名前"``, ``""``), kept in the manifest.
A name that is a safe directory name -- ASCII letters, digits, ``.``, ``_``, ``-``, starting
with a letter or digit, at most 64 characters, not ``parts`` or ``manifest.json`` and not
equal to an earlier column's but for case -- is its store's directory name; any other name is
stored in ``_<column index>_<the name's safe characters, at most 40>``, which cannot collide
with a safe name (those never start with ``_``) nor with another escaped one (the index). On
reading, a store or part path in a manifest that is not of these forms is refused
(CorruptStoreError): a manifest cannot name anything outside its directory.

Writing is one transaction: :class:`DirectoryWriter` builds everything in a private staging
directory beside ``dst`` (:func:`loaderx.staging.private_dir`), appends the rows of every
column together (each :meth:`DirectoryWriter.append` call checks all columns first, so they
always have the same length), syncs every store, writes the manifests and publishes the whole
directory in one atomic rename (:func:`loaderx.staging.publish`, or
:func:`loaderx.staging.replace` with ``overwrite=True``). A failure, Ctrl-C or a kill leaves
``dst`` as it was (absent, or the old dataset) and removes the staging directory -- at once,
or, after a kill, when the next conversion into ``dst`` runs :func:`loaderx.staging.remove_stale`.
So a conversion is *re-run*, not resumed: running it again after any interruption gives exactly
the result an uninterrupted run gives, nothing duplicated (``overwrite=True`` is needed only
when a previous run completed).

Checking and moving one: ``loaderx verify``, ``copy``, ``pack`` and ``unpack`` (and
:func:`loaderx.verifying.verify`, :func:`loaderx.copying.copy`, :func:`loaderx.archive.pack`,
:func:`loaderx.archive.unpack`) take a dataset directory as a whole -- every column's store of
every part, and the manifests -- and check what :func:`open_dataset` checks: every store there,
of its column's kind, dtype and item shape, with the manifest's row count (per part, and so in
total). A copy or an unpacked archive is built privately and published like a conversion
(:func:`claim_destination`, :func:`put_in_place`); :func:`column_stores` lists the stores.

Codecs: a column declared without a codec of its own gets the writer's, zstd by default,
*where it pays*. A column whose records are under :data:`loaderx.converter.AUTO_RAW_BELOW`
bytes (4 KiB: scalars, small vectors, short strings, token rows) is stored raw, as
``from_numpy(codec="auto")`` does -- decoding a zstd frame costs 4-15 µs a record at those
sizes, against a fraction of a microsecond to copy it, and it slowed the conversion of 600-byte
strings to a fifth of the raw speed: a dense column is decided by its record size when it is
declared, a ragged one by the mean of up to :data:`SAMPLE_RECORDS` records of the first batch,
spread over it. Of the rest, a column whose sample the trial compression shrinks by less than
:data:`MIN_SAVING` (JPEG bytes, random-looking floats) is stored raw too: it would save almost
no space. ``codec={column: "zstd"}`` compresses a column whatever its records.
A codec given for a column (``add_column(codec=...)``) is used as it is. The manifest records
each column's codec.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import errno
import json
import math
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from loaderx import _native
from loaderx._store import schema as _schema
from loaderx._store import staging
from loaderx._views.concat import ConcatDataset, register_class_names
from loaderx._views.dataset import DenseDataset, RaggedDataset, register_directory_state
from loaderx._views.group import (
    MAX_GROUP_ROW_BYTES,
    ColumnGroup,
    GroupColumn,
    GroupField,
    GroupLayout,
    pack_rows,
    plan_layout,
    register_group_opener,
)
from loaderx.converter import AUTO_RAW_BELOW
from loaderx.errors import (
    CorruptStoreError,
    DatasetError,
    InternalError,
    LimitExceededError,
    LoaderxError,
    LoaderxTypeError,
    LoaderxValueError,
    StoreClosedError,
)
from loaderx.zrecord import (
    MAX_RECORD_BYTES,
    MAX_RECORDS,
    Codec,
    Zrecord,
    chunk_number,
    dataset_column,
)
from loaderx.zrecord import _codec as _store_codec

__all__ = [
    "DirectoryWriter", "RaggedBatch", "Column", "Manifest", "open_dataset", "read_manifest",
    "is_dataset_directory", "decode_strings", "column_stores", "ColumnStore", "MANIFEST_FILE",
    "FORMAT", "VERSION",
]

MANIFEST_FILE = "manifest.json"
FORMAT = "loaderx-dataset"
#: The manifest version written: 2 for a directory with column groups (and a generation), 1
#: otherwise (what earlier loaderx versions read). Both are read.
VERSION = 2
VERSIONS = (1, 2)
PARTS_DIR = "parts"
#: Largest manifest read or written (it is metadata: class names, column types).
MAX_MANIFEST_BYTES = 16 << 20
#: Records compressed as a trial before a column's codec is settled, and the least part of
#: their bytes zstd must save for the column to be compressed.
SAMPLE_RECORDS = 1024
MIN_SAVING = 0.10
#: Most columns one directory holds.
MAX_COLUMNS = 4096
#: Most parts one directory holds.
MAX_PARTS = 100_000
#: Most threads a writer runs its columns' stores on (creating, appending, syncing): their
#: fsyncs wait on the disk, not on a core, and the disk commits concurrent ones together.
COLUMN_THREADS = 16

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_ESCAPED_NAME = re.compile(r"_[0-9]{1,5}_[A-Za-z0-9._-]{0,40}\Z")
_PART_PATH = re.compile(r"parts/[0-9]{5,6}\Z")
_GROUP_NAME = re.compile(r"_group_[0-9]{1,4}\Z")
#: Most column groups one directory holds.
MAX_GROUPS = 64
_RESERVED_NAMES = {PARTS_DIR, MANIFEST_FILE}
_DATA = Any  # a batch of one column (see DirectoryWriter.append)


# -- the manifest --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """One column of a dataset directory, as its manifest describes it."""

    name: str
    store: str  # directory of its store inside the dataset directory ("" in a directory of parts)
    kind: str  # "dense" or "ragged"
    dtype: np.dtype
    item_shape: tuple[int, ...]
    codec: str
    extra: dict[str, Any] = field(default_factory=dict)
    group: int | None = None  # the column group holding it (None: a store of its own)
    offset: int = 0  # a grouped column's byte offset in the group's rows

    @property
    def is_string(self) -> bool:
        """Whether the column holds UTF-8 text (ragged ``uint8`` records)."""
        return bool(self.extra.get("string"))

    def to_json(self, with_store: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {"name": self.name}
        if with_store and self.group is not None:
            body.update(group=self.group, offset=self.offset)
        elif with_store:
            body["store"] = self.store
        body.update(kind=self.kind, dtype=self.dtype.str, item_shape=list(self.item_shape),
                    codec=self.codec, extra=self.extra)
        return body


@dataclass(frozen=True)
class Group:
    """One column group of a dataset directory (see :mod:`loaderx._views.group`): its block
    store's directory, the bytes of a row, rows per block, the store's codec, and the *tail*:
    the rows after the last full block (fewer than a block), which the manifest holds, so that
    an append fills them into full blocks instead of rewriting one."""

    store: str
    row_bytes: int
    block_rows: int
    codec: str
    tail: bytes = b""

    @property
    def layout(self) -> GroupLayout:
        return GroupLayout(self.row_bytes, self.block_rows)

    def blocks(self, rows: int) -> int:
        """Records of the block store for ``rows`` rows: its full blocks."""
        return rows // self.block_rows

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"store": self.store, "row_bytes": self.row_bytes,
                                "block_rows": self.block_rows, "codec": self.codec}
        if self.tail:
            body["tail"] = base64.b64encode(self.tail).decode("ascii")
        return body


@dataclass(frozen=True)
class Part:
    """One part of a directory of parts: its path (``parts/NNNNN``) and row count."""

    path: str
    rows: int


@dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` says: the row count, the columns in order, the parts (empty for a
    directory whose stores are its own columns) and the directory's extra keys."""

    rows: int
    columns: tuple[Column, ...]
    parts: tuple[Part, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    groups: tuple[Group, ...] = ()
    generation: str = ""  # a grouped directory's: new at every commit ("" in version 1)
    grouped: bool = False  # a directory of parts whose parts have column groups

    @property
    def version(self) -> int:
        return 2 if self.groups or self.grouped or self.generation else 1

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise DatasetError(f"no column {name!r}; the columns are "
                           f"{', '.join(repr(c.name) for c in self.columns) or '(none)'}")

    def to_bytes(self) -> bytes:
        body: dict[str, Any] = {"format": FORMAT, "version": self.version, "rows": self.rows}
        if self.version == 2:
            body["generation"] = self.generation
        if self.groups:
            body["groups"] = [g.to_json() for g in self.groups]
        if self.grouped:
            body["grouped"] = True
        body["columns"] = [c.to_json(not self.parts) for c in self.columns]
        if self.parts:
            body["parts"] = [{"path": p.path, "rows": p.rows} for p in self.parts]
        body["extra"] = self.extra
        try:
            raw = json.dumps(body, ensure_ascii=True, indent=1, allow_nan=False).encode()
        except (TypeError, ValueError) as e:
            raise DatasetError(f"the manifest cannot be written as JSON ({e}); extra values "
                               "must be None, bools, numbers, strings, lists or dicts with "
                               "string keys") from None
        if len(raw) > MAX_MANIFEST_BYTES:
            raise DatasetError(f"the manifest encodes to {len(raw)} bytes, over the "
                               f"{MAX_MANIFEST_BYTES}-byte limit; keep large metadata in a "
                               "column or a file of its own")
        return raw + b"\n"


def is_dataset_directory(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` has a ``manifest.json`` (whatever it holds: reading checks that)."""
    return os.path.lexists(os.path.join(os.fspath(path), MANIFEST_FILE))


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """The manifest of the dataset directory ``path``, validated: DatasetError when ``path``
    is not a dataset directory (naming what it is instead), CorruptStoreError when the
    manifest is not a regular file of valid JSON of this layout or names a path outside it."""
    return manifest_and_bytes(path)[0]


def manifest_and_bytes(path: str | os.PathLike[str]) -> tuple[Manifest, bytes]:
    """:func:`read_manifest`, and the bytes the manifest was parsed from (read once: a copy
    writes exactly what was checked)."""
    path = os.fspath(path)
    file = os.path.join(path, MANIFEST_FILE)
    if not os.path.isdir(path):
        if os.path.exists(path):
            raise DatasetError(f"{path} is a file; a dataset directory is a directory")
        with contextlib.suppress(OSError):  # a replacement killed between its two renames
            staging.remove_stale(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(errno.ENOENT, "no dataset directory at this path", path)
    if not os.path.lexists(file):
        if _schema.is_store(path):
            raise DatasetError(f"{path} is a single loaderx store, not a dataset directory "
                               "(no manifest.json): open it with loaderx.DenseDataset or "
                               "loaderx.RaggedDataset")
        raise DatasetError(f"{path} has no {MANIFEST_FILE}: not a loaderx dataset directory")
    raw = _read_bounded(file)
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptStoreError(f"{file} is not valid JSON ({e})") from None
    return _parse_manifest(body, file), raw


def is_store_dir_name(name: str) -> bool:
    """Whether ``name`` has the form of a column's store directory (a safe name or an escaped
    one, see the module docstring); the manifest decides which ones a directory has."""
    return bool(_SAFE_NAME.match(name) or _ESCAPED_NAME.match(name)) and \
        name not in _RESERVED_NAMES


def is_group_store_name(name: str) -> bool:
    """Whether ``name`` has the form of a column group's store directory, ``_group_N``."""
    return bool(_GROUP_NAME.match(name))


def is_part_path(path: str) -> bool:
    """Whether ``path`` (``/``-separated) has the form of a part's path, ``parts/NNNNN``."""
    return bool(_PART_PATH.match(path))


def _read_bounded(file: str) -> bytes:
    """The bytes of ``file``, a regular file (never a link, FIFO or device) of at most
    :data:`MAX_MANIFEST_BYTES`; CorruptStoreError otherwise."""
    return _schema.read_regular(file, MAX_MANIFEST_BYTES,
                                f"a dataset directory's {MANIFEST_FILE}")


def _is_count(value: Any, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit


def _parse_manifest(body: Any, file: str) -> Manifest:
    def bad(what: str) -> CorruptStoreError:
        return CorruptStoreError(f"{file}: {what}")

    if not isinstance(body, dict):
        raise bad("does not hold a JSON object")
    if body.get("format") != FORMAT:
        raise DatasetError(f"{file}: format {body.get('format')!r} is not {FORMAT!r}")
    version = body.get("version")
    if version not in VERSIONS or isinstance(version, bool):
        raise DatasetError(f"{file}: version {version!r} is not supported (this loaderx reads "
                           f"versions {', '.join(map(str, VERSIONS))}); upgrade loaderx")
    generation = body.get("generation", "") if version == 2 else ""
    if not isinstance(generation, str) or len(generation) > 64:
        raise bad(f"generation {generation!r} is not a string of at most 64 characters")
    raw_parts = body.get("parts")
    groups = _parse_groups(body.get("groups", []) if version == 2 else [], bad)
    if raw_parts is not None and groups:
        raise bad("a directory of parts has no column groups of its own (its parts do)")
    grouped = body.get("grouped", False) if version == 2 else False
    if not isinstance(grouped, bool):
        raise bad(f"grouped {grouped!r} is not a boolean")
    rows = body.get("rows")
    cols = body.get("columns")
    if not isinstance(cols, list) or len(cols) > MAX_COLUMNS:
        raise bad(f"columns is not a list of at most {MAX_COLUMNS}")
    columns, names, stores = [], set(), set()
    for i, c in enumerate(cols):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise bad(f"column {i} is not an object with a string name")
        name = c["name"]
        if name in names:
            raise bad(f"column name {name!r} appears twice")
        names.add(name)
        group, offset = c.get("group"), c.get("offset", 0)
        if group is not None and (raw_parts is not None or not _is_count(group, len(groups) - 1)
                                  or not _is_count(offset, MAX_RECORD_BYTES)):
            raise bad(f"column {name!r} names group {group!r} at offset {offset!r}, which "
                      "this directory does not have")
        store: Any = groups[group].store if group is not None else (
            c.get("store", "") if raw_parts is not None else c.get("store"))
        if group is None and raw_parts is None and (
                not isinstance(store, str) or not is_store_dir_name(store)
                or store.lower() in stores):
            raise bad(f"column {name!r} names the store {store!r}, which is not a directory "
                      "name of this layout (or is named twice)")
        if isinstance(store, str):
            stores.add(store.lower())
        if c.get("kind") not in _schema.KINDS:
            raise bad(f"column {name!r} has kind {c.get('kind')!r}")
        if not isinstance(c.get("dtype"), str):
            raise bad(f"column {name!r} has dtype {c.get('dtype')!r}")
        try:
            dtype = _schema.check_dtype(c["dtype"], f"{file}: column {name!r}")
        except DatasetError as e:
            raise bad(str(e)) from None
        shape = c.get("item_shape")
        if not isinstance(shape, list) or len(shape) > _schema.MAX_ITEM_DIMS or not all(
                _is_count(d, 2**31 - 1) for d in shape):
            raise bad(f"column {name!r} has item_shape {shape!r}")
        extra = c.get("extra", {})
        if not isinstance(extra, dict):
            raise bad(f"column {name!r} has extra {extra!r}, not an object")
        codec = c.get("codec", "zstd")
        if codec not in _native.CODECS:
            raise bad(f"column {name!r} has codec {codec!r}")
        columns.append(Column(name, str(store), c["kind"], dtype, tuple(shape), codec, extra,
                              group, offset if group is not None else 0))
    _check_fields(columns, groups, bad)
    if not isinstance(rows, int) or not _is_count(rows, _most_rows(columns, groups, raw_parts)):
        raise bad(f"rows {rows!r} is not a row count")
    for g in groups:
        if len(g.tail) != rows % g.block_rows * g.row_bytes:
            raise bad(f"group {g.store!r}: its tail holds {len(g.tail)} bytes; {rows} rows in "
                      f"blocks of {g.block_rows} leave {rows % g.block_rows} rows of "
                      f"{g.row_bytes} bytes after the last full block")
    parts: list[Part] = []
    if raw_parts is not None:
        if not isinstance(raw_parts, list) or not raw_parts or len(raw_parts) > MAX_PARTS:
            raise bad(f"parts is not a non-empty list of at most {MAX_PARTS}")
        seen = set()
        for p in raw_parts:
            if not isinstance(p, dict) or not isinstance(p.get("path"), str) or \
                    not _PART_PATH.match(p["path"]) or p["path"] in seen or \
                    not _is_count(p.get("rows"), MAX_RECORDS):
                raise bad(f"part {p!r} is not {{'path': 'parts/NNNNN', 'rows': n}} (or "
                          "is named twice)")
            seen.add(p["path"])
            parts.append(Part(p["path"], p["rows"]))
        if sum(p.rows for p in parts) != rows:
            raise bad(f"the parts hold {sum(p.rows for p in parts)} rows, the manifest says "
                      f"{rows}")
    extra = body.get("extra", {})
    if not isinstance(extra, dict):
        raise bad(f"extra {extra!r} is not an object")
    return Manifest(rows, tuple(columns), tuple(parts), extra, groups, generation, grouped)


def _parse_groups(raw: Any, bad: Callable[[str], CorruptStoreError]) -> tuple[Group, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_GROUPS:
        raise bad(f"groups is not a list of at most {MAX_GROUPS}")
    groups: list[Group] = []
    for g in raw:
        if not isinstance(g, dict) or not isinstance(g.get("store"), str) or \
                not _GROUP_NAME.match(g["store"]) or \
                not _is_count(g.get("row_bytes"), MAX_RECORD_BYTES) or not g["row_bytes"] or \
                not _is_count(g.get("block_rows"), MAX_RECORD_BYTES) or not g["block_rows"] or \
                g["row_bytes"] * g["block_rows"] > MAX_RECORD_BYTES or \
                g.get("codec") not in _native.CODECS or \
                any(g["store"] == other.store for other in groups):
            raise bad(f"group {g!r} is not {{'store': '_group_N', 'row_bytes': n, "
                      "'block_rows': n, 'codec': ...}} with a block of at most "
                      f"{MAX_RECORD_BYTES} bytes (or is named twice)")
        raw_tail = g.get("tail", "")
        try:
            if not isinstance(raw_tail, str) or len(raw_tail) > 2 * MAX_RECORD_BYTES:
                raise ValueError("not a string of base64")
            tail = base64.b64decode(raw_tail, validate=True)
        except (ValueError, binascii.Error) as e:
            raise bad(f"group {g['store']!r}: its tail is not base64 ({e})") from None
        groups.append(Group(g["store"], g["row_bytes"], g["block_rows"], g["codec"], tail))
    return tuple(groups)


def _check_fields(columns: Sequence[Column], groups: Sequence[Group],
                  bad: Callable[[str], CorruptStoreError]) -> None:
    """Refuses grouped columns that are not dense or whose bytes overlap or leave the row."""
    for k, g in enumerate(groups):
        spans = []
        for c in columns:
            if c.group != k:
                continue
            if c.kind != "dense":
                raise bad(f"column {c.name!r} is {c.kind}; a column group holds dense columns")
            end = c.offset + math.prod(c.item_shape) * c.dtype.itemsize
            if end > g.row_bytes:
                raise bad(f"column {c.name!r} ends at byte {end} of a {g.row_bytes}-byte row")
            spans.append((c.offset, end, c.name))
        spans.sort()
        for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
            if start < end:
                raise bad(f"columns {a!r} and {b!r} overlap in their group's rows")


def _most_rows(columns: Sequence[Column], groups: Sequence[Group], raw_parts: Any) -> int:
    """Most rows a manifest may say: a store of its own holds one record a row, a group one
    block of rows a record."""
    if raw_parts is not None:
        return MAX_RECORDS * MAX_PARTS
    if groups and all(c.group is not None for c in columns):
        return MAX_RECORDS * min(g.block_rows for g in groups)
    return MAX_RECORDS


# -- opening -------------------------------------------------------------------------------------

Dataset = DenseDataset | RaggedDataset | ConcatDataset | GroupColumn


def open_dataset(path: str | os.PathLike[str], *, columns: Sequence[str] | None = None,
                 verify_reads: bool = False) -> dict[str, Dataset]:
    """The columns of the dataset directory ``path`` as ``{name: dataset}``, in manifest order:
    a :class:`~loaderx.dataset.DenseDataset` or :class:`~loaderx.dataset.RaggedDataset` per
    column, or a :class:`~loaderx.concat.ConcatDataset` over the parts of a directory of parts
    (opened in the order the manifest lists them). ``columns`` picks some (in that order).

    Every column has the manifest's row count (CorruptStoreError otherwise), so row ``i`` of
    each belongs to sample ``i``: pass the dict to :class:`~loaderx.dataloader.DataLoader` or
    :func:`loaderx.split` as it is. A string column is a RaggedDataset of ``uint8``; decode
    its records with :func:`decode_strings`.

    A directory replaced while it opens (an append or delete of a version-1 directory swaps
    in a new one) is opened again from its new manifest: it opens as the old dataset or the
    new one, never as the old manifest over the new stores."""
    path = os.path.abspath(os.fspath(path))
    for _ in range(_OPEN_ATTEMPTS - 1):
        manifest, raw = manifest_and_bytes(path)
        try:
            return _open_from(path, manifest, columns, verify_reads)
        except CorruptStoreError:
            with contextlib.suppress(LoaderxError, OSError):
                if manifest_and_bytes(path)[1] != raw:
                    continue  # replaced meanwhile: open what is there now
            raise
    return _open_from(path, read_manifest(path), columns, verify_reads)


#: Opens of a dataset directory tried while it keeps being replaced under them.
_OPEN_ATTEMPTS = 4


def _open_from(path: str, manifest: Manifest, columns: Sequence[str] | None,
               verify_reads: bool) -> dict[str, Dataset]:
    """:func:`open_dataset` of ``path`` as ``manifest`` describes it."""
    chosen = _choose(manifest, columns)
    opened: list[Any] = []
    try:
        if not manifest.parts:
            groups = _open_groups(path, manifest, [(path, manifest, manifest.rows)], chosen,
                                  verify_reads, opened)
            # Every column shows the manifest's rows, whatever its store holds past them (an
            # append in place not yet committed, or committed since this open).
            pin = (path, manifest.generation)
            return {c.name: (_open_store(path, c, manifest.rows, verify_reads, opened, pin)
                             if c.group is None else groups[c.name]) for c in chosen}
        subs = [(part_directory(path, part), part) for part in manifest.parts]
        owned = [(sub, part, read_manifest(sub), part_columns(path, part, chosen))
                 for sub, part in subs]
        grouped = [c for i, c in enumerate(chosen) if owned[0][3][i].group is not None] \
            if owned else []
        groups = _open_groups(path, manifest, [(sub, m, part.rows)
                                               for sub, part, m, _ in owned],
                              grouped, verify_reads, opened)
        out: dict[str, Any] = {}
        for i, c in enumerate(chosen):
            if c.name in groups:
                out[c.name] = groups[c.name]
                continue
            stores = [_open_store(sub, owns[i], part.rows, verify_reads, opened)
                      for sub, part, _, owns in owned]
            # Each part's class names as its manifest has them: parts that number the
            # classes differently are refused (ConcatDataset), not read as one numbering.
            out[c.name] = ConcatDataset(stores, verify_reads=verify_reads,
                                        _classes=[owns[i].extra.get("classes")
                                                  for _, _, _, owns in owned])
        return out
    except BaseException:
        for ds in opened:
            with contextlib.suppress(Exception):
                ds.close()
        raise


def _open_groups(root: str, top: Manifest, units: Sequence[tuple[str, Manifest, int]],
                 chosen: Sequence[Column], verify_reads: bool,
                 opened: list[Any]) -> dict[str, GroupColumn]:
    """The grouped columns among ``chosen`` as :class:`GroupColumn`s, each group opened once:
    over the block stores of every unit (the directory itself, or each part in order), which
    must all lay the group out alike (CorruptStoreError)."""
    out: dict[str, GroupColumn] = {}
    by_group: dict[int, list[str]] = {}
    first = units[0][1] if units else top
    for c in chosen:
        own = first.column(c.name)
        if own.group is not None:
            by_group.setdefault(own.group, []).append(c.name)
    for k, names in by_group.items():
        segments, layout = _segments(units, k, names)
        group = ColumnGroup(segments, layout, root, top.generation, k,
                            verify_reads=verify_reads)
        opened.append(group)
        for n in names:
            c = first.column(n)
            out[n] = GroupColumn(group, GroupField(n, c.dtype, c.item_shape, c.offset))
    return out


def _segments(units: Sequence[tuple[str, Manifest, int]], k: int,
              names: Sequence[str] | None = None) -> tuple[
                  list[tuple[str, int, bytes]], GroupLayout]:
    """Group ``k``'s block store in every unit (the directory, or each part), with its rows and
    tail; every unit must lay the group (and its columns ``names``, default all) out alike."""
    first = units[0][1]
    g = first.groups[k]
    if names is None:
        names = [c.name for c in first.columns if c.group == k]
    segments = []
    for sub, m, rows in units:
        if len(m.groups) <= k or m.groups[k].layout != g.layout or any(
                (m.column(n).group, m.column(n).offset) != (k, first.column(n).offset)
                for n in names):
            raise CorruptStoreError(f"{sub}: its column group {k} is not laid out as the "
                                    "first part's; the parts are not one dataset")
        segments.append((os.path.join(sub, g.store), rows, m.groups[k].tail))
    return segments, g.layout


def group_segments(root: str, manifest: Manifest, k: int) -> tuple[
        list[tuple[str, int, bytes]], GroupLayout]:
    """The block stores of group ``k`` of the dataset directory ``root`` (whose manifest is
    ``manifest``), with their rows and tails, and the group's layout."""
    if not manifest.parts:
        return _segments([(root, manifest, manifest.rows)], k)
    units = [(part_directory(root, p), read_manifest(part_directory(root, p)), p.rows)
             for p in manifest.parts]
    return _segments(units, k)


def _group_now(root: str, k: int) -> tuple[str, int, list[tuple[str, int, bytes]], GroupLayout]:
    """Group ``k`` of the directory ``root`` as its manifest says now, for a worker process
    reopening a column (see :mod:`loaderx._views.group`)."""
    manifest = read_manifest(root)
    segments, layout = group_segments(root, manifest, k)
    return manifest.generation, manifest.rows, segments, layout


def _state_now(root: str) -> tuple[str, int]:
    """The generation and row count of the directory ``root`` now (see
    :mod:`loaderx._views.dataset`)."""
    manifest = read_manifest(root)
    return manifest.generation, manifest.rows


register_group_opener(_group_now)
register_directory_state(_state_now)


def refuse_grouped(path: str, manifest: Manifest, what: str) -> None:
    """Refuses to grow, shrink or repair a dataset directory with column groups (DatasetError
    naming what to do instead): the rebuild-and-join path of :mod:`loaderx.intake.growing`
    joins one store per column, and a group's blocks cannot be joined that way."""
    if manifest.groups or manifest.grouped:
        raise DatasetError(
            f"{path} stores its fixed-width columns in a column group (written with "
            f"group_columns=True); this loaderx cannot {what} rows of such a directory yet. "
            "Convert the data again as a whole (from_arrow(..., group_columns=True) of every "
            "file), or convert without group_columns to grow it in place")


def part_directory(root: str, part: Part) -> str:
    """The directory of part ``part`` of the directory of parts ``root``. Neither ``parts/``
    nor the part may be a link (CorruptStoreError): a manifest names what lies inside its
    directory, and copy, pack and verify would otherwise take in a directory elsewhere."""
    sub_path = os.path.join(root, *part.path.split("/"))
    for step in (os.path.join(root, PARTS_DIR), sub_path):
        if os.path.islink(step):
            raise CorruptStoreError(f"{step} is a symbolic link; a dataset directory's parts "
                                    "lie inside it (replace the link with the directory)")
    return sub_path


def part_columns(root: str, part: Part, columns: Sequence[Column]) -> list[Column]:
    """``columns`` (of the manifest of the directory of parts ``root``) as the manifest of its
    part ``part`` describes them (each with its own ``store``), checked as :func:`open_dataset`
    checks them: the part holds the rows the directory's manifest says, has no parts of its
    own, and has every column with the same kind, dtype and item shape (CorruptStoreError)."""
    sub_path = part_directory(root, part)
    sub = read_manifest(sub_path)
    if sub.rows != part.rows or sub.parts:
        raise CorruptStoreError(f"{sub_path}: the part holds {sub.rows} rows"
                                f"{' in parts of its own' if sub.parts else ''}; the "
                                f"manifest of {root} says {part.rows}")
    own_columns = {c.name: c for c in sub.columns}
    found = []
    for col in columns:
        own = own_columns.get(col.name)
        if own is None or (own.kind, own.dtype, own.item_shape) != (
                col.kind, col.dtype, col.item_shape):
            raise CorruptStoreError(f"{sub_path} has no column {col.name!r} of "
                                    f"{col.kind} {col.dtype.str}{col.item_shape}")
        found.append(own)
    return found


@dataclass(frozen=True)
class ColumnStore:
    """One store of a dataset directory: the column it holds, as the manifest that names the
    store describes it (``column.store`` is the store's directory), the part it is in (None in
    a directory of columns), its path inside the dataset directory (``/``-separated: ``label``,
    ``parts/00000/label``) and the rows the manifests say it holds."""

    column: Column
    part: Part | None
    path: str
    rows: int


def column_stores(path: str | os.PathLike[str],
                  manifest: Manifest | None = None) -> list[ColumnStore]:
    """Every store of the dataset directory ``path`` (whose manifest is ``manifest``, read when
    None): part by part in manifest order, column by column within each. The parts' manifests
    are read and checked (:func:`part_columns`); the stores themselves are not opened."""
    path = os.path.abspath(os.fspath(path))
    manifest = read_manifest(path) if manifest is None else manifest
    if not manifest.parts:
        return _unit_stores(manifest, None, manifest.columns, manifest.rows)
    found = []
    for part in manifest.parts:
        owns = part_columns(path, part, manifest.columns)
        sub = read_manifest(part_directory(path, part))
        found += _unit_stores(sub, part, owns, part.rows)
    return found


def _unit_stores(manifest: Manifest, part: Part | None, columns: Sequence[Column],
                 rows: int) -> list[ColumnStore]:
    """The stores of one directory of columns: each ungrouped column's, then each group's
    block store (as :func:`group_store_column` describes it, holding its rows' blocks)."""
    where = "" if part is None else f"{part.path}/"
    stores = [ColumnStore(c, part, where + c.store, rows) for c in columns if c.group is None]
    for k, g in enumerate(manifest.groups):
        stores.append(ColumnStore(group_store_column(g, k), part, where + g.store,
                                  g.blocks(rows)))
    return stores


def group_store_column(group: Group, k: int) -> Column:
    """Group ``k``'s block store described as a column: ragged ``uint8`` records (its blocks),
    named ``<column group k>``; its records are the group's blocks, not rows."""
    return Column(f"<column group {k}>", group.store, "ragged", np.dtype(np.uint8), (),
                  group.codec, {"group": k})


def _choose(manifest: Manifest, columns: Sequence[str] | None) -> list[Column]:
    if columns is None:
        return list(manifest.columns)
    if isinstance(columns, str):
        raise LoaderxTypeError(f"columns must be a list of names, got the string {columns!r} "
                               f"(write columns=[{columns!r}])")
    chosen = [manifest.column(name) for name in columns]
    if len({c.name for c in chosen}) != len(chosen):
        raise LoaderxValueError(f"columns names a column twice: {list(columns)!r}")
    return chosen


def _open_store(root: str, col: Column, rows: int, verify_reads: bool,
                opened: list[Any] | None = None,
                pin: tuple[str, str] | None = None) -> Dataset:
    """Column ``col``'s store in ``root``, of ``rows`` records; with ``pin`` (the dataset
    directory and its generation: "" for a manifest of version 1), pinned to them (records
    past ``rows`` are an append not committed, or committed after this open)."""
    store = os.path.join(root, col.store)
    if os.path.islink(store) or not os.path.isdir(store):
        raise CorruptStoreError(f"{store}: the store of column {col.name!r} is missing (or is "
                                "a link); the dataset directory is incomplete")
    cls = DenseDataset if col.kind == "dense" else RaggedDataset
    # A version-1 manifest (no generation) is never appended to in place: its stores must hold
    # its rows exactly (records past them were appended to this column alone); the dataset is
    # pinned to them once checked.
    v1 = pin is not None and not pin[1]
    try:
        ds = cls(store, verify_reads=verify_reads,
                 _pin=None if pin is None or v1 else (rows, *pin))
    except DatasetError as e:
        raise CorruptStoreError(f"column {col.name!r}: {e}") from None
    if (ds.dtype, ds.item_shape) != (col.dtype, col.item_shape) or len(ds) != rows:
        found = f"{len(ds)} {ds.dtype.str}{ds.item_shape} records"
        how = "" if (ds.dtype, ds.item_shape) != (col.dtype, col.item_shape) else \
            _row_count_hint(root, len(ds), rows)
        ds.close()
        raise CorruptStoreError(f"{store}: column {col.name!r} holds {found}; the manifest "
                                f"says {rows} {col.dtype.str}{col.item_shape}{how}")
    if v1 and pin is not None:
        ds._pin = (rows, *pin)
    if opened is not None:
        opened.append(ds)
    return ds


def _row_count_hint(root: str, found: int, rows: int) -> str:
    """What a column store of another row count than its manifest's means, and the repair."""
    if found > rows:
        return (f". Records were appended to this column's store alone, not to the dataset "
                f"(the dataset's rows are its first {rows}); "
                f"loaderx.intake.repair_dataset({root!r}) removes the others -- append to "
                "every column at once with loaderx.intake.append_dataset")
    return (". Records were deleted from this column's store alone, so its rows no longer "
            "line up with the other columns'; restore the dataset from a copy, or convert it "
            "again -- delete from every column at once with loaderx.intake.delete_rows")


def decode_strings(records: Any) -> Any:
    """The text of a string column's records: one ``uint8`` array (or bytes) gives a ``str``,
    a list of them a list of ``str`` (a batch of a string column, as the DataLoader gives it).
    The bytes are the column's UTF-8 exactly as written, so this never fails on data a
    converter wrote."""
    if isinstance(records, (bytes, bytearray, memoryview, np.ndarray)):
        return _decode_one(records)
    return [_decode_one(r) for r in records]


def _decode_one(rec: Any) -> str:
    raw = rec.tobytes() if isinstance(rec, np.ndarray) else bytes(rec)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptStoreError(f"a string record is not valid UTF-8 ({e}); the store was "
                                "altered after conversion (run `loaderx verify` on it)") from None


def _column_class_names(path: str, column: str | None = None) -> list[str] | None:
    """The class names of the labels in the store ``path`` when it is the store of a column of
    a dataset directory whose manifest names them (``"classes"``), or of the column ``column``
    of the dataset directory ``path``; None otherwise."""
    if column is not None:
        try:
            names = read_manifest(path).column(column).extra.get("classes")
        except (LoaderxError, OSError, KeyError):
            return None
        return names if isinstance(names, list) else None
    if dataset_column(path) is None:
        return None
    try:
        manifest = read_manifest(os.path.dirname(os.path.abspath(path)))
    except (LoaderxError, OSError):
        return None  # a damaged manifest: opening the dataset says what is wrong
    store = os.path.basename(os.path.abspath(path))
    for col in manifest.columns:
        if col.store == store:
            names = col.extra.get("classes")
            return names if isinstance(names, list) else None
    return None


register_class_names(_column_class_names)  # ConcatDataset refuses mismatched labels


# -- writing -------------------------------------------------------------------------------------


class RaggedBatch(NamedTuple):
    """Records of a ragged column in the layout Arrow uses: ``values`` holds the rows of all
    records one after another (shape ``(m, *item_shape)``), record ``i`` is
    ``values[bounds[i]:bounds[i + 1]]`` (``bounds``: ``n + 1`` non-decreasing integers, the
    first need not be 0)."""

    values: np.ndarray
    bounds: np.ndarray


def store_name(name: str, index: int, taken: Iterable[str]) -> str:
    """The directory name of column ``name`` (the ``index``-th), given the names ``taken`` by
    earlier columns (see the module docstring)."""
    lowered = {t.lower() for t in taken}
    if _SAFE_NAME.match(name) and name not in _RESERVED_NAMES and name.lower() not in lowered:
        return name
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name.encode("ascii", "ignore").decode())[:40]
    return f"_{index}_{safe}"


@dataclass
class _ColumnWriter:
    column: Column
    codec: Codec
    row_bytes: int  # bytes of one dense record, or of one row of a ragged record
    dict_size: int | None
    adaptive: bool = False  # the codec is the writer's: settled by a trial on the first rows
    store: Zrecord | None = None


@dataclass
class _GroupWriter:
    """The column group being written: its manifest entry, its columns (their places in the
    writer's column list and in the rows), the block store's writer, and the rows of the
    current part not yet in a full block."""

    group: Group
    members: list[int]
    fields: list[GroupField]
    writer: _ColumnWriter
    pending: np.ndarray  # (k, row_bytes) uint8, k < block_rows

    def rows_of(self, prepared: Sequence[tuple[np.ndarray, np.ndarray]], start: int,
                count: int) -> np.ndarray:
        """Rows ``start : start + count`` of a prepared batch, packed as the group lays them."""
        arrays = []
        for i, f in zip(self.members, self.fields, strict=True):
            nb = f.nbytes
            blob = prepared[i][0][start * nb:(start + count) * nb]
            arrays.append(blob.view(f.dtype).reshape(count, *f.item_shape))
        return pack_rows(self.group.layout, self.fields, arrays)

    def add(self, rows: np.ndarray) -> None:
        """Appends the full blocks of the pending rows and ``rows``; the rows left over (fewer
        than a block) stay pending: they become the manifest's tail of the group."""
        assert self.writer.store is not None
        rows = np.concatenate([self.pending, rows]) if len(self.pending) else rows
        per = self.group.block_rows
        full = len(rows) // per * per
        if full:
            offsets = np.arange(full // per, dtype=np.uint64) * np.uint64(
                per * self.group.row_bytes)
            # The engine's call: the Python one refuses a dataset column's store (an append to
            # one column alone), and this is an append to every column at once.
            self.writer.store._native.append(np.ascontiguousarray(rows[:full]).reshape(-1),
                                             offsets, self.group.codec)
        self.pending = rows[full:].copy()

    def closed(self) -> Group:
        """The group's manifest entry for the rows appended so far (the pending ones its tail)."""
        return dataclasses.replace(self.group, tail=self.pending.tobytes())


class DirectoryWriter:
    """Writes a dataset directory at ``dst`` as one transaction (see the module docstring)::

        with DirectoryWriter(dst) as w:
            w.add_column("label", "dense", np.int64)
            w.add_column("text", "ragged", np.uint8, extra={"string": True})
            w.append({"label": np.array([1, 2]), "text": [b"ab", b"c"]})
        # dst is complete here, or absent (or the old dataset) if anything failed

    ``overwrite=True`` replaces a dataset directory or a loaderx store already at ``dst``
    (nothing else: a directory of other files is refused); without it an existing ``dst``
    is refused before any work. ``codec`` is the default of :meth:`add_column`;
    ``checksums=True`` keeps a checksum of every record (``loaderx verify``); ``extra`` is the
    directory's extra keys. ``rows_per_part`` (default and at most 2**24, the records one
    store holds) starts a new part when a part is full, so any number of rows fits.

    ``group_columns=True`` stores the fixed-width columns that are raw (dense records under
    :data:`loaderx.converter.AUTO_RAW_BELOW` bytes, or declared ``codec="raw"``) together, in one
    *column group* (:mod:`loaderx._views.group`): rows in blocks of about 64 KiB, one table
    entry a block, read for all its columns in one native call. Without other columns such a
    directory holds up to 2**24 blocks of rows (no parts).

    Leaving the ``with`` normally commits (:meth:`commit`); an exception aborts
    (:meth:`abort`), as does a writer that is garbage collected uncommitted."""

    def __init__(self, dst: str | os.PathLike[str], *, overwrite: bool = False,
                 codec: Codec = "zstd", checksums: bool = False,
                 extra: Mapping[str, Any] | None = None,
                 rows_per_part: int | None = None, group_columns: bool = False) -> None:
        self.dst = os.path.abspath(os.fspath(dst))
        self.group_columns = bool(group_columns)
        self._part_groups: tuple[Group, ...] = ()  # the last closed part's groups
        self._rows_per_part_given = rows_per_part is not None
        self._group: _GroupWriter | None = None
        self._behind: Future[None] | None = None  # the batch being written behind the caller
        self._behind_pool: ThreadPoolExecutor | None = None
        self.codec: Codec = _store_codec(codec)
        self.checksums = bool(checksums)
        self.extra = dict(extra or {})
        limit = MAX_RECORDS if rows_per_part is None else rows_per_part
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_RECORDS:
            raise LoaderxValueError(f"rows_per_part must be an int in 1..{MAX_RECORDS}, got "
                                    f"{rows_per_part!r}")
        self.rows_per_part = limit
        self.overwrite = bool(overwrite)
        self._writers: list[_ColumnWriter] = []
        self._part_rows: list[int] = []  # rows of each part, the last one being written
        self._state = "open"  # open -> writing -> committed | aborted
        self._pool: ThreadPoolExecutor | None = None  # the columns' threads, made when needed
        self._stack = contextlib.ExitStack()
        staging.remove_stale(self.dst)
        self._old = claim_destination(self.dst, self.overwrite)
        try:
            self._staging = self._stack.enter_context(staging.private_dir(self.dst, "intake"))
        except BaseException:
            self._release_old()
            raise

    def _release_old(self) -> None:
        release_stores(self._old)
        self._old = []

    # -- columns -----------------------------------------------------------------------------

    def add_column(self, name: str, kind: str, dtype: Any, item_shape: Sequence[int] = (), *,
                   codec: Codec | None = None, extra: Mapping[str, Any] | None = None,
                   dict_size: int | None = None) -> None:
        """Declares column ``name``: ``kind`` ``"dense"`` (records of shape ``item_shape``)
        or ``"ragged"`` (records of shape ``(n_i, *item_shape)``), of ``dtype``. All columns
        are declared before the first :meth:`append`. ``extra`` goes into the manifest
        (:meth:`set_extra` changes it until the commit); ``codec`` defaults to the writer's;
        ``dict_size`` caps a ``zstd_dict`` dictionary, trained on the first batch."""
        self._check_state("open", "add_column")
        if not isinstance(name, str):
            raise LoaderxTypeError(f"a column name must be a str, got {name!r}")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise LoaderxValueError(f"column name {name!r} is not valid Unicode text (it holds "
                                    "a lone surrogate); decode it properly first") from None
        if any(w.column.name == name for w in self._writers):
            raise DatasetError(f"column {name!r} is declared twice; column names must be "
                               "unique (rename one)")
        if len(self._writers) >= MAX_COLUMNS:
            raise LimitExceededError(f"more than {MAX_COLUMNS} columns; choose fewer")
        if kind not in _schema.KINDS:
            raise LoaderxValueError(f"column {name!r}: kind must be 'dense' or 'ragged', got "
                                    f"{kind!r}")
        dt = _schema.check_dtype(dtype, f"column {name!r}")
        if isinstance(item_shape, (int, np.integer)):
            item_shape = (int(item_shape),)
        shape = tuple(int(d) for d in item_shape)
        if any(d < 0 for d in shape) or len(shape) > _schema.MAX_ITEM_DIMS:
            raise LoaderxValueError(f"column {name!r}: item_shape {shape} is not a shape")
        row_bytes = math.prod(shape) * dt.itemsize
        if row_bytes > MAX_RECORD_BYTES:
            what = "record" if kind == "dense" else "row of a record"
            raise LimitExceededError(f"column {name!r}: one {what} of {dt.str}{shape} is "
                                     f"{row_bytes} bytes, over the {MAX_RECORD_BYTES}-byte "
                                     "record limit")
        chosen = self.codec if codec is None else _store_codec(codec)
        adaptive = codec is None and chosen == "zstd"
        if codec is None and kind == "dense" and row_bytes < AUTO_RAW_BELOW:
            chosen, adaptive = "raw", False  # small records: raw (see the module docstring)
        store = store_name(name, len(self._writers), (w.column.store for w in self._writers))
        column = Column(name, store, kind, dt, shape, chosen, dict(extra or {}))
        Manifest(0, (column,)).to_bytes()  # extra that cannot be written fails here, not later
        self._writers.append(_ColumnWriter(column, chosen, row_bytes, dict_size, adaptive))

    def set_extra(self, name: str, extra: Mapping[str, Any]) -> None:
        """Replaces the manifest's extra keys of column ``name`` (e.g. label class names
        found while writing); allowed until the commit."""
        self._check_state(("open", "writing"), "set_extra")
        for w in self._writers:
            if w.column.name == name:
                col = w.column
                w.column = Column(col.name, col.store, col.kind, col.dtype, col.item_shape,
                                  col.codec, dict(extra), col.group, col.offset)
                Manifest(0, (w.column,)).to_bytes()
                return
        raise DatasetError(f"no column {name!r} was declared")

    @property
    def columns(self) -> list[Column]:
        """The columns declared so far, in order."""
        return [w.column for w in self._writers]

    def _owners(self) -> list[_ColumnWriter]:
        """The writers of a store each: the columns of their own, then the group's."""
        own = [w for w in self._writers if w.column.group is None]
        return own + ([self._group.writer] if self._group is not None else [])

    def _plan_group(self) -> None:
        """Puts the raw fixed-width columns into one column group (``group_columns=True``),
        once the codecs are settled: before the first part is made."""
        if not self.group_columns:
            return
        members, fields, width = [], [], 0
        for i, w in enumerate(self._writers):
            col = w.column
            if col.kind != "dense" or w.codec != "raw" or not 0 < w.row_bytes <= \
                    MAX_GROUP_ROW_BYTES or width + w.row_bytes > MAX_GROUP_ROW_BYTES * 16:
                continue
            members.append(i)
            fields.append((col.name, col.dtype, col.item_shape))
            width += w.row_bytes
        if not members:
            return
        layout, placed = plan_layout(fields)
        group = Group("_group_0", layout.row_bytes, layout.block_rows, "raw")
        for i, f in zip(members, placed, strict=True):
            col = self._writers[i].column
            self._writers[i].column = Column(col.name, group.store, col.kind, col.dtype,
                                             col.item_shape, "raw", col.extra, 0, f.offset)
        store = Column("", group.store, "ragged", np.dtype(np.uint8), (), "raw",
                       {"group": 0})
        self._group = _GroupWriter(group, members, placed,
                                   _ColumnWriter(store, "raw", 1, None),
                                   np.zeros((0, layout.row_bytes), np.uint8))
        if len(members) == len(self._writers) and not self._rows_per_part_given:
            self.rows_per_part = MAX_RECORDS * layout.block_rows

    @property
    def rows(self) -> int:
        """Rows appended so far (every column has them)."""
        return sum(self._part_rows)

    # -- rows --------------------------------------------------------------------------------

    def append(self, batch: Mapping[str, _DATA]) -> int:
        """Appends one batch of rows to every column and returns the row count so far.

        ``batch`` maps every declared column to its records: for a dense column an array of
        shape ``(n, *item_shape)`` and exactly the column's dtype (nothing is cast); for a
        ragged column a :class:`RaggedBatch`, or a sequence of arrays ``(n_i, *item_shape)``
        or bytes-like objects (``uint8`` columns). Every column gets the same ``n``. All of it
        is checked before anything is written, so a refused batch (DatasetError,
        LimitExceededError) writes nothing; a failure while writing leaves the writer unusable
        (the transaction is then aborted)."""
        self._check_state(("open", "writing"), "append")
        if not self._writers:
            raise DatasetError("append before any add_column: declare the columns first")
        if not isinstance(batch, Mapping):
            raise LoaderxTypeError(f"append takes a dict of column -> records, got "
                                   f"{type(batch).__name__}")
        names = {w.column.name for w in self._writers}
        unknown = [k for k in batch if k not in names]
        missing = [n for n in names if n not in batch]
        if unknown or missing:
            raise DatasetError("a batch must hold every column and no other: "
                               + "; ".join(filter(None, [
                                   f"missing {missing!r}" if missing else "",
                                   f"unknown {unknown!r}" if unknown else ""])))
        prepared = [_prepare(w, batch[w.column.name]) for w in self._writers]
        counts = {w.column.name: len(bounds) - 1
                  for w, (_, bounds) in zip(self._writers, prepared, strict=True)}
        if len(set(counts.values())) > 1:
            raise DatasetError(f"the columns of a batch must have one row count, got {counts}")
        n = next(iter(counts.values()))
        first = self._state == "open"
        self._state = "broken"  # until the appends below are all done
        if first:
            for w, (blob, bounds) in zip(self._writers, prepared, strict=True):
                if w.adaptive:
                    self._settle_codec(w, blob, bounds)
            self._plan_group()
            self._new_part()
        done = 0
        while done < n:
            space = self.rows_per_part - self._part_rows[-1]
            if space == 0:
                self._close_part()
                self._new_part()
                space = self.rows_per_part
            take = min(space, n - done)

            def append(w: _ColumnWriter, p: Any, d: int = done, t: int = take) -> None:
                if isinstance(p, np.ndarray):  # the group's packed rows
                    assert self._group is not None
                    self._group.add(p)
                else:
                    _append_slice(w, p[0], p[1], d, t)

            work: list[Any] = [p for w, p in zip(self._writers, prepared, strict=True)
                               if w.column.group is None]
            if self._group is not None:
                work.append(self._group.rows_of(prepared, done, take))
            # Written behind: the stores take this batch (GIL released) while the caller
            # reads, converts and packs the next one; the next append waits for it first.
            self._wait_behind()
            if self._behind_pool is None:
                self._behind_pool = ThreadPoolExecutor(1, thread_name_prefix="loaderx-write")
            self._behind = self._behind_pool.submit(self._each, append, work)
            self._part_rows[-1] += take
            done += take
        self._state = "writing"
        return self.rows

    def _settle_codec(self, w: _ColumnWriter, blob: np.ndarray, bounds: np.ndarray) -> None:
        """Stores column ``w`` raw when zstd shrinks a trial sample of its first records by
        less than :data:`MIN_SAVING` (see the module docstring)."""
        n = len(bounds) - 1
        picks = np.unique(np.linspace(0, n - 1, min(n, SAMPLE_RECORDS)).astype(np.int64)) \
            if n else np.zeros(0, np.int64)
        sizes = (bounds[picks + 1] - bounds[picks]).astype(np.uint64)
        if not int(sizes.sum()):
            return
        if int(sizes.sum()) < AUTO_RAW_BELOW * len(picks):  # small on average: raw
            self._store_raw(w)
            return
        sample = np.concatenate([blob[int(bounds[i]):int(bounds[i + 1])] for i in picks])
        offsets = np.zeros(len(picks), np.uint64)
        np.cumsum(sizes[:-1], out=offsets[1:])
        trial = os.path.join(self._staging, ".codec-trial")
        try:
            with Zrecord(trial, codec="zstd") as z:
                z.append(sample, offsets)
                stored = z.stats()["live_bytes"]
        finally:
            shutil.rmtree(trial, ignore_errors=True)  # inside our private directory
        if stored > (1 - MIN_SAVING) * int(sizes.sum()):
            self._store_raw(w)

    @staticmethod
    def _store_raw(w: _ColumnWriter) -> None:
        col = w.column
        w.codec = "raw"
        w.column = Column(col.name, col.store, col.kind, col.dtype, col.item_shape, "raw",
                          col.extra, col.group, col.offset)

    # -- parts -------------------------------------------------------------------------------

    def _part_dir(self, k: int) -> str:
        return os.path.join(self._staging, PARTS_DIR, f"{k:05d}")

    def _new_part(self) -> None:
        if len(self._part_rows) >= MAX_PARTS:
            raise LimitExceededError(f"more than {MAX_PARTS} parts of {self.rows_per_part} "
                                     "rows; write fewer rows")
        part = self._part_dir(len(self._part_rows))
        os.makedirs(part)
        if self._group is not None:
            self._group.pending = self._group.pending[:0]

        def create(w: _ColumnWriter, _: object) -> None:
            col = w.column
            path = os.path.join(part, col.store)
            w.store = Zrecord(path, codec=w.codec)
            # Written before any record: a store with records always says what they are.
            _schema.write(path, _schema.Schema(col.kind, col.dtype, col.item_shape, w.codec,
                                               {"column": col.name} if col.name or not
                                               col.extra else dict(col.extra)))
            if self.checksums:
                w.store.enable_checksums()

        self._each(create)
        self._part_rows.append(0)

    def _close_part(self) -> None:
        """Syncs and closes the stores of the part being written and writes its manifest."""
        part = self._part_dir(len(self._part_rows) - 1)
        self._wait_behind()
        self._part_groups = (self._group.closed(),) if self._group is not None else ()
        self._each(lambda w, _: w.store.sync())  # type: ignore[union-attr]
        rows = self._part_rows[-1]
        for w in self._owners():
            assert w.store is not None
            grouped = self._group is not None and w is self._group.writer
            want = self._group_blocks(rows) if grouped else rows
            if len(w.store) != want:  # a bug, not bad input
                raise InternalError(f"column {w.column.name!r} has {len(w.store)} records in "
                                    f"{part}, not {want}")
            w.store.close()
            w.store = None
        _native.replace_file(part, MANIFEST_FILE, Manifest(
            rows, tuple(self.columns), (), self.extra, self._part_groups,
            self._generation).to_bytes())
        staging.fsync_dir(part)

    # -- the end -----------------------------------------------------------------------------

    def commit(self) -> int:
        """Makes everything durable and puts the dataset directory at ``dst`` atomically;
        returns its row count. Columns declared but never appended to get zero rows."""
        self._check_state(("open", "writing"), "commit")
        try:
            if self._state == "open":
                self._plan_group()
                self._new_part()
            self._state = "broken"
            Manifest(0, tuple(self.columns), (), self.extra).to_bytes()  # fails before syncing
            self._close_part()
            root = self._staging
            parts_root = os.path.join(root, PARTS_DIR)
            if len(self._part_rows) == 1:
                # One part: its stores become the directory's own.
                only = self._part_dir(0)
                for w in self._owners():
                    store = w.column.store
                    os.rename(os.path.join(only, store), os.path.join(root, store))
                os.unlink(os.path.join(only, MANIFEST_FILE))
                os.rmdir(only)
                os.rmdir(parts_root)
                manifest = Manifest(self._part_rows[0], tuple(self.columns), (), self.extra,
                                    self._part_groups, self._generation)
            else:
                staging.fsync_dir(parts_root)
                manifest = Manifest(self.rows, tuple(self.columns), tuple(
                    Part(f"{PARTS_DIR}/{k:05d}", r) for k, r in enumerate(self._part_rows)),
                    self.extra, (), self._generation, self._group is not None)
            # The manifest last: with it the directory is complete.
            _native.replace_file(root, MANIFEST_FILE, manifest.to_bytes())
            self._publish()
        except BaseException:
            self.abort()
            raise
        self._state = "committed"
        self._finish()
        return manifest.rows

    def _publish(self) -> None:
        put_in_place(self._staging, self.dst, self._old)

    def _wait_behind(self) -> None:
        """Waits for the batch written behind the caller; its failure breaks the writer."""
        behind, self._behind = self._behind, None
        if behind is None:
            return
        try:
            behind.result()
        except BaseException:
            self._state = "broken"
            raise

    def _group_blocks(self, rows: int) -> int:
        assert self._group is not None
        return self._group.group.blocks(rows)

    @property
    def _generation(self) -> str:
        """The generation of the directory being written (a grouped one has one: version 2)."""
        if self._group is None:
            return ""
        if not hasattr(self, "_gen"):
            self._gen = os.urandom(8).hex()
        return self._gen

    def abort(self) -> None:
        """Gives up: removes everything written; ``dst`` is left as it was."""
        if self._state in ("committed", "aborted"):
            return
        with contextlib.suppress(BaseException):
            self._wait_behind()  # nothing may write while the stores close
        for w in self._owners():
            if w.store is not None:
                with contextlib.suppress(Exception):
                    w.store.close()
                w.store = None
        self._state = "aborted"
        self._finish()

    def _each(self, work: Callable[[_ColumnWriter, Any], None],
              args: Sequence[Any] | None = None) -> None:
        """Runs ``work(writer, args[i])`` for every column's writer, on the columns' threads
        when there are several (each store's calls wait on the disk, and release the GIL), and
        returns once every one has: then raises the first error, in column order."""
        owners = self._owners()
        pairs = list(zip(owners, args if args is not None else [None] * len(owners),
                         strict=True))
        if len(pairs) < 2:
            for w, a in pairs:
                work(w, a)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(min(COLUMN_THREADS, len(pairs)),
                                            thread_name_prefix="loaderx-columns")
        futures = [self._pool.submit(work, w, a) for w, a in pairs]
        wait(futures)
        for f in futures:
            f.result()

    def _finish(self) -> None:
        try:
            if self._behind_pool is not None:
                self._behind_pool.shutdown(wait=True)
                self._behind_pool = None
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            self._release_old()
        finally:
            self._stack.close()  # removes the staging directory unless it was published

    def _check_state(self, allowed: str | tuple[str, ...], what: str) -> None:
        if self._state in ((allowed,) if isinstance(allowed, str) else allowed):
            return
        if self._state in ("committed", "aborted"):
            raise StoreClosedError(f"{what}: the writer of {self.dst} was already "
                                   f"{self._state}")
        if self._state == "broken":
            raise DatasetError(f"{what}: an earlier write to {self.dst} failed; the writer "
                               "cannot continue (abort it and start again)")
        raise DatasetError(f"{what} after the first append: declare every column before "
                           "appending rows")

    def __enter__(self) -> DirectoryWriter:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self.abort()
        elif self._state not in ("committed", "aborted"):
            self.commit()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.abort()


# -- the destination of a write -----------------------------------------------------------------


def claim_destination(dst: str, overwrite: bool) -> list[Zrecord]:
    """Refuses a destination ``dst`` (absolute) that a new dataset directory may not take (see
    :class:`DirectoryWriter`); with ``overwrite=True`` returns the stores of the dataset or
    store being replaced, each held under its writer lock (so nobody appends to what is about
    to vanish, and its readers learn of the replacement): give them to :func:`put_in_place`,
    and to :func:`release_stores` in the end."""
    if not os.path.lexists(dst):
        return []
    if os.path.islink(dst):
        raise DatasetError(f"{dst} is a symbolic link; write to its target "
                           f"({os.path.realpath(dst)}) or remove the link")
    if not os.path.isdir(dst):
        raise DatasetError(f"{dst} exists and is not a directory; choose another path")
    if not os.listdir(dst):
        if staging.is_mount_point(dst):
            raise DatasetError(f"{dst} is a mount point, which cannot be renamed onto; "
                               "write the dataset directory into a new directory inside it")
        return []
    known = is_dataset_directory(dst) or _schema.is_store(dst)
    if not overwrite:
        what = "a dataset" if known else "a non-empty directory that is not a dataset"
        raise DatasetError(f"{dst} already holds {what}; pass overwrite=True to replace "
                           "it, or choose another path" if known else
                           f"{dst} is {what}; refusing to write into it")
    if not known:
        raise DatasetError(f"{dst} is a non-empty directory that is not a loaderx dataset; "
                           "overwrite=True replaces only datasets: remove it yourself")
    if staging.is_mount_point(dst):
        raise DatasetError(f"{dst} is a mount point: it cannot be swapped for a new "
                           "dataset; remove its files first, or choose another path")
    return _lock_stores(dst)


def put_in_place(built: str, dst: str, old: Sequence[Zrecord]) -> None:
    """Publishes the private directory ``built`` (from :func:`loaderx.staging.private_dir`
    beside ``dst``, complete and synced) at ``dst``: renamed onto nothing, or, when ``old``
    holds the stores :func:`claim_destination` locked, swapped for what is there atomically,
    the old stores retired (their readers learn that the dataset was replaced)."""
    try:
        if old:
            def retire_old() -> None:
                for z in old:
                    z._retire()

            staging.replace(built, dst, swapped=retire_old)
        else:
            staging.publish(built, dst)
    except OSError as e:
        if e.errno == errno.EBUSY:
            raise DatasetError(f"{dst} cannot be replaced ({e.strerror}): it is a "
                               "mount point or in use; nothing was changed there") from None
        raise


def release_stores(stores: Iterable[Zrecord]) -> None:
    """Closes the stores :func:`claim_destination` locked (each once; errors ignored: they
    may have been replaced)."""
    for z in stores:
        with contextlib.suppress(Exception):
            z.close()


def _lock_stores(dst: str) -> list[Zrecord]:
    """Every store of the dataset (or the single store) at ``dst``, write-locked."""
    paths = [dst] if _schema.is_store(dst) else list(_store_paths(dst))
    held: list[Zrecord] = []
    try:
        for p in paths:
            z = Zrecord(p)
            held.append(z)
            z.lock_for_writing()
    except BaseException:
        for z in held:
            with contextlib.suppress(Exception):
                z.close()
        raise
    return held


def _store_paths(root: str) -> Iterator[str]:
    """The store directories a dataset directory's manifest names (recursively into parts);
    a manifest that cannot be read names none (the directory is still replaced)."""
    try:
        manifest = read_manifest(root)
    except (DatasetError, CorruptStoreError):
        return
    stores = [c.store for c in manifest.columns if c.group is None] + \
        [g.store for g in manifest.groups]
    for store in stores:
        if not manifest.parts and _schema.is_store(os.path.join(root, store)):
            yield os.path.join(root, store)
    for part in manifest.parts:
        yield from _store_paths(os.path.join(root, *part.path.split("/")))


# -- stores joined into one (appending, deleting, assembling parts) -----------------------------

#: What ``link`` fails with where hard links cannot be made (another file system, one that has
#: none, or a limit on links per file): the records are then copied, or the parts moved in.
NO_LINKS = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP})


def chunks_of(store: str) -> int:
    """One past the highest chunk file number in ``store``: at least the chunks it uses."""
    numbers = [n for n in map(chunk_number, os.listdir(store)) if n is not None]
    return max(numbers, default=-1) + 1


def store_groups(sizes: Iterable[tuple[int, int]], *, max_rows: int,
                 max_chunks: int) -> list[list[int]]:
    """Indices of consecutive units, each ``(rows, chunks)``, in groups that fit one store
    (``max_rows`` records and ``max_chunks`` chunk files: the engine's
    :data:`~loaderx.zrecord.MAX_RECORDS` and :data:`~loaderx.zrecord.MAX_CHUNKS`, passed by
    the caller so that its tests can lower them); a unit larger than that is a group alone."""
    groups: list[list[int]] = [[]]
    rows = chunks = 0
    for k, (n, c) in enumerate(sizes):
        if groups[-1] and (rows + n > max_rows or chunks + c > max_chunks):
            groups.append([])
            rows = chunks = 0
        groups[-1].append(k)
        rows += n
        chunks += c
    return groups


def storeless(columns: Iterable[Column]) -> tuple[Column, ...]:
    """The columns as a directory of parts lists them: each part's manifest names its stores."""
    return tuple(Column(c.name, "", c.kind, c.dtype, c.item_shape, c.codec, c.extra)
                 for c in columns)


def _prepare(w: _ColumnWriter, data: Any) -> tuple[np.ndarray, np.ndarray]:
    """``data`` of column ``w`` as ``(bytes as uint8, n + 1 byte bounds)``, checked."""
    col = w.column
    if col.kind == "dense":
        arr = data if isinstance(data, np.ndarray) else np.asarray(data)
        if arr.dtype != col.dtype or tuple(arr.shape[1:]) != col.item_shape or arr.ndim == 0:
            raise DatasetError(f"column {col.name!r} takes {col.dtype.str} records of shape "
                               f"{col.item_shape}, got an array {arr.dtype.str}{arr.shape}")
        n = int(arr.shape[0])
        blob = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        return blob, np.arange(n + 1, dtype=np.uint64) * np.uint64(w.row_bytes)
    if isinstance(data, RaggedBatch):
        values = np.ascontiguousarray(data.values)
        if values.dtype != col.dtype or tuple(values.shape[1:]) != col.item_shape or \
                values.ndim == 0:
            raise DatasetError(f"column {col.name!r} takes {col.dtype.str} rows of shape "
                               f"{col.item_shape}, got values {values.dtype.str}{values.shape}")
        bounds = np.asarray(data.bounds)
        if bounds.ndim != 1 or len(bounds) == 0 or bounds.dtype.kind not in "iu":
            raise DatasetError(f"column {col.name!r}: bounds must be n + 1 integers")
        b = bounds.astype(np.int64)
        if (np.diff(b) < 0).any() or b[0] < 0 or b[-1] > len(values):
            raise DatasetError(f"column {col.name!r}: bounds must be non-decreasing and within "
                               f"the {len(values)} rows of values")
        blob = values[b[0]:b[-1]].reshape(-1).view(np.uint8)
        byte_bounds = ((b - b[0]) * w.row_bytes).astype(np.uint64)
    else:
        if isinstance(data, (str, bytes, bytearray, memoryview, np.ndarray)):
            raise DatasetError(f"column {col.name!r} is ragged: give a list of records or a "
                               f"RaggedBatch, not one {type(data).__name__}")
        recs = [_ragged_record(col, r) for r in data]
        sizes = np.fromiter((r.nbytes for r in recs), dtype=np.uint64, count=len(recs))
        byte_bounds = np.zeros(len(recs) + 1, dtype=np.uint64)
        np.cumsum(sizes, out=byte_bounds[1:])
        blob = (np.concatenate([r.reshape(-1).view(np.uint8) for r in recs]) if recs
                else np.empty(0, np.uint8))
    sizes = np.diff(byte_bounds)
    if len(sizes) and int(sizes.max()) > MAX_RECORD_BYTES:
        row = int(np.argmax(sizes))
        raise LimitExceededError(f"column {col.name!r}: a record of {int(sizes[row])} bytes "
                                 f"(row {row} of the batch), over the {MAX_RECORD_BYTES}-byte "
                                 "record limit")
    return blob, byte_bounds


def _ragged_record(col: Column, item: Any) -> np.ndarray:
    if isinstance(item, (bytes, bytearray, memoryview)):
        rec = np.frombuffer(item, dtype=np.uint8)
    elif isinstance(item, str) and col.is_string:
        rec = np.frombuffer(item.encode("utf-8"), dtype=np.uint8)
    elif isinstance(item, np.ndarray):
        rec = np.ascontiguousarray(item)
    else:
        raise DatasetError(f"column {col.name!r}: a ragged record must be an array or "
                           f"bytes-like (or str, for a string column), got "
                           f"{type(item).__name__}")
    if rec.dtype != col.dtype or rec.ndim == 0 or tuple(rec.shape[1:]) != col.item_shape:
        raise DatasetError(f"column {col.name!r} takes {col.dtype.str} records of shape "
                           f"(n, {', '.join(map(str, col.item_shape))}), got "
                           f"{rec.dtype.str}{rec.shape}".replace(", )", ")"))
    return rec


def _append_slice(w: _ColumnWriter, blob: np.ndarray, bounds: np.ndarray, start: int,
                  count: int) -> None:
    """Appends records ``start : start + count`` of a prepared column batch."""
    assert w.store is not None
    lo, hi = int(bounds[start]), int(bounds[start + count])
    offsets = bounds[start:start + count] - np.uint64(lo)
    if w.codec == "zstd_dict" and not w.store.has_dict():
        _train_dict(w, blob[lo:hi], np.diff(bounds[start:start + count + 1]))
    if count:
        # No sync until the part closes: the engine starts writing a large append's bytes to
        # the disk as it writes them, so that sync waits for little.
        w.store.append(blob[lo:hi], offsets)


#: zstd's own default dictionary size, the most an automatically sized one gets.
_MAX_AUTO_DICT = 112_640


def _train_dict(w: _ColumnWriter, blob: np.ndarray, sizes: np.ndarray) -> None:
    """Trains column ``w``'s dictionary on its first records (as the converters do)."""
    assert w.store is not None
    keep = sizes > 0
    total = int(sizes.sum())
    auto = min(_MAX_AUTO_DICT, max(1024, total // 50))
    target = auto if w.dict_size is None else min(auto, w.dict_size)
    try:
        w.store.train_dict(blob, sizes[keep].astype(np.uint64), max(target, 256))
    except Exception as e:
        raise LoaderxValueError(
            f"column {w.column.name!r}: cannot train a zstd dictionary on {int(keep.sum())} "
            f"records ({total} bytes): {e}; a dictionary needs many records -- use "
            "codec='zstd' for small data") from e
