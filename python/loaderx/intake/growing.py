"""Growing and shrinking a dataset directory: rows added to every column at once
(:func:`append_dataset`, and ``append=True`` of :func:`~loaderx.intake.files.from_image_folder`,
:func:`~loaderx.intake.files.from_webdataset` and :func:`~loaderx.intake.tables.from_arrow`),
rows deleted from every column at once (:func:`delete_rows`), each one transaction.

>>> import numpy as np, os, tempfile
>>> from loaderx.intake import DirectoryWriter, open_dataset
>>> root = tempfile.mkdtemp()
>>> for name, labels in (("a", [0, 1]), ("b", [1, 1, 0])):
...     with DirectoryWriter(os.path.join(root, name)) as w:
...         w.add_column("label", "dense", np.int64)
...         _ = w.append({"label": np.array(labels)})
>>> append_dataset(os.path.join(root, "a"), os.path.join(root, "b"))
5
>>> delete_rows(os.path.join(root, "a"), [0, 3])
3
>>> open_dataset(os.path.join(root, "a"))["label"][:].tolist()
[1, 1, 0]

**What an append checks.** The rows appended must have exactly the columns of the dataset
(by name; their order may differ), each of the same kind, dtype and item shape and with the
same meaning: the manifest's extra keys of each column that say how to read it -- ``string``,
``tz``, ``extension``, ``encoded``, ... -- must agree (``arrow_type``, ``classes`` and
``counts`` need not), and an image folder or WebDataset dataset takes only rows of the same
source. Anything else is a DatasetError naming the column and what differs, raised before
anything is written.

**Class names.** A column whose manifest names its classes (``"classes"``: an image folder's
``label``, a Hugging Face ``ClassLabel``) is matched *by name*: a class the dataset has keeps
its number, a class it lacks gets the next free number (new classes in sorted order, after
the existing ones), and the manifest's ``classes`` (and ``counts``, images per class) are
updated. Labels that name no class (negative: Hugging Face's ``-1`` for "no label") are kept;
a label past the new rows' own class list is refused. A column with classes on one side only
cannot be matched and is refused. The WebDataset ``__shard__`` column is renumbered after the
dataset's shards (the manifest's ``shards`` list grows). An image folder's ``path`` that the
dataset already holds is refused (:func:`~loaderx.intake.files.export_image_folder` writes each
path once): rename the new file.

**Deleting.** :func:`delete_rows` removes rows by index (or a boolean mask) from every column.
``keep_order=True`` (the default) keeps the other rows in their order: the rows after the first
deleted one are written again (their bytes are read and appended), so it costs about what
converting those rows costs. ``keep_order=False`` moves the last rows into the holes, as
:meth:`loaderx.zrecord.Zrecord.delete` does -- in a directory of parts, each part's own last
rows -- and writes nothing but record tables, however large the dataset. Either way the
manifest's row count and each column's ``counts`` follow. The deleted records' bytes stay in
the chunk files until ``loaderx compact`` runs on the column's store.

**One transaction, and what a kill leaves.** Nothing of the dataset is changed in place.
Holding the writer lock of every store of ``dst`` (another writer is refused at once,
StoreBusyError, and nobody can change it meanwhile), the new dataset is built in a private
directory beside ``dst`` (:func:`loaderx.staging.private_dir`): each column's store is made by
*joining* -- ``Zrecord.join_from``, which hard-links the chunk files of the old store and of
the new rows into it under new numbers and writes one record table -- so the old rows are not
copied; labels that change number are written again (a few bytes a row). Then the manifest is
written, last, and the directory is put in the place of ``dst`` in one atomic exchange
(:func:`loaderx.staging.replace`); the old stores are retired, so their open handles learn
that the dataset was replaced (StoreChangedError: open it again). A failure or a kill at any
point before the exchange leaves ``dst`` exactly as it was (the private directories are
removed then, or by the next write to ``dst``); after it, the new dataset is complete. So
``dst`` always opens as the old dataset or as the new one, never a mix: no column is ever
longer than another, and no manifest lies. The old stores' chunk files are shared with the new
ones until the old directory is removed (nothing writes them meanwhile). Rows appended by
:func:`append_dataset` are copied first (holes kept), so the dataset shares no file with
``src``, which may be changed or compacted later; a converter's rows are written privately and
linked, not copied.

Where a store cannot be joined -- a column with a zstd dictionary of its own, or a file system
without hard links -- its records are copied instead (the old store's files, holes kept, then
the new records read and appended). An append joins consecutive stores -- the dataset's (its
parts', in a directory of parts) and then the new rows' -- into one store per column while they
fit one (2^24 rows, 4096 chunk files), and starts a new part past that: the result is a
directory of columns when everything fits one store, else a directory of parts. A delete keeps
the layout (the same parts, each without its deleted rows). Each append adds chunk
files to each column (at least one), so after about 4000 appends the engine refuses the next
one (LimitExceededError): ``loaderx compact`` on a column's store packs its records into as
few chunk files as they fill.

The columns keep the codecs the dataset declared; a converter appending writes its rows with
them, and rows from :func:`append_dataset` keep the codec they were written with (every record
says how it is stored, so they read the same).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

import numpy as np

from loaderx import _native
from loaderx._store import schema as _schema
from loaderx._store import staging
from loaderx._store.sparse import copy_files
from loaderx.errors import (
    CorruptStoreError,
    DatasetError,
    LimitExceededError,
    LoaderxIndexError,
    LoaderxValueError,
    StoreChangedError,
)
from loaderx.intake.appending import has_commit_point
from loaderx.intake.directory import (
    MANIFEST_FILE,
    MAX_PARTS,
    NO_LINKS,
    PARTS_DIR,
    Column,
    DirectoryWriter,
    Manifest,
    Part,
    chunks_of,
    claim_destination,
    column_stores,
    is_dataset_directory,
    open_dataset,
    part_directory,
    put_in_place,
    read_manifest,
    refuse_grouped,
    release_stores,
    store_groups,
    store_name,
    storeless,
)
from loaderx.zrecord import MAX_CHUNKS, MAX_RECORDS, Codec, Zrecord

__all__ = ["append_dataset", "delete_rows", "repair_dataset", "append_converted", "Existing"]

#: Records and bytes read and appended at a time where records are copied.
_BLOCK_ROWS = 1 << 16
_BLOCK_BYTES = 32 << 20
#: Manifest keys of a column that may differ between a dataset and rows appended to it (what
#: the source's type was called, and the class names and counts, which are matched).
_FREE_EXTRA = frozenset({"classes", "counts", "arrow_type", "decoded_from", "storage_type"})
#: Dataset sources whose columns mean something beyond their types (exports, shard indices).
_OWN_SOURCES = ("image_folder", "webdataset")

R = TypeVar("R")


def _step(name: str) -> None:
    staging._step(name)  # the crash tests kill the process at these


# -- the dataset being changed ----------------------------------------------------------------


@dataclass
class _Held:
    """A dataset directory whose every store this process holds the writer lock of."""

    path: str
    manifest: Manifest
    stores: list[Zrecord]  # the locked handles, retired when the new dataset is in place
    by_path: dict[str, Zrecord]
    units: list[tuple[str, Manifest, dict[str, Column]]]  # _units of the dataset

    def checksums(self, column: str) -> bool:
        """Whether a store of ``column`` keeps record checksums."""
        return any(self.by_path[os.path.join(u, own[column].store)].has_checksums()
                   for u, _m, own in self.units)


@contextlib.contextmanager
def _holding(dst: str, what: str) -> Iterator[_Held]:
    """``dst`` under the writer locks of all its stores, checked as open_dataset checks it."""
    staging.remove_stale(dst)  # what an earlier kill left: its staging, a swap to finish
    if _schema.is_store(dst):
        raise DatasetError(f"{dst} is a single loaderx store, not a dataset directory: "
                           f"{what} is for dataset directories (from_numpy(..., append=True) "
                           "appends to a store, Zrecord.delete deletes from one)")
    refuse_grouped(dst, read_manifest(dst), what)  # not a dataset directory: says so
    stores = claim_destination(dst, overwrite=True)
    try:
        manifest = read_manifest(dst)  # again, under the locks: this is what is changed
        for ds in open_dataset(dst).values():  # every store as the manifest says, or refused
            ds.close()
        by_path = {os.path.abspath(z.path): z for z in stores}
        for cs in column_stores(dst, manifest):
            z = by_path.get(os.path.join(dst, *cs.path.split("/")))
            if z is None or len(z) != cs.rows:
                raise StoreChangedError(f"{dst} was replaced by another process while its "
                                        f"stores were being locked; run the {what} again")
        yield _Held(dst, manifest, stores, by_path, _units(dst, manifest))
    finally:
        release_stores(stores)


def _units(root: str, manifest: Manifest) -> list[tuple[str, Manifest, dict[str, Column]]]:
    """The directories whose stores hold the columns, in row order -- ``root`` itself, or each
    of its parts -- with their manifests and their own columns by name."""
    if not manifest.parts:
        return [(root, manifest, {c.name: c for c in manifest.columns})]
    found = []
    for p in manifest.parts:
        sub = part_directory(root, p)
        m = read_manifest(sub)
        found.append((sub, m, {c.name: c for c in m.columns}))
    return found


# -- appending ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Existing:
    """The dataset a conversion with ``append=True`` adds rows to (what a converter needs to
    write rows that fit it): its path and manifest, and whether its stores keep checksums
    (the new rows then get them too)."""

    path: str
    manifest: Manifest
    checksums: bool

    def codecs(self) -> dict[str, Codec]:
        """Each column's codec, as the dataset declared it."""
        return {c.name: cast(Codec, c.codec) for c in self.manifest.columns}

    def require_source(self, source: str, converter: str) -> None:
        """Refuses a dataset another kind of converter made (before anything is converted)."""
        theirs = self.manifest.extra.get("source")
        if theirs != source:
            raise DatasetError(f"{self.path} was made by {_made_by(theirs)}, not by "
                               f"{converter}: rows of another source cannot be appended to it "
                               "(convert them into a dataset of their own)")

    def require_columns(self, columns: Sequence[tuple[str, str, Any, Sequence[int]]],
                        source: str = "the rows to append") -> None:
        """Refuses columns (name, kind, dtype, item shape) that are not the dataset's."""
        _check_columns(self.path, self.manifest.columns, source, [
            Column(name, "", kind, np.dtype(dtype), tuple(shape), "raw")
            for name, kind, dtype, shape in columns], check_extra=False)


