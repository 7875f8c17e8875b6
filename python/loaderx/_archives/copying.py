"""The implementation behind :mod:`loaderx.copying`, the public module, whose documentation
says what this does and why."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from loaderx import _native
from loaderx._store import schema as _schema
from loaderx._store import staging
from loaderx._store.sparse import copy_files, data_regions, store_files, write_sparse
from loaderx.errors import CorruptStoreError, DatasetError, StoreChangedError
from loaderx.intake.directory import (
    MANIFEST_FILE,
    PARTS_DIR,
    ColumnStore,
    Manifest,
    claim_destination,
    column_stores,
    is_dataset_directory,
    manifest_and_bytes,
    open_dataset,
    put_in_place,
    release_stores,
)
from loaderx.zrecord import Zrecord

__all__ = ["copy", "copy_files", "data_regions", "held_still", "store_files", "verified",
           "write_sparse", "claim_new", "check_dataset", "dataset_files", "DatasetFiles",
           "verified_stores", "dataset_report"]


@contextlib.contextmanager
def held_still(src: str) -> Iterator[None]:
    """While inside, nobody writes the store ``src``: its writer lock is held when it can be
    taken (a read-only store cannot be written by anyone of ours either), and what was
    written before is synced."""
    if not _schema.is_store(src):
        raise DatasetError(f"{src} is not a loaderx store (no {_schema.META_FILE})")
    source = Zrecord(src)
    try:
        try:
            source.lock_for_writing()  # nobody writes it while it is read (else busy)
        except (OSError, StoreChangedError):
            pass  # read-only, or retired (replaced): nobody of ours can write it either
        source.sync()
        yield
    finally:
        source.close()


def verified(path: str, what: str) -> tuple[int, dict[str, Any]]:
    """Opens the store ``path``, decodes every record and returns ``(records, report)``;
    raises CorruptStoreError naming ``what`` if a record fails."""
    with Zrecord(path) as z:
        report = z.verify(max_listed=3)  # memory bounded however much is damaged
        records = len(z)
    if report["failed"]:
        raise CorruptStoreError(f"{what} {path} does not verify: {report['failed']} damaged "
                                f"records, the first: {report['failures']}")
    return records, report


def claim_new(dst: str, overwrite: bool, verb: str) -> list[Zrecord]:
    """Readies the destination ``dst`` (absolute) of a new store or dataset directory: removes
    what killed writers left there (:func:`loaderx.staging.remove_stale`) and refuses an
    existing ``dst`` -- unless ``overwrite``, which takes a loaderx store or dataset directory
    (:func:`~loaderx.intake.directory.claim_destination`: its stores are returned write-locked,
    for :func:`~loaderx.intake.directory.put_in_place`)."""
    staging.remove_stale(dst)
    if os.path.lexists(dst) and not overwrite:
        raise DatasetError(f"{dst} exists; {verb} makes a new directory (pass overwrite=True "
                           "to replace a loaderx store or dataset there)")
    return claim_destination(dst, overwrite)


def copy(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
         overwrite: bool = False) -> dict[str, Any]:
    """Copies the store or dataset directory ``src`` to ``dst``, holes kept, and checks the copy
    by decoding every record (see the module docstring). ``dst`` must not exist, unless
    ``overwrite=True`` (which replaces a store or dataset directory there atomically).

    Returns ``kind`` (``"store"`` or ``"dataset"``), ``records`` (of every store),
    ``bytes_copied``, ``apparent_bytes`` and the ``verify()`` report (of every store, summed);
    for a dataset directory also ``rows``, ``columns``, ``parts`` and ``stores`` (counts)."""
    src, dst = os.fspath(src), os.path.abspath(os.fspath(dst))
    dataset = is_dataset_directory(src)
    if not dataset and not _schema.is_store(src):
        raise DatasetError(f"{src} is not a loaderx store (no {_schema.META_FILE}) nor a "
                           f"dataset directory (no {MANIFEST_FILE})")
    if os.path.lexists(dst) and os.path.realpath(src) == os.path.realpath(dst):
        raise DatasetError(f"{dst} is {src} itself; copy to another path")
    old = claim_new(dst, overwrite, "copy")
    try:
        if dataset:
            return _copy_dataset(os.path.abspath(src), dst, old)
        with held_still(src), staging.private_dir(dst, "copy") as tmp:
            copied, apparent = copy_files(src, tmp)
            # Checked before it replaces anything: a damaged source never takes dst's place.
            records, report = verified(tmp, "the copy")
            put_in_place(tmp, dst, old)
    finally:
        release_stores(old)
    return {"kind": "store", "records": records, "bytes_copied": copied,
            "apparent_bytes": apparent, "verify": report}


# -- dataset directories -------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetFiles:
    """What a copy or an archive takes of a dataset directory: its manifest and the bytes it
    was read from, ``(part path, manifest bytes)`` of each part, and its stores."""

    manifest: Manifest
    manifest_bytes: bytes
    parts: list[tuple[str, bytes]]
    stores: list[ColumnStore]


def dataset_files(src: str) -> DatasetFiles:
    """The :class:`DatasetFiles` of the dataset directory ``src`` (absolute), checked first as
    ``open_dataset`` checks it (:func:`check_dataset`)."""
    check_dataset(src, src)
    manifest, raw = manifest_and_bytes(src)
    parts = [(p.path, manifest_and_bytes(os.path.join(src, *p.path.split("/")))[1])
             for p in manifest.parts]
    return DatasetFiles(manifest, raw, parts, column_stores(src, manifest))


def check_dataset(path: str, name: str) -> None:
    """Raises CorruptStoreError unless the dataset directory ``path`` opens: every column's
    store there, of the manifest's kind, dtype, item shape and row count. Messages call
    ``path`` ``name`` (a staging directory is named by what it becomes)."""
    try:
        for ds in open_dataset(path).values():
            ds.close()
    except (CorruptStoreError, DatasetError, OSError) as e:
        raise CorruptStoreError(str(e).replace(path, name)) from None


def verified_stores(root: str, stores: list[ColumnStore],
                    name: str) -> list[tuple[int, dict[str, Any]]]:
    """:func:`verified` for each store of the dataset directory ``root``; an error names the
    column and calls ``root`` ``name``."""
    reports = []
    for store in stores:
        path = os.path.join(root, *store.path.split("/"))
        try:
            reports.append(verified(path, f"column {store.column.name!r}:"))
        except CorruptStoreError as e:
            raise CorruptStoreError(str(e).replace(root, name)) from None
    return reports


def dataset_report(files: DatasetFiles,
                   reports: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """The counts a copy or an unpack of a dataset directory reports: ``rows``, ``columns``,
    ``parts``, ``stores``, ``records`` (of every store) and their ``verify`` reports summed
    (``failures`` is empty: a store that does not verify is refused)."""
    summed: dict[str, Any] = {"records": 0, "checked": 0, "unchecked": 0, "failed": 0,
                              "failures": []}
    for _, report in reports:
        for key in ("records", "checked", "unchecked", "failed"):
            summed[key] += report[key]
    return {"kind": "dataset", "rows": files.manifest.rows,
            "columns": len(files.manifest.columns), "parts": len(files.parts),
            "stores": len(files.stores), "records": sum(n for n, _ in reports),
            "verify": summed}


def _copy_dataset(src: str, dst: str, old: list[Zrecord]) -> dict[str, Any]:
    files = dataset_files(src)
    copied = apparent = 0
    with staging.private_dir(dst, "copy") as tmp:
        with contextlib.ExitStack() as still:
            for store in files.stores:  # nobody writes any of them while they are copied
                still.enter_context(held_still(os.path.join(src, *store.path.split("/"))))
            for store in files.stores:
                into = os.path.join(tmp, *store.path.split("/"))
                os.makedirs(into)
                c, a = copy_files(os.path.join(src, *store.path.split("/")), into)
                copied, apparent = copied + c, apparent + a
                staging.fsync_dir(os.path.dirname(into))
        for path, raw in files.parts:
            folder = os.path.join(tmp, *path.split("/"))
            os.makedirs(folder, exist_ok=True)  # a part of no columns has no store to make it
            _native.replace_file(folder, MANIFEST_FILE, raw)
        if files.parts:
            staging.fsync_dir(os.path.join(tmp, PARTS_DIR))
        # The manifest last: with it the directory is complete.
        _native.replace_file(tmp, MANIFEST_FILE, files.manifest_bytes)
        reports = verified_stores(tmp, files.stores, f"the copy of {src}")
        check_dataset(tmp, f"the copy of {src}")
        put_in_place(tmp, dst, old)
    return {**dataset_report(files, reports), "bytes_copied": copied,
            "apparent_bytes": apparent}
