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

import errno
import os
from typing import Any

from loaderx import _schema
from loaderx.errors import CorruptStoreError, DatasetError
from loaderx.zrecord import Zrecord

__all__ = ["copy"]

_BLOCK = 8 << 20


def _copy_sparse(src: str, dst: str) -> int:
    """Copies the data regions of ``src`` into a new file ``dst`` of the same size; returns
    the bytes copied."""
    copied = 0
    fin = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fin).st_size
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.ftruncate(fout, size)
            at = 0
            while at < size:
                try:
                    start = os.lseek(fin, at, os.SEEK_DATA)
                except OSError as e:
                    if e.errno == errno.ENXIO:  # nothing but a hole from here
                        break
                    raise
                end = os.lseek(fin, start, os.SEEK_HOLE)
                while start < end:
                    chunk = os.pread(fin, min(_BLOCK, end - start), start)
                    if not chunk:
                        break
                    os.pwrite(fout, chunk, start)
                    start += len(chunk)
                    copied += len(chunk)
                at = end
            os.fsync(fout)
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    return copied


def copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> dict[str, Any]:
    """Copies the store (or dataset) ``src`` to the new directory ``dst``, holes kept, then
    checks the copy by decoding every record. Returns ``records``, ``bytes_copied``,
    ``apparent_bytes`` and the copy's ``verify()`` report. ``dst`` must not exist."""
    src, dst = os.fspath(src), os.fspath(dst)
    if not _schema.is_store(src):
        raise DatasetError(f"{src} is not a loaderx store (no {_schema.META_FILE})")
    if os.path.lexists(dst):
        raise DatasetError(f"{dst} exists; copy makes a new directory")
    source = Zrecord(src)
    try:
        try:
            source.lock_for_writing()  # nobody writes it while it is copied (else busy)
        except OSError:
            pass  # a read-only source: nobody of ours can write it either
        source.sync()
        tmp = f"{dst.rstrip(os.sep)}.copying-{os.getpid()}"
        os.makedirs(tmp)
        copied = apparent = 0
        try:
            for name in sorted(os.listdir(src)):
                path = os.path.join(src, name)
                if not os.path.isfile(path) or os.path.islink(path) or ".tmp" in name:
                    continue
                copied += _copy_sparse(path, os.path.join(tmp, name))
                apparent += os.path.getsize(path)
            _schema.fsync_dir(tmp)
            os.rename(tmp, dst)
            _schema.fsync_dir(os.path.dirname(os.path.abspath(dst)))
        except BaseException:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        source.close()
    with Zrecord(dst) as z:
        report = z.verify()
        records = len(z)
    if report["failures"]:
        raise CorruptStoreError(f"the copy {dst} does not verify: {report['failures'][:3]}")
    return {"records": records, "bytes_copied": copied, "apparent_bytes": apparent,
            "verify": report}