def _made_by(source: Any) -> str:
    return {"image_folder": "from_image_folder", "webdataset": "from_webdataset",
            "parquet": "from_arrow", "arrow": "from_arrow",
            "huggingface": "from_arrow"}.get(source, f"a writer of source {source!r}")


def append_dataset(dst: str | os.PathLike[str], src: str | os.PathLike[str]) -> int:
    """Appends the rows of the dataset directory ``src`` to the dataset directory ``dst``,
    every column at once, in one transaction, and returns ``dst``'s new row count.

    ``src`` must have the same columns (see the module docstring: names, kinds, dtypes, item
    shapes, meaning); class names are matched by name, new classes numbered after the existing
    ones. ``src`` is only read (its records are copied, so the two share no file). ``dst``
    holds the old dataset or the new one at every moment, whatever interrupts this."""
    dst = os.path.abspath(os.fspath(dst))
    src = os.path.abspath(os.fspath(src))
    if os.path.realpath(src) == os.path.realpath(dst):
        raise DatasetError(f"{src} is appended to itself; copy it first "
                           "(loaderx.copying.copy) and append the copy")
    src_manifest = read_manifest(src)
    if is_dataset_directory(dst) and _in_place(read_manifest(dst), src_manifest.rows):
        return _append_in_place(dst, src, src_manifest)
    refuse_grouped(src, src_manifest, "append")
    for ds in open_dataset(src).values():  # every store of src as its manifest says
        ds.close()
    with _holding(dst, "append") as held:
        _step("grow:held")
        _check_append(held.manifest, held.path, src, src_manifest, src)
        with staging.private_dir(dst, "incoming") as incoming:
            return _grow(held, src, src_manifest, incoming, link=False, name=src).rows


