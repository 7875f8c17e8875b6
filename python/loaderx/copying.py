"""Copying a store or dataset directory without filling its holes.

``meta.zr`` is a fixed 256 MiB file of which a store uses only the pages its records' entries
are on (``sums.zr`` likewise), and compaction leaves holes in chunk files: a plain ``cp``,
``shutil.copytree`` or ``tar`` without ``--sparse`` writes every hole out as zeros. ``copy``
copies only the data regions of each file (``SEEK_DATA``/``SEEK_HOLE``), keeps each file's
size, holds the source's writer lock meanwhile (when it may take it) so that no writer changes
it half-way, syncs the copy, and then opens it and decodes every record to check it.
``cp --sparse=always`` and ``tar --sparse`` are the shell's sparse-aware equivalents (without
the lock and the check).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from loaderx import _schema, staging
from loaderx.errors import CorruptStoreError, DatasetError, StoreChangedError
from loaderx.zrecord import Zrecord

__all__ = ["copy", "copy_files", "data_regions", "held_still", "store_files", "verified",
           "write_sparse"]

_BLOCK = 8 << 20


def data_regions(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The ``(offset, length)`` of each data region of the open file ``fd`` of ``size`` bytes,
    in order (``SEEK_DATA``/``SEEK_HOLE``); a file system without holes gives one region."""
    at = 0
    while at < size:
        try:
            start = os.lseek(fd, at, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # nothing but a hole from here
                return
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        if end > start:
            yield start, end - start
        at = end


def write_sparse(path: str, size: int, regions: Iterable[tuple[int, int]],
                 read_at: Callable[[int, int], bytes], *, block: int = _BLOCK,
                 zeros_as_holes: bool = False) -> int:
    """Creates the new file ``path`` of ``size`` bytes (never through a link) and fills each
    ``(start, length)`` region from ``read_at(offset, n)``, which returns at most ``n`` bytes
    (``b""`` ends the region early); the rest stays holes. With ``zeros_as_holes``, blocks of
    zeros are left as holes too. Synced; returns the bytes written."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.ftruncate(fd, size)
        for start, length in regions:
            at, end = start, start + length
            while at < end:
                chunk = read_at(at, min(block, end - at))
                if not chunk:
                    break
                if not (zeros_as_holes and chunk.count(0) == len(chunk)):
                    os.pwrite(fd, chunk, at)
                    written += len(chunk)
                at += len(chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    return written


def _copy_sparse(src: str, dst: str) -> int:
    """Copies the data regions of ``src`` into a new file ``dst`` of the same size; returns
    the bytes copied."""
    fin = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fin).st_size
        return write_sparse(dst, size, list(data_regions(fin, size)),
                            lambda at, n: os.pread(fin, n, at))
    finally:
        os.close(fin)


def store_files(src: str) -> list[str]:
    """The names of the files a store directory holds (no temporaries, links or folders)."""
    return [name for name in sorted(os.listdir(src))
            if os.path.isfile(os.path.join(src, name))
            and not os.path.islink(os.path.join(src, name)) and ".tmp" not in name]


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


def copy_files(src: str, dst: str) -> tuple[int, int]:
    """Copies the :func:`store_files` of ``src`` into the existing directory ``dst`` (each a new
    file, holes kept, synced), then syncs ``dst``. Returns ``(bytes copied, apparent bytes)``."""
    copied = apparent = 0
    for name in store_files(src):
        path = os.path.join(src, name)
        copied += _copy_sparse(path, os.path.join(dst, name))
        apparent += os.path.getsize(path)
    staging.fsync_dir(dst)
    return copied, apparent


def copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> dict[str, Any]:
    """Copies the store (or dataset) ``src`` to the new directory ``dst``, holes kept, then
    checks the copy by decoding every record. Returns ``records``, ``bytes_copied``,
    ``apparent_bytes`` and the copy's ``verify()`` report. ``dst`` must not exist.

    The copy is made in a private directory beside ``dst`` and renamed to ``dst`` only when
    complete and synced (:mod:`loaderx.staging`): a kill leaves no ``dst``, and what it left
    is removed by the next copy to ``dst``."""
    src, dst = os.fspath(src), os.fspath(dst)
    staging.remove_stale(dst)
    if os.path.lexists(dst):
        raise DatasetError(f"{dst} exists; copy makes a new directory")
    with held_still(src), staging.private_dir(dst, "copy") as tmp:
        copied, apparent = copy_files(src, tmp)
        staging.publish(tmp, dst)
    records, report = verified(dst, "the copy")
    return {"records": records, "bytes_copied": copied, "apparent_bytes": apparent,
            "verify": report}
