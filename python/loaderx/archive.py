"""Packing a store into one tar archive and unpacking it, holes kept both ways.

``pack`` writes a POSIX (pax) tar whose members with holes are in GNU's sparse format 1.0:
only their data regions are stored, so the 256 MiB ``meta.zr`` of a small store takes a few
KiB, and GNU tar (``tar -xf``), bsdtar and Python's ``tarfile`` all restore the holes. The
archive is compressed when its name says so (``.tar.gz``/``.tgz``, ``.tar.xz``, ``.tar.bz2``).
The members sit in one folder named after the store, as ``tar`` users expect.

``unpack`` reads such an archive, or one made with ``tar --sparse`` or a plain ``tar`` (runs
of zero blocks are then left as holes), into a new directory. An archive is data from
elsewhere: only regular files with a store file's name, in one top folder, are accepted, each
once; nothing is written outside the new directory; every record is decoded before the
directory takes its name.
"""

from __future__ import annotations

import io
import lzma
import os
import re
import shutil
import tarfile
import zlib
from typing import Any, Literal

from loaderx import _schema
from loaderx.copying import data_regions, held_still, store_files, verified, write_sparse
from loaderx.errors import CorruptStoreError, DatasetError

__all__ = ["pack", "unpack"]

_BLOCK = 64 << 10  # also the granularity at which runs of zeros become holes
_STORE_FILE = re.compile(r"(meta|gen|sums|dict)\.zr|[0-9]{1,9}\.zr|schema\.msgpack")


_WriteMode = Literal["w", "w:gz", "w:xz", "w:bz2"]


def _write_mode(archive: str) -> _WriteMode:
    modes: tuple[tuple[tuple[str, ...], _WriteMode], ...] = (
        ((".tar.gz", ".tgz"), "w:gz"), ((".tar.xz", ".txz"), "w:xz"),
        ((".tar.bz2", ".tbz2"), "w:bz2"))
    for suffixes, mode in modes:
        if archive.endswith(suffixes):
            return mode
    return "w"


class _SparseBody(io.RawIOBase):
    """A sparse member's body in format 1.0: the map (count, then offset and length of each
    data region, one decimal number per line, padded to a 512-byte block), then the regions'
    bytes back to back."""

    def __init__(self, fd: int, regions: list[tuple[int, int]]) -> None:
        numbers = [len(regions)] + [n for region in regions for n in region]
        head = "".join(f"{n}\n" for n in numbers).encode()
        self.head = head + bytes(-len(head) % tarfile.BLOCKSIZE)
        self.fd, self.regions = fd, [r for r in regions if r[1]]
        self.size = len(self.head) + sum(length for _, length in regions)
        self.sent = 0
        self.region, self.into = 0, 0  # the data region being sent, and how far into it

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.sent if n < 0 else min(n, self.size - self.sent)
        out = bytearray()
        if self.sent < len(self.head):
            out += self.head[self.sent:self.sent + n]
        while len(out) < n:
            start, length = self.regions[self.region]
            piece = os.pread(self.fd, min(n - len(out), length - self.into), start + self.into)
            if not piece:
                raise CorruptStoreError("a store file shrank while it was packed")
            out += piece
            self.into += len(piece)
            if self.into == length:
                self.region, self.into = self.region + 1, 0
        self.sent += len(out)
        return bytes(out)


def pack(src: str | os.PathLike[str], archive: str | os.PathLike[str]) -> dict[str, Any]:
    """Writes the store (or dataset) ``src`` into the new tar archive ``archive``, holes kept
    (GNU sparse format 1.0 inside a pax tar; compressed by the name's suffix). The store's
    writer lock is held meanwhile when it can be taken. Returns ``records``,
    ``bytes_packed`` (data regions stored), ``apparent_bytes`` and ``archive_bytes``."""
    src, archive = os.fspath(src), os.fspath(archive)
    if os.path.lexists(archive):
        raise DatasetError(f"{archive} exists; pack writes a new archive")
    top = os.path.basename(os.path.abspath(src))
    tmp = f"{archive}.packing-{os.getpid()}"
    packed = apparent = 0
    with held_still(src):
        records = _record_count(src)
        try:
            with tarfile.open(tmp, _write_mode(archive), format=tarfile.PAX_FORMAT) as tar:
                tar.add(src, arcname=top, recursive=False)
                for name in store_files(src):
                    fd = os.open(os.path.join(src, name), os.O_RDONLY | os.O_NOFOLLOW)
                    try:
                        packed_here, size = _add_file(tar, fd, f"{top}/{name}")
                    finally:
                        os.close(fd)
                    packed += packed_here
                    apparent += size
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.rename(tmp, archive)
        except BaseException:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            raise
    _schema.fsync_dir(os.path.dirname(os.path.abspath(archive)))
    return {"records": records, "bytes_packed": packed, "apparent_bytes": apparent,
            "archive_bytes": os.path.getsize(archive)}


