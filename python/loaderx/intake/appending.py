"""Appending rows in place to a dataset directory, every column at once: the one way a
directory grows (a directory of parts, or rows past what one store per column holds, are
joined into a new directory instead: :mod:`loaderx.intake.growing`).

>>> import numpy as np, os, tempfile
>>> from loaderx.intake import DirectoryWriter, append_rows, open_dataset
>>> dst = os.path.join(tempfile.mkdtemp(), "t")
>>> with DirectoryWriter(dst, group_columns=True) as w:
...     w.add_column("x", "dense", np.float32, (2,))
...     w.add_column("text", "ragged", np.uint8, extra={"string": True})
...     _ = w.append({"x": np.zeros((2, 2), np.float32), "text": [b"a", b"bc"]})
>>> append_rows(dst, {"x": np.ones((1, 2), np.float32), "text": ["déjà"]})
3
>>> open_dataset(dst)["x"][:].tolist()
[[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]

**The commit point.** The manifest's row count is what the directory holds. An append writes the
new rows at the end of every store -- each column's own, and the column group's blocks (the
group's *tail*, the rows after its last full block, is filled into full blocks; the rows left
over become the new tail, kept in the manifest) -- syncs each store it touched, and then
replaces the manifest with the new count in one durable step (write, ``fsync``, rename,
``fsync`` of the directory). Existing rows are never rewritten, so an append costs what its rows
cost plus one sync per store and one for the manifest.

**Readers.** A reader opened before the commit reads the rows of the count it opened
(:func:`~loaderx.intake.open_dataset` pins every column to the manifest's count: records past it
are refused like any index out of range), whatever is appended meanwhile, in this process or
another: an append never raises in a reader. Opening the directory again (or a refresh) takes in
the new rows.

**What a kill leaves.** Before the manifest is replaced, the directory is the old dataset: the
stores may hold records past its count, which no reader reads. The next writer (an append, under
every store's writer lock) trims them first (``Zrecord.truncate``: the count of records goes
back, nothing moves, no reader is disturbed). After the rename it is the new dataset. So a
directory opens as the old or the new dataset at every moment, every acknowledged row is there
after a crash, and the columns of a row always belong together.

**A directory of the older layout** (manifest version 1, a store per column, written with
``group_columns=False``, by ``resume=True`` or by an earlier loaderx) is given a commit point by
its first append (:func:`give_commit_point`: its manifest is replaced with the same columns and
rows under a generation, before any record is written); it then grows like any other.

One writer at a time: the append holds every store's writer lock (another writer gets
:class:`~loaderx.errors.StoreBusyError` at once); readers are unlimited.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import numpy as np

from loaderx import _native
from loaderx._store import staging
from loaderx._views.group import GroupField
from loaderx.errors import CorruptStoreError, DatasetError, LoaderxTypeError, StoreClosedError
from loaderx.intake.directory import (
    MANIFEST_FILE,
    Column,
    Manifest,
    _ColumnWriter,
    _GroupWriter,
    _lock_stores,
    _prepare,
    read_manifest,
    release_stores,
)
from loaderx.zrecord import Codec, Zrecord

__all__ = ["Appender", "append_rows", "has_commit_point"]


def has_commit_point(manifest: Manifest) -> bool:
    """Whether rows are appended to this directory in place (a version-2 manifest of one unit,
    not a directory of parts)."""
    return bool(manifest.generation) and not manifest.parts


def give_commit_point(dst: str) -> Manifest:
    """``dst``'s manifest, given a commit point first when it is a directory of the older
    layout (version 1: a store per column, no generation) of one part: the same columns and
    rows under a new generation, the manifest replaced in one durable step under every store's
    writer lock -- no record is written. Appends are then in place, as for a grouped directory.
    A directory of parts is returned as it is. Every store must hold the manifest's rows
    (CorruptStoreError naming the repair otherwise)."""
    manifest = read_manifest(dst)
    if manifest.generation or manifest.parts:
        return manifest
    stores = _lock_stores(dst)
    try:
        manifest = read_manifest(dst)  # again, under the locks
        if manifest.generation or manifest.parts:
            return manifest
        for z in stores:
            if len(z) != manifest.rows:
                raise CorruptStoreError(
                    f"{z.path} holds {len(z)} records and the manifest of {dst} says "
                    f"{manifest.rows} rows; run loaderx.intake.repair_dataset({dst!r}) first")
        manifest = dataclasses.replace(manifest, generation=os.urandom(8).hex())
        _native.replace_file(dst, MANIFEST_FILE, manifest.to_bytes())
        return manifest
    finally:
        release_stores(stores)


def append_rows(dst: str | os.PathLike[str], rows: Mapping[str, Any]) -> int:
    """Appends ``rows`` (``{column: records}``, every column, as
    :meth:`~loaderx.intake.DirectoryWriter.append` takes them; a string column also takes
    ``str``) to the dataset directory ``dst`` in place, durably, and returns its new row count.
    See the module docstring."""
    with Appender(dst) as appender:
        appender.append(rows)
    return appender.rows


class Appender:
    """One in-place append to the dataset directory ``dst``: any number of :meth:`append`
    calls, then :meth:`commit` (leaving a ``with`` block commits; an exception aborts). Holds
    every store's writer lock from construction to the end."""

    def __init__(self, dst: str | os.PathLike[str]) -> None:
        self.dst = os.path.abspath(os.fspath(dst))
        _require(self.dst, give_commit_point(self.dst))
        self._stores = _lock_stores(self.dst)
        self._state = "open"
        #: Records an interrupted append had left past the commit point, trimmed: by store.
        self.trimmed: dict[str, int] = {}
        try:
            manifest = read_manifest(self.dst)  # again, under the locks: what is changed
            _require(self.dst, manifest)
            self.manifest = manifest
            self.committed = self.rows = manifest.rows
            by_path = {os.path.abspath(z.path): z for z in self._stores}
            self._writers: list[_ColumnWriter] = []
            for col in manifest.columns:
                store = None if col.group is not None else self._store(by_path, col.store,
                                                                       manifest.rows)
                row = int(np.prod(col.item_shape, dtype=np.int64)) * col.dtype.itemsize
                self._writers.append(_ColumnWriter(col, cast(Codec, col.codec), row, None,
                                                   store=store))
            self._groups: list[_GroupWriter] = []
            for k, g in enumerate(manifest.groups):
                members = [i for i, c in enumerate(manifest.columns) if c.group == k]
                fields = [GroupField(c.name, c.dtype, c.item_shape, c.offset)
                          for c in (manifest.columns[i] for i in members)]
                store = self._store(by_path, g.store, g.blocks(manifest.rows))
                tail = np.frombuffer(g.tail, np.uint8).reshape(-1, g.row_bytes).copy()
                self._groups.append(_GroupWriter(dataclasses.replace(g, tail=b""), members,
                                                 fields, _ColumnWriter(
                                                     manifest.columns[members[0]], "raw", 1,
                                                     None, store=store), tail))
            staging._step("append:trimmed")
        except BaseException:
            release_stores(self._stores)
            raise

    def _store(self, by_path: dict[str, Zrecord], name: str, records: int) -> Zrecord:
        """The locked store ``name``, trimmed to ``records`` (what an interrupted append left
        past the commit point goes)."""
        z = by_path.get(os.path.join(self.dst, name))
        if z is None:
            raise CorruptStoreError(f"{os.path.join(self.dst, name)}: a store the manifest "
                                    "names is missing; restore the dataset from a copy")
        held = len(z)
        if held < records:
            raise CorruptStoreError(f"{z.path}: holds {held} records, the manifest of "
                                    f"{self.dst} says {records}; restore it from a copy")
        if held > records:
            z._native.truncate(records)
            self.trimmed[z.path] = held - records
        return z

    def append(self, rows: Mapping[str, Any]) -> int:
        """Writes ``rows`` (every column) after the rows so far; returns the row count they
        make. Checked whole before anything is written (DatasetError, LimitExceededError)."""
        self._check("append")
        if not isinstance(rows, Mapping):
            raise LoaderxTypeError(f"append takes a dict of column -> records, got "
                                   f"{type(rows).__name__}")
        names = [w.column.name for w in self._writers]
        missing = [n for n in names if n not in rows]
        unknown = [k for k in rows if k not in names]
        if missing or unknown:
            raise DatasetError("rows appended must hold every column of the dataset and no "
                               "other: " + "; ".join(filter(None, [
                                   f"missing {missing!r}" if missing else "",
                                   f"unknown {unknown!r}" if unknown else ""])))
        prepared = [_prepare(w, rows[w.column.name]) for w in self._writers]
        counts = {len(bounds) - 1 for _, bounds in prepared}
        if len(counts) > 1:
            raise DatasetError(f"the columns of the rows appended have different row counts: "
                               f"{sorted(counts)}")
        n = counts.pop()
        if not n:
            return self.rows
        self._state = "broken"  # until every store has the rows
        for w, (blob, bounds) in zip(self._writers, prepared, strict=True):
            if w.store is not None:  # the engine's call: this appends to every column at once
                w.store._native.append(np.ascontiguousarray(blob),
                                       (bounds[:-1] - bounds[0]).astype(np.uint64), w.codec)
        for gw in self._groups:
            gw.add(gw.rows_of(prepared, 0, n))
        self._state = "open"
        self.rows += n
        return self.rows

    def commit(self, columns: tuple[Column, ...] | None = None,
               extra: dict[str, Any] | None = None) -> int:
        """Makes the rows durable and publishes the new count (see the module docstring);
        returns it. ``columns`` (the same columns, their ``extra`` changed: class names
        added, say) and ``extra`` (the dataset's keys) replace the manifest's in the same
        commit."""
        self._check("commit")
        if columns is not None and [(c.name, c.store, c.group, c.offset) for c in columns] != \
                [(c.name, c.store, c.group, c.offset) for c in self.manifest.columns]:
            raise DatasetError("commit: columns may change their extra keys only")
        try:
            changed = columns is not None or extra is not None
            if self.rows != self.committed or changed:
                staging._step("append:written")
                touched = [z for z in [w.store for w in self._writers] +
                           [gw.writer.store for gw in self._groups] if z is not None]
                _sync_all(touched)
                staging._step("append:synced")
                manifest = dataclasses.replace(
                    self.manifest, rows=self.rows,
                    groups=tuple(gw.closed() for gw in self._groups),
                    columns=self.manifest.columns if columns is None else columns,
                    extra=self.manifest.extra if extra is None else extra)
                _native.replace_file(self.dst, MANIFEST_FILE, manifest.to_bytes())
                self.manifest, self.committed = manifest, self.rows
                staging._step("append:committed")
        except BaseException:
            self.abort()
            raise
        self._state = "committed"
        release_stores(self._stores)
        return self.rows

    def abort(self) -> None:
        """Gives the append up: the directory stays as its manifest says (the records written
        past its count are trimmed now, or by the next writer)."""
        if self._state in ("committed", "aborted"):
            return
        self._state = "aborted"
        try:
            for w in self._writers:
                if w.store is not None:
                    with contextlib.suppress(Exception):
                        w.store._native.truncate(self.committed)
            for gw in self._groups:
                with contextlib.suppress(Exception):
                    gw.writer.store._native.truncate(  # type: ignore[union-attr]
                        gw.group.blocks(self.committed))
        finally:
            release_stores(self._stores)

    def _check(self, what: str) -> None:
        if self._state == "open":
            return
        if self._state == "broken":
            raise DatasetError(f"{what}: an earlier write to {self.dst} failed; abort this "
                               "append and start again")
        raise StoreClosedError(f"{what}: the append to {self.dst} was already {self._state}")

    def __enter__(self) -> Appender:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self.abort()
        elif self._state == "open":
            self.commit()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.abort()


def _require(dst: str, manifest: Manifest) -> None:
    if manifest.parts:
        raise DatasetError(f"{dst} is a directory of parts; rows are appended in place to a "
                           "directory of one part only (convert it again as a whole)")
    if not manifest.generation:  # (give_commit_point gives every other directory one)
        raise DatasetError(f"{dst} has no commit point; append to it with "
                           "loaderx.intake.append_dataset")


def _sync_all(stores: list[Zrecord]) -> None:
    """Syncs every store, side by side: each waits on the disk, which commits them together."""
    if len(stores) < 2:
        for z in stores:
            z.sync()
        return
    with ThreadPoolExecutor(min(16, len(stores))) as pool:
        for f in [pool.submit(z.sync) for z in stores]:
            f.result()