def append_converted(dst: str | os.PathLike[str], convert: Callable[[str, Existing | None], R],
                     what: str = "the rows converted") -> tuple[R, Manifest]:
    """What a converter's ``append=True`` runs: ``convert(path, existing)`` writes the new rows
    as a dataset directory at ``path`` (a private path beside ``dst``, or ``dst`` itself when
    ``dst`` holds nothing yet: ``existing`` is then None, and this is a plain conversion);
    the rows are then appended to ``dst`` as :func:`append_dataset` appends (linked, not
    copied); ``what`` names them in errors. Returns what ``convert`` returned and ``dst``'s
    new manifest."""
    dst = os.path.abspath(os.fspath(dst))
    staging.remove_stale(dst)
    if not os.path.lexists(dst) or (os.path.isdir(dst) and not os.path.islink(dst)
                                    and not os.listdir(dst)):
        result = convert(dst, None)
        return result, read_manifest(dst)
    if is_dataset_directory(dst) and _in_place(manifest := read_manifest(dst), 0):
        # In place: the rows converted aside, then appended to every store of dst (or, past
        # what one store per column holds, joined into a new directory of parts as below).
        with staging.private_dir(dst, "incoming") as incoming:
            new = os.path.join(incoming, "new")
            # (No checksums asked of the new rows: the append writes them again, and a join
            # gives them checksums where dst's stores keep them.)
            result = convert(new, Existing(dst, manifest, False))
            _step("grow:converted")
            new_manifest = read_manifest(new)
            if _in_place(manifest, new_manifest.rows):
                _append_in_place(dst, new, new_manifest, what)
                return result, read_manifest(dst)
            with _holding(dst, "append") as held:
                _step("grow:held")
                return result, _joined(held, new, incoming, what)
    with _holding(dst, "append") as held:
        _step("grow:held")
        existing = Existing(dst, held.manifest, any(z.has_checksums() for z in held.stores))
        with staging.private_dir(dst, "incoming") as incoming:
            new = os.path.join(incoming, "new")
            result = convert(new, existing)
            _step("grow:converted")
            return result, _joined(held, new, incoming, what)


def _joined(held: _Held, new: str, incoming: str, what: str) -> Manifest:
    """The rows converted into ``new`` (``what`` in errors), checked and joined to the held
    dataset (:func:`_grow`, linked); its new manifest."""
    new_manifest = read_manifest(new)
    _check_append(held.manifest, held.path, new, new_manifest, what)
    return _grow(held, new, new_manifest, incoming, link=True, name=what)


def _in_place(m: Manifest, new_rows: int) -> bool:
    """Whether ``new_rows`` more rows are appended to the directory of manifest ``m`` in place:
    it has a commit point, or it is of the older layout (a store per column) in one part with
    room for them in each store (it is then given a commit point). Else (a directory of parts,
    or rows past one store's records) the rows are joined into a new directory that replaces
    it (:func:`_grow`)."""
    return has_commit_point(m) or (not m.parts and m.rows + new_rows <= MAX_RECORDS)


def _append_in_place(dst: str, src: str, s: Manifest, name: str | None = None) -> int:
    """The rows of the dataset directory ``src`` appended in place to ``dst`` (see
    :func:`_in_place`; :mod:`loaderx.intake.appending`), in blocks of rows, one commit;
    returns ``dst``'s new row count. Checked and rewritten as the rebuilding path does (class
    names matched by name, shard numbers moved), the manifest's keys changed in the same
    commit. A directory of the older layout is given its commit point once the rows pass the
    checks (:func:`~loaderx.intake.appending.give_commit_point`: its manifest alone)."""
    from loaderx.intake.appending import Appender

    name = src if name is None else name
    # Refused before anything is written: the checks, then the rewrites tried on every row
    # (a label past its class names), nothing kept.
    first = read_manifest(dst)
    _check_append(first, dst, src, s, name)
    columns = open_dataset(src)
    try:
        probe = _growth(first, s, name)
        for lo, idx in _row_blocks(s.rows):
            for col_name, check in probe.rewrite.items():
                check(_records(columns[col_name], idx), lo)
        with Appender(dst) as appender:  # (a directory of the older layout given a commit point)
            have = appender.manifest
            if replace(have, generation="") != replace(first, generation=""):
                _check_append(have, dst, src, s, name)  # another writer came in between
            growth = _growth(have, s, name)
            for lo, idx in _row_blocks(s.rows):
                rows = {}
                for c in have.columns:
                    records = _records(columns[c.name], idx)
                    rewrite = growth.rewrite.get(c.name)
                    rows[c.name] = records if rewrite is None else rewrite(records, lo)
                appender.append(rows)
            extras = growth.counted_extras()
            appender.commit(columns=tuple(replace(c, extra=extras[c.name])
                                          for c in have.columns), extra=growth.extra)
    finally:
        for ds in columns.values():
            ds.close()
    return appender.rows