def _record_count(path: str) -> int:
    from loaderx.zrecord import Zrecord

    with Zrecord(path) as z:
        return len(z)


def _add_file(tar: tarfile.TarFile, fd: int, name: str) -> tuple[int, int]:
    """Adds the open file ``fd`` as ``name``; returns (data bytes stored, apparent size)."""
    st = os.fstat(fd)
    regions = list(data_regions(fd, st.st_size))
    data = sum(length for _, length in regions)
    info = tarfile.TarInfo(name)
    info.mode, info.mtime = 0o644, int(st.st_mtime)
    if data == st.st_size:  # no holes: a plain member
        info.size = st.st_size
        with os.fdopen(os.dup(fd), "rb") as f:
            f.seek(0)  # finding the regions moved the shared offset
            tar.addfile(info, f)
        return data, st.st_size
    # A final empty region at the end marks a trailing hole, as GNU tar writes it (without
    # one, GNU tar ends the file at its last data).
    body = _SparseBody(fd, [*regions, (st.st_size, 0)])
    folder, base = name.rsplit("/", 1)
    info.name = f"{folder}/GNUSparseFile.0/{base}"  # what tools without sparse support show
    info.size = body.size
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                        "GNU.sparse.name": name, "GNU.sparse.realsize": str(st.st_size)}
    tar.addfile(info, body)
    return data, st.st_size


def unpack(archive: str | os.PathLike[str], dst: str | os.PathLike[str]) -> dict[str, Any]:
    """Unpacks the store in ``archive`` (made by ``pack``, ``tar --sparse`` or plain ``tar``:
    one top folder of store files) into the new directory ``dst``, holes kept, and decodes
    every record before ``dst`` appears. Returns ``records``, ``bytes_written`` and the
    ``verify()`` report."""
    archive, dst = os.fspath(archive), os.fspath(dst)
    if os.path.lexists(dst):
        raise DatasetError(f"{dst} exists; unpack makes a new directory")
    tmp = f"{dst.rstrip(os.sep)}.unpacking-{os.getpid()}"
    os.makedirs(tmp)
    try:
        written = _extract(archive, tmp)
        _schema.fsync_dir(tmp)
        records, report = verified(tmp, f"the store unpacked from {archive} into")
        os.rename(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _schema.fsync_dir(os.path.dirname(os.path.abspath(dst)))
    return {"records": records, "bytes_written": written, "verify": report}


def _extract(archive: str, into: str) -> int:
    """Writes the archive's store files into the empty directory ``into``; returns the data
    bytes written."""
    try:
        tar = tarfile.open(archive, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise CorruptStoreError(f"{archive} is not a readable tar archive: {e}") from e
    top: str | None = None
    seen: set[str] = set()
    written = 0
    with tar:
        try:
            for member in tar:
                parts = member.name.rstrip("/").split("/")
                top = parts[0] if top is None else top
                if member.isdir() and parts == [top]:
                    continue
                if (len(parts) != 2 or parts[0] != top or top in ("", ".", "..")
                        or not member.isreg() or not _STORE_FILE.fullmatch(parts[1])):
                    raise CorruptStoreError(
                        f"{archive}: member {member.name!r} is not a store file in the "
                        "archive's one top folder (an archive of one store holds only regular "
                        "files named like meta.zr, 0.zr, dict.zr, schema.msgpack)")
                if parts[1] in seen:
                    raise CorruptStoreError(f"{archive}: {member.name!r} is in it twice")
                seen.add(parts[1])
                written += _extract_file(tar, member, os.path.join(into, parts[1]))
        except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as e:
            raise CorruptStoreError(f"{archive} is damaged or cut short: {e}") from e
        except OSError as e:
            if e.errno is not None:  # the system's error (disk full, ...), not the archive's
                raise
            raise CorruptStoreError(f"{archive} is damaged or cut short: {e}") from e
    if _schema.META_FILE not in seen:
        raise CorruptStoreError(f"{archive} holds no {_schema.META_FILE}: not a store archive")
    return written


def _extract_file(tar: tarfile.TarFile, member: tarfile.TarInfo, path: str) -> int:
    source = tar.extractfile(member)
    if source is None:
        raise CorruptStoreError(f"{member.name!r} has no contents")
    # A sparse member names its data regions; any other is read whole, zero blocks skipped.
    regions = getattr(member, "sparse", None) or [(0, member.size)]

    def read_at(at: int, n: int) -> bytes:
        if source.tell() != at:  # the start of the next region
            source.seek(at)
        block = source.read(n)
        if not block:
            raise CorruptStoreError(f"{member.name!r} is cut short in the archive")
        return block

    with source:
        return write_sparse(path, member.size, regions, read_at, block=_BLOCK,
                            zeros_as_holes=True)
