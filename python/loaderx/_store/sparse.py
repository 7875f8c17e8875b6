"""Files with holes, copied or written with the holes kept.

A store's ``meta.zr`` (and ``sums.zr``) is a fixed 256 MiB file of which only a few pages
hold data, and compaction punches holes in chunk files. These helpers find a file's data
regions (``SEEK_DATA``/``SEEK_HOLE``) and write only those, so a copy takes the space the
original takes. :mod:`loaderx.copying` (copies of stores and dataset directories),
:mod:`loaderx.archive` (pack and unpack) and :mod:`loaderx.converter` (a store built beside a
mount point) share them.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable, Iterator

from loaderx._store import staging

__all__ = ["copy_files", "data_regions", "store_files", "write_sparse"]

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