def _row_blocks(rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """The rows ``0 .. rows - 1`` in blocks: each block's first row and its indices."""
    step = max(1, min(_BLOCK_ROWS, rows))
    for lo in range(0, rows, step):
        yield lo, np.arange(lo, min(rows, lo + step), dtype=np.uint64)


def _records(ds: Any, idx: np.ndarray) -> Any:
    """Records ``idx`` of a column as :meth:`~loaderx.intake.DirectoryWriter.append` takes them."""
    if ds.kind == "dense":
        return ds.gather(idx)
    return list(ds[idx])


def refuse_overwrite_and_codec(overwrite: bool, codec: Any, default: Any) -> None:
    """What ``append=True`` of a converter does not take along: ``overwrite=True``, and a codec
    of its own (the dataset's codecs are used)."""
    if overwrite:
        raise LoaderxValueError("append=True adds rows to the dataset at dst, overwrite=True "
                                "replaces it: pass one of them")
    if codec != default:
        raise LoaderxValueError(f"append=True writes the new rows with the dataset's own "
                                f"codecs; leave codec={codec!r} out")


def _check_columns(dst: str, have: Sequence[Column], src: str, given: Sequence[Column],
                   check_extra: bool = True) -> None:
    names = [c.name for c in have]
    theirs = {c.name: c for c in given}
    missing = [n for n in names if n not in theirs]
    unknown = [c.name for c in given if c.name not in names]
    if missing or unknown:
        what = "; ".join(filter(None, [
            f"it lacks the column(s) {missing!r}" if missing else "",
            f"it has the column(s) {unknown!r}, which {dst} lacks" if unknown else ""]))
        paths = _file_name_columns(missing + unknown, [*have, *given])
        if paths and len(paths) == len(missing) + len(unknown):
            lacking = src if missing else dst
            raise DatasetError(
                f"{src} cannot be appended to {dst}: {what}. {', '.join(map(repr, paths))} "
                f"hold(s) the file names of encoded files (a Hugging Face Image, Audio or "
                f"Video feature's 'path'); {lacking} has none because the path was null in "
                "every one of its rows, and a column null in every row is left out. Give both "
                "sides file names (an empty string where there is none: for example "
                "dataset.cast_column(...) or a map setting the feature's path to '') or "
                "neither, then convert again")
        raise DatasetError(f"{src} cannot be appended to {dst}: {what}. Every column of a "
                           "dataset gets the new rows: give them exactly its columns "
                           f"({names!r})")
    for col in have:
        other = theirs[col.name]
        if (col.kind, col.dtype, col.item_shape) != (other.kind, other.dtype, other.item_shape):
            raise DatasetError(
                f"column {col.name!r}: {dst} holds {col.kind} {col.dtype.str}{col.item_shape} "
                f"records, {src} {other.kind} {other.dtype.str}{other.item_shape}; the rows "
                "appended must have the column's kind, dtype and item shape (cast them first)")
        if not check_extra:
            continue
        for key in sorted((set(col.extra) | set(other.extra)) - _FREE_EXTRA):
            if col.extra.get(key) != other.extra.get(key):
                raise DatasetError(
                    f"column {col.name!r}: {key!r} is {col.extra.get(key)!r} in {dst} and "
                    f"{other.extra.get(key)!r} in {src}; the rows appended must mean what the "
                    "column's rows mean (convert them the same way)")
        if ("classes" in col.extra) != ("classes" in other.extra):
            named, bare = (dst, src) if "classes" in col.extra else (src, dst)
            raise DatasetError(
                f"column {col.name!r}: {named} names its classes and {bare} does not, so its "
                "labels cannot be matched by name; give both the class names (the manifest's "
                "'classes') or neither")


def _file_name_columns(names: Sequence[str], columns: Sequence[Column]) -> list[str]:
    """Those of ``names`` that are the ``<name>.path`` column of an encoded file column (see
    :mod:`loaderx.intake.tables`): present only where some row had a file name."""
    encoded = {c.name for c in columns if "encoded" in c.extra}
    return [n for n in names if n.endswith(".path") and n[:-5] in encoded]


def _classes(col: Column, where: str) -> list[str]:
    names = col.extra.get("classes")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CorruptStoreError(f"{where}: the class names of column {col.name!r} are not a "
                                "list of strings")
    return names


def _check_append(m: Manifest, dst: str, src_dir: str, s: Manifest, src: str) -> None:
    """Everything an append of the dataset directory ``src_dir`` (called ``src`` in errors)
    to ``dst`` (whose manifest is ``m``) refuses, before anything is written."""
    _check_columns(dst, m.columns, src, s.columns)
    mine, theirs = m.extra.get("source"), s.extra.get("source")
    if (mine in _OWN_SOURCES or theirs in _OWN_SOURCES) and mine != theirs:
        raise DatasetError(f"{dst} was made by {_made_by(mine)} and {src} by "
                           f"{_made_by(theirs)}: their rows cannot be mixed in one dataset")
    for col in m.columns:
        if "classes" not in col.extra:
            continue
        other = s.column(col.name)
        _classes(col, dst)
        _classes(other, src)
        if col.kind != "dense" or col.item_shape or col.dtype.kind not in "iu":
            if col.extra["classes"] != other.extra["classes"]:
                raise DatasetError(f"column {col.name!r} names classes but does not hold "
                                   "integer labels, so they cannot be renumbered; the class "
                                   f"names differ between {dst} and {src}")
            continue
        merged = _merged_classes(col.extra["classes"], other.extra["classes"])
        top = int(np.iinfo(col.dtype).max)
        if len(merged) - 1 > top:
            raise DatasetError(f"column {col.name!r} would name {len(merged)} classes, more "
                               f"than its dtype {col.dtype} numbers")
    if mine == "webdataset":
        for where, man in ((dst, m), (src, s)):
            if not isinstance(man.extra.get("shards"), list):
                raise CorruptStoreError(f"{where}: the manifest's shard list is damaged")
    if mine == "image_folder" and any(c.name == "path" for c in m.columns):
        _check_paths(dst, src_dir, src)


def _merged_classes(have: list[str], new: list[str]) -> list[str]:
    """The dataset's classes, then the classes only ``new`` names, in sorted order."""
    known = set(have)
    added = sorted({n for n in new if n not in known}, key=lambda n: n.encode("utf-8"))
    return list(have) + added


def _check_paths(dst: str, src_dir: str, src: str) -> None:
    """An image folder's relative paths must stay unique (an export writes each once)."""
    def paths(root: str) -> Iterator[bytes]:
        ds = open_dataset(root, columns=["path"])["path"]
        try:
            for start in range(0, len(ds), 4096):
                for rec in ds[np.arange(start, min(len(ds), start + 4096))]:
                    yield bytes(rec)
        finally:
            ds.close()

    have = set(paths(dst))
    for p in paths(src_dir):
        if p in have:
            raise DatasetError(f"{dst} already holds an image at {os.fsdecode(p)!r}, and the "
                               f"rows appended from {src} have one at the same path; an export "
                               "(export_image_folder) writes each path once: rename the new "
                               "file, or put it in a sub-folder of its class")


@dataclass
class _Growth:
    """What the rows of another dataset (its manifest ``s``) become when they are appended to
    one (``m``): each column's extra keys after the append (class names merged), the
    dataset's, and the rewrites of values (``rewrite[column](values, first_row)``: labels
    renumbered by class name and counted, shard numbers moved past the dataset's)."""

    extras: dict[str, dict[str, Any]]
    extra: dict[str, Any]
    rewrite: dict[str, Callable[[np.ndarray, int], np.ndarray]]
    counters: dict[str, np.ndarray]

    def counted_extras(self) -> dict[str, dict[str, Any]]:
        """:attr:`extras` with the labels rewritten so far added to each column's ``counts``."""
        out = {name: dict(extra) for name, extra in self.extras.items()}
        for name, counts in self.counters.items():
            listed = out[name].get("counts")
            if isinstance(listed, list):
                have = np.zeros(len(counts), dtype=np.int64)
                have[:len(listed)] = listed[:len(have)]
                out[name]["counts"] = (have + counts).tolist()
        return out


def _growth(m: Manifest, s: Manifest, name: str) -> _Growth:
    """See :class:`_Growth`; ``name`` names the new rows in errors."""
    columns = list(m.columns)
    extras = {c.name: dict(c.extra) for c in columns}
    rewrite: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {}
    counters: dict[str, np.ndarray] = {}
    for col in columns:
        if "classes" not in col.extra or col.kind != "dense" or col.item_shape or \
                col.dtype.kind not in "iu":
            continue
        theirs = s.column(col.name).extra["classes"]
        merged = _merged_classes(col.extra["classes"], theirs)
        index = {n: i for i, n in enumerate(merged)}
        mapping = np.array([index[n] for n in theirs], dtype=np.int64)
        counts = np.zeros(len(merged), dtype=np.int64)
        counters[col.name] = counts
        rewrite[col.name] = _relabel(col.name, name, mapping, counts)
        extras[col.name]["classes"] = merged
    extra = {k: v for k, v in m.extra.items() if k != "resume"}  # no longer that conversion
    if m.extra.get("source") == "webdataset":
        offset = len(m.extra["shards"])
        extra["shards"] = list(m.extra["shards"]) + list(s.extra["shards"])
        if any(c.name == "__shard__" for c in columns) and offset:
            rewrite["__shard__"] = lambda values, _start: values + offset
    if isinstance(m.extra.get("skipped"), dict) and isinstance(s.extra.get("skipped"), dict):
        extra["skipped"] = _summed(m.extra["skipped"], s.extra["skipped"])
    return _Growth(extras, extra, rewrite, counters)


def _grow(held: _Held, src: str, s: Manifest, incoming: str, link: bool,
          name: str) -> Manifest:
    """The rows of the dataset directory ``src`` (``name`` in errors) appended: the new dataset
    built beside ``dst`` and put in its place; its manifest."""
    m = held.manifest
    columns = list(m.columns)
    growth = _growth(m, s, name)
    rewrite = growth.rewrite
    # The new rows, each column's store ready to be joined (a store of src itself, or a
    # private one: rewritten, copied, or given checksums).
    new_units = []
    tag = 0
    summed = {col.name: held.checksums(col.name) for col in columns}
    for unit_dir, um, own in _units(src, s):
        stores = {}
        for col in columns:
            path = os.path.join(unit_dir, own[col.name].store)
            sums = summed[col.name]
            tag += 1
            if col.name in rewrite:
                path = _rewritten(path, os.path.join(incoming, f"r{tag}"), col,
                                  rewrite[col.name], sums)
            elif not link:
                path = _copied(path, os.path.join(incoming, f"c{tag}"), sums)
            elif sums and not _has_checksums(path):
                path = _summed_clone(path, os.path.join(incoming, f"s{tag}"), col)
            stores[col.name] = path
        new_units.append((um.rows, stores))
    _step("grow:prepared")
    old_units = [(um.rows, {c.name: os.path.join(u, own[c.name].store) for c in columns})
                 for u, um, own in held.units]
    return _publish(held, old_units + new_units, columns, growth.counted_extras(), growth.extra,
                    rows=m.rows + s.rows)


def _summed(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, int) and isinstance(out.get(k, 0), int):
            out[k] = out.get(k, 0) + v
    return out


def _relabel(name: str, src: str, mapping: np.ndarray,
             counts: np.ndarray) -> Callable[[np.ndarray, int], np.ndarray]:
    """The new numbers of labels of ``src`` (class ``j`` of src is class ``mapping[j]``),
    counted into ``counts``; labels below 0 (no class) are kept."""
    def apply(values: np.ndarray, start: int) -> np.ndarray:
        wide = values.astype(np.int64)
        past = np.flatnonzero(wide >= len(mapping))
        if len(past):
            row = int(past[0])
            raise DatasetError(f"{src}: row {start + row} of column {name!r} holds the label "
                               f"{int(wide[row])}, but the column names {len(mapping)} "
                               "classes; the label has no class name to be matched by")
        named = wide >= 0
        wide[named] = mapping[wide[named]]
        np.add(counts, np.bincount(wide[named], minlength=len(counts))[:len(counts)],
               out=counts)
        return wide.astype(values.dtype)

    return apply


def _has_checksums(store: str) -> bool:
    with Zrecord(store) as z:
        return z.has_checksums()


def _new_store(path: str, schema: _schema.Schema, codec: str) -> Zrecord:
    """A new, empty store at ``path`` that says what its records are before it holds any."""
    z = Zrecord(path, codec=cast(Codec, codec))
    try:
        _schema.write(path, schema)
    except BaseException:
        z.close()
        raise
    return z


def _rewritten(store: str, target: str, col: Column,
               change: Callable[[np.ndarray, int], np.ndarray], sums: bool) -> str:
    """A private copy of the dense store ``store`` whose values went through ``change``."""
    item = col.dtype.itemsize
    codec = "raw" if col.codec == "zstd_dict" else col.codec
    with Zrecord(store) as old:
        out = _new_store(target, _schema.read(store), codec)
        try:
            if sums:
                out.enable_checksums()
            n = len(old)
            for start in range(0, n, _BLOCK_ROWS):
                idx = np.arange(start, min(n, start + _BLOCK_ROWS), dtype=np.uint64)
                values = np.empty(len(idx), dtype=col.dtype)
                offsets = np.arange(len(idx), dtype=np.uint64) * np.uint64(item)
                old.gather(idx, values, offsets)
                new = np.ascontiguousarray(change(values, start), dtype=col.dtype)
                out.append(new, offsets)
        finally:
            out.close()
    return target


def _copied(store: str, target: str, sums: bool) -> str:
    """A private copy of ``store`` (its files, holes kept, synced), with checksums if asked."""
    os.mkdir(target)
    copy_files(store, target)
    if sums:
        with Zrecord(target) as z:
            z.enable_checksums()
    return target


def _summed_clone(store: str, target: str, col: Column) -> str:
    """``store`` joined into a private store that then sums its records."""
    _combine(target, [store], col)
    with Zrecord(target) as z:
        z.enable_checksums()
    return target


# -- building and publishing --------------------------------------------------------------------


def _publish(held: _Held, units: list[tuple[int, dict[str, str]]], columns: list[Column],
             extras: dict[str, dict[str, Any]], extra: dict[str, Any], rows: int) -> Manifest:
    """The units' stores joined, column by column, in a private directory beside the dataset,
    in groups of consecutive units that fit one store (a directory of columns when one group
    holds them all, else a directory of parts), the manifest written last, and the directory
    put in the dataset's place."""
    groups = store_groups(((n, max((chunks_of(p) for p in stores.values()), default=0))
                           for n, stores in units), max_rows=MAX_RECORDS, max_chunks=MAX_CHUNKS)
    if len(groups) > MAX_PARTS:
        raise LimitExceededError(f"{len(groups)} parts, more than a dataset directory holds "
                                 f"({MAX_PARTS})")
    if not held.manifest.parts:
        names = [c.store for c in columns]
    else:
        names = []
        for i, c in enumerate(columns):
            names.append(store_name(c.name, i, names))
    own = [Column(c.name, name, c.kind, c.dtype, c.item_shape, c.codec, extras[c.name])
           for c, name in zip(columns, names, strict=True)]
    with staging.private_dir(held.path, "growing") as build:
        built = 0

        def fill(target: str, group: list[int]) -> int:
            nonlocal built
            for col in own:
                _combine(os.path.join(target, col.store),
                         [units[k][1][col.name] for k in group], col)
                built += 1
                _step(f"grow:store:{built}")
            staging.fsync_dir(target)
            return sum(units[k][0] for k in group)

        if len(groups) == 1:
            fill(build, groups[0])
            manifest = Manifest(rows, tuple(own), (), extra)
        else:
            os.mkdir(os.path.join(build, PARTS_DIR))
            parts = []
            for g, group in enumerate(groups):
                target = os.path.join(build, PARTS_DIR, f"{g:05d}")
                os.mkdir(target)
                n = fill(target, group)
                parts.append(_part_done(target, f"{PARTS_DIR}/{g:05d}",
                                        Manifest(n, tuple(own), (), extra)))
            manifest = Manifest(rows, storeless(own), tuple(parts), extra)
        return _put_built(held, build, manifest, "grow:manifest")


def _part_done(target: str, path: str, manifest: Manifest) -> Part:
    """Completes the part built in ``target``: its manifest written, the directory synced.
    Returns its entry (``path``: where it lies in the dataset) for the dataset's manifest."""
    _native.replace_file(target, MANIFEST_FILE, manifest.to_bytes())
    staging.fsync_dir(target)
    return Part(path, manifest.rows)


def _put_built(held: _Held, build: str, manifest: Manifest, step: str) -> Manifest:
    """Completes the private directory ``build`` (its parts directory synced, if it has parts)
    with ``manifest``, written last: with it the directory is complete; then puts it in the
    place of the dataset ``held``. Returns ``manifest``."""
    if manifest.parts:
        staging.fsync_dir(os.path.join(build, PARTS_DIR))
    _step(step)
    _native.replace_file(build, MANIFEST_FILE, manifest.to_bytes())
    put_in_place(build, held.path, held.stores)
    return manifest


def _combine(target: str, members: list[str], col: Column) -> None:
    """A new store at ``target`` whose records are those of the stores ``members``, in order:
    joined (their chunk files linked, nothing copied) where the engine can, else the first
    one's files copied and the others' records appended."""
    schema = _schema.read(members[0])
    parts = [Zrecord(m) for m in members]
    try:
        if not any(p.has_dict() for p in parts):
            try:
                joined = _new_store(target, schema, col.codec)
                try:
                    joined._native.join_from([p._native for p in parts])
                finally:
                    joined.close()
                staging.fsync_dir(target)
                return
            except OSError as e:
                if e.errno not in NO_LINKS:
                    raise
                shutil.rmtree(target)  # inside the private build: no links here, copy
        os.mkdir(target)
        copy_files(members[0], target)
        with Zrecord(target, codec=cast(Codec, col.codec)) as out:
            codec: Codec | None = None
            if col.codec == "zstd_dict" and not out.has_dict():
                codec = "zstd"
            for p in parts[1:]:
                _copy_records(p, out, np.arange(len(p), dtype=np.uint64), codec)
        staging.fsync_dir(target)
    finally:
        for p in parts:
            p.close()


def _copy_records(src: Zrecord, out: Zrecord, idx: np.ndarray, codec: Codec | None) -> None:
    """Appends records ``idx`` of ``src`` to ``out`` (decoded, and encoded again by ``out``),
    a bounded number of bytes at a time."""
    for lo in range(0, len(idx), _BLOCK_ROWS):
        window = idx[lo:lo + _BLOCK_ROWS]
        lens = src.lengths(window).astype(np.int64)
        ends = np.cumsum(lens)
        start = 0
        while start < len(window):
            base = int(ends[start - 1]) if start else 0
            stop = max(start + 1, int(np.searchsorted(ends, base + _BLOCK_BYTES, side="right")))
            block, sizes = window[start:stop], lens[start:stop]
            offsets = np.zeros(len(block), dtype=np.uint64)
            np.cumsum(sizes[:-1], out=offsets[1:])
            buf = np.empty(int(sizes.sum()), dtype=np.uint8)
            src.gather(block, buf, offsets)
            out.append(buf, offsets, codec)
            start = stop


# -- deleting -----------------------------------------------------------------------------------


def delete_rows(dst: str | os.PathLike[str], indices: Any, *, keep_order: bool = True) -> int:
    """Deletes rows ``indices`` (integers, or a boolean mask with one entry per row) from every
    column of the dataset directory ``dst`` in one transaction, and returns its new row count.

    ``keep_order=True`` keeps the other rows in their order (the rows after the first deleted
    one are written again); ``keep_order=False`` moves the last rows into the holes, as
    :meth:`loaderx.zrecord.Zrecord.delete` does, writing only record tables. The manifest's
    row count and class ``counts`` follow; duplicates are deleted once; an index out of range
    is refused (LoaderxIndexError) before anything is written. ``dst`` holds the old dataset or
    the new one at every moment, whatever interrupts this (see the module docstring)."""
    if keep_order is not True and keep_order is not False:
        raise LoaderxValueError(f"keep_order must be True or False, got {keep_order!r}")
    dst = os.path.abspath(os.fspath(dst))
    if is_dataset_directory(dst) and (manifest := read_manifest(dst)).groups:
        return _delete_by_rewrite(dst, manifest, indices)
    with _holding(dst, "delete") as held:
        _step("shrink:held")
        m = held.manifest
        gone = _row_indices(indices, m.rows, dst)
        if not len(gone):
            return m.rows
        columns = list(m.columns)
        extras = {c.name: dict(c.extra) for c in columns}
        units = []
        start = 0
        with staging.private_dir(dst, "incoming") as incoming:
            tag = 0
            for u, um, own in held.units:
                local = gone[(gone >= start) & (gone < start + um.rows)] - start
                stores = {}
                for col in columns:
                    path = os.path.join(u, own[col.name].store)
                    if isinstance(extras[col.name].get("counts"), list) and len(local):
                        _uncount(extras[col.name], held.by_path[path], local, col)
                    tag += 1
                    stores[col.name] = (path, local, os.path.join(incoming, f"d{tag}"))
                units.append((um.rows - len(local), stores))
                start += um.rows
            return _publish_shrunk(held, units, columns, extras, keep_order,
                                   m.rows - len(gone)).rows


def _delete_by_rewrite(dst: str, manifest: Manifest, indices: Any) -> int:
    """:func:`delete_rows` of a directory with a column group: the kept rows, in order, written
    as a new directory that replaces ``dst`` in one transaction (a conversion's cost: a group's
    blocks cannot lose rows in place). The columns' class ``counts`` follow."""
    staging.remove_stale(dst)  # a writer first clears what a killed one left beside dst
    gone = _row_indices(indices, manifest.rows, dst)
    if not len(gone):
        return manifest.rows
    keep = np.setdiff1d(np.arange(manifest.rows, dtype=np.uint64), gone.astype(np.uint64))
    columns = open_dataset(dst)
    try:
        extras = {c.name: dict(c.extra) for c in manifest.columns}
        for c in manifest.columns:
            counts = extras[c.name].get("counts")
            if isinstance(counts, list) and c.kind == "dense":
                labels = np.asarray(_records(columns[c.name], np.sort(gone).astype(np.uint64)))
                found = np.bincount(labels[(labels >= 0) & (labels < len(counts))].astype(
                    np.int64), minlength=len(counts))
                extras[c.name]["counts"] = [int(a) - int(b) for a, b in zip(
                    counts, found, strict=False)]
        with DirectoryWriter(dst, overwrite=True, group_columns=True,
                             extra=manifest.extra) as writer:
            for c in manifest.columns:
                writer.add_column(c.name, c.kind, c.dtype, c.item_shape,
                                  codec=cast(Codec, c.codec), extra=extras[c.name])
            _step("shrink:held")
            for lo in range(0, len(keep), _BLOCK_ROWS):
                idx = keep[lo:lo + _BLOCK_ROWS]
                writer.append({c.name: _records(columns[c.name], idx) for c in manifest.columns})
            return writer.commit()
    finally:
        for ds in columns.values():
            with contextlib.suppress(Exception):
                ds.close()


def _row_indices(indices: Any, n: int, dst: str) -> np.ndarray:
    """``indices`` as sorted, distinct int64 row numbers below ``n``."""
    if isinstance(indices, (str, bytes)):
        raise LoaderxIndexError(f"row indices must be integers or a boolean mask, got "
                                f"{indices!r}")
    arr = np.asarray(indices)
    if arr.dtype == np.bool_:
        if arr.shape != (n,):
            raise LoaderxIndexError(f"a boolean mask of rows needs one entry per row of {dst} "
                                    f"({n}), got shape {arr.shape}")
        return np.flatnonzero(arr).astype(np.int64)
    arr = arr.reshape(-1)
    if not len(arr):
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise LoaderxIndexError(f"row indices must be integers, got dtype {arr.dtype}")
    bad = (arr < 0) | (arr >= n)
    if bad.any():
        raise LoaderxIndexError(f"row index {int(arr[bad][0])} is out of range: {dst} has "
                                f"{n} rows")
    return np.unique(arr.astype(np.int64))


def _uncount(extra: dict[str, Any], store: Zrecord, local: np.ndarray, col: Column) -> None:
    """Takes the labels of the deleted rows out of the column's class ``counts``."""
    if col.kind != "dense" or col.item_shape or col.dtype.kind not in "iu":
        return
    counts = np.asarray(extra["counts"], dtype=np.int64)
    values = np.empty(len(local), dtype=col.dtype)
    store.gather(local.astype(np.uint64), values,
                 np.arange(len(local), dtype=np.uint64) * np.uint64(col.dtype.itemsize))
    wide = values.astype(np.int64)
    wide = wide[(wide >= 0) & (wide < len(counts))]
    extra["counts"] = np.maximum(counts - np.bincount(wide, minlength=len(counts)),
                                 0).tolist()


def _publish_shrunk(held: _Held,
                    units: list[tuple[int, dict[str, tuple[str, np.ndarray, str]]]],
                    columns: list[Column], extras: dict[str, dict[str, Any]], keep_order: bool,
                    rows: int) -> Manifest:
    """Each unit's stores without their deleted rows, built beside the dataset (the same
    layout: a directory of columns, or the same parts), the manifest written last, and the
    directory put in the dataset's place."""
    m, dst = held.manifest, held.path
    own = [Column(c.name, c.store, c.kind, c.dtype, c.item_shape, c.codec, extras[c.name])
           for c in columns]
    extra = {k: v for k, v in m.extra.items() if k != "resume"}
    with staging.private_dir(dst, "shrinking") as build:
        built = 0

        def fill(target: str, stores: dict[str, tuple[str, np.ndarray, str]],
                 names: dict[str, str]) -> None:
            nonlocal built
            for col in own:
                path, local, scratch = stores[col.name]
                _shrunk(os.path.join(target, names[col.name]), path, local, col, keep_order,
                        scratch)
                built += 1
                _step(f"shrink:store:{built}")
            staging.fsync_dir(target)

        if not m.parts:
            fill(build, units[0][1], {c.name: c.store for c in own})
            manifest = Manifest(rows, tuple(own), (), extra)
        else:
            os.mkdir(os.path.join(build, PARTS_DIR))
            parts = []
            for (n, stores), (u, um, mine) in zip(units, held.units, strict=True):
                rel = os.path.relpath(u, dst).replace(os.sep, "/")
                target = os.path.join(build, *rel.split("/"))
                os.mkdir(target)
                names = {c.name: mine[c.name].store for c in own}
                fill(target, stores, names)
                part_cols = tuple(Column(c.name, names[c.name], c.kind, c.dtype, c.item_shape,
                                         mine[c.name].codec, extras[c.name]) for c in own)
                parts.append(_part_done(target, rel, Manifest(n, part_cols, (), um.extra)))
            manifest = Manifest(rows, storeless(own), tuple(parts), extra)
        return _put_built(held, build, manifest, "shrink:manifest")


def _shrunk(target: str, store: str, gone: np.ndarray, col: Column, keep_order: bool,
            scratch: str) -> None:
    """A new store at ``target``: ``store`` without records ``gone`` (sorted, distinct)."""
    if not len(gone):
        _combine(target, [store], col)
        return
    with Zrecord(store) as old:
        n = len(old)
        if not keep_order:
            _combine(target, [store], col)  # the same records, in a store of its own
            with Zrecord(target) as out:
                out.delete(gone.astype(np.uint64))  # record tables only
            return
        first = int(gone[0])
        kept = np.setdiff1d(np.arange(first, n, dtype=np.int64), gone).astype(np.uint64)
        if old.has_dict():
            # Not joinable: a copy of the store, cut at the first hole, the rest appended.
            os.mkdir(target)
            copy_files(store, target)
            with Zrecord(target) as out:
                out.delete(np.arange(first, n, dtype=np.uint64))  # the tail: lengths only
                _copy_records(old, out, kept, None)
            staging.fsync_dir(target)
            return
        # The rows before the first hole: the old store joined and cut there; the rows after
        # it that stay: read and appended to a store of their own; the two joined.
        head, tail = scratch + "-head", scratch + "-tail"
        _combine(head, [store], col)
        with Zrecord(head) as z:
            z.delete(np.arange(first, n, dtype=np.uint64))  # the tail: the length moves back
        rest = _new_store(tail, _schema.read(store),
                          "zstd" if col.codec == "zstd_dict" else col.codec)
        try:
            if old.has_checksums():
                rest.enable_checksums()
            _copy_records(old, rest, kept, None)
        finally:
            rest.close()
        _combine(target, [head, tail], col)


# -- repairing ----------------------------------------------------------------------------------


def repair_dataset(dst: str | os.PathLike[str]) -> dict[str, int]:
    """Puts a dataset directory back as its manifest says after records were appended to one
    column's store alone (with the engine, or a loaderx older than this check): each store
    that holds more records than the manifest says loses those past the manifest's count --
    they were never rows of the dataset. Returns ``{store path: records removed}``. A store
    that holds *fewer* records than the manifest says had some deleted on its own: its rows no
    longer line up with the others', and nothing can line them up again (CorruptStoreError
    saying so: restore the dataset from a copy, or convert it again). Holds every store's
    writer lock meanwhile; each store's cut is durable and atomic."""
    dst = os.path.abspath(os.fspath(dst))
    staging.remove_stale(dst)
    manifest = read_manifest(dst)
    if has_commit_point(manifest):
        # What an interrupted append left past the commit point: trimmed by any writer.
        from loaderx.intake.appending import Appender

        with Appender(dst) as appender:
            return dict(appender.trimmed)
    refuse_grouped(dst, manifest, "repair")
    stores = claim_destination(dst, overwrite=True)
    try:
        by_path = {os.path.abspath(z.path): z for z in stores}
        plan: list[tuple[Zrecord, int]] = []
        for cs in column_stores(dst, manifest):
            path = os.path.join(dst, *cs.path.split("/"))
            z = by_path.get(path)
            if z is None:
                raise CorruptStoreError(f"{path}: the store of column {cs.column.name!r} is "
                                        "missing; restore the dataset from a copy")
            if len(z) < cs.rows:
                raise CorruptStoreError(
                    f"{path}: column {cs.column.name!r} holds {len(z)} records, the manifest "
                    f"says {cs.rows}: records were deleted from this store alone, so its rows "
                    "no longer line up with the other columns' and cannot be repaired; "
                    "restore the dataset from a copy, or convert it again")
            if len(z) > cs.rows:
                plan.append((z, cs.rows))
        removed = {}
        for z, rows in plan:
            extra = len(z) - rows
            z._native.delete(np.arange(rows, len(z), dtype=np.uint64))  # the tail only
            removed[z.path] = extra
        return removed
    finally:
        release_stores(stores)



# -- the converters' append=True ----------------------------------------------------------------


def image_folder_onto(dst: str | os.PathLike[str], root: str | os.PathLike[str],
                      convert_into: Callable[..., dict[str, Any]], *, codec: Any,
                      overwrite: bool, checksums: bool) -> dict[str, Any]:
    """``from_image_folder(dst, root, append=True)``: ``convert_into(path, codec=...,
    checksums=...)`` converts the folder privately, then it is appended to the dataset at
    ``dst`` (its classes matched by name). The report's ``rows``, ``classes``, ``counts`` and
    ``empty_classes`` are the dataset's after the append; ``appended`` the rows added and
    ``new_classes`` the classes the dataset did not have."""
    refuse_overwrite_and_codec(overwrite, codec, "raw")
    before: list[str] = []

    def convert(path: str, existing: Existing | None) -> dict[str, Any]:
        if existing is None:
            return convert_into(path, codec=codec, checksums=checksums)
        existing.require_source("image_folder", "from_image_folder")
        existing.require_columns([("image", "ragged", np.uint8, ()),
                                  ("label", "dense", np.int64, ()),
                                  ("path", "ragged", np.uint8, ())],
                                 f"the image folder {os.fspath(root)}")
        before.extend(_classes(existing.manifest.column("label"), existing.path))
        return convert_into(path, codec=existing.codecs()["image"],
                            checksums=checksums or existing.checksums)

    report, manifest = append_converted(dst, convert, f"the image folder {os.fspath(root)}")
    label = manifest.column("label").extra
    classes = _classes(manifest.column("label"), os.fspath(dst))
    counts = [int(n) for n in label.get("counts", [])]
    known = set(before)
    return {**report, "rows": manifest.rows, "appended": report["rows"], "classes": classes,
            "counts": counts, "new_classes": [c for c in classes if c not in known],
            "empty_classes": [c for c, n in zip(classes, counts, strict=False) if n == 0]}


def webdataset_onto(dst: str | os.PathLike[str], convert_into: Callable[..., dict[str, Any]],
                    *, codec: Any, overwrite: bool, checksums: bool) -> dict[str, Any]:
    """``from_webdataset(dst, shards, append=True)``: ``convert_into(path, codec=...,
    checksums=...)`` converts the shards privately, then they are appended to the dataset at
    ``dst`` (its shard list and ``__shard__`` numbers continued). The report's ``rows`` is the
    dataset's after the append, ``appended`` the rows added."""
    refuse_overwrite_and_codec(overwrite, codec, "raw")

    def convert(path: str, existing: Existing | None) -> dict[str, Any]:
        if existing is None:
            return convert_into(path, codec=codec, checksums=checksums)
        existing.require_source("webdataset", "from_webdataset")
        own = [c.codec for c in existing.manifest.columns
               if c.name not in ("__key__", "__shard__", "__present__", "label")]
        return convert_into(path, codec=own[0] if own else "raw",
                            checksums=checksums or existing.checksums)

    report, manifest = append_converted(dst, convert, "the shards")
    return {**report, "rows": manifest.rows, "appended": report["rows"]}


def arrow_onto(dst: str | os.PathLike[str], plan: Sequence[Any], options: Any,
               overwrite: bool, resume: bool, write: Callable[[str, Any], int]) -> int:
    """``from_arrow(dst, source, append=True)``: ``write(path, options)`` converts the table
    privately (with the dataset's codecs, and checksums where it keeps them), then its rows
    are appended to the dataset at ``dst``, whose new row count is returned. The columns
    (``plan``: each with ``name``, ``kind``, ``dtype``, ``item_shape``) are checked against
    the dataset's before anything is converted."""
    if resume:
        raise LoaderxValueError("append=True converts the source in one transaction onto the "
                                "dataset at dst, resume=True writes a new dataset in parts: "
                                "pass one of them")
    refuse_overwrite_and_codec(overwrite, options.codec, "zstd")

    def convert(path: str, existing: Existing | None) -> int:
        if existing is None:
            return write(path, options)
        existing.require_columns([(leaf.name, leaf.kind, leaf.dtype, leaf.item_shape)
                                  for leaf in plan], "the table")
        # Rows for a directory without a commit point are joined store by store: a store
        # per column (a column group is appended in place only).
        grouped = options.group_columns and has_commit_point(existing.manifest)
        return write(path, replace(options, codec=existing.codecs(), group_columns=grouped,
                                   checksums=options.checksums or existing.checksums))

    return append_converted(dst, convert, "the table")[1].rows
