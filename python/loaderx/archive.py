"""Packing a store into one tar archive and unpacking it, holes kept both ways.

``pack`` writes a POSIX (pax) tar whose members with holes are in GNU's sparse format 1.0:
only their data regions are stored, so the 256 MiB ``meta.zr`` of a small store takes a few
KiB, and GNU tar (``tar -xf``), bsdtar and Python's ``tarfile`` all restore the holes. The
archive is compressed when its name says so (``.tar.gz``/``.tgz``, ``.tar.xz``, ``.tar.bz2``).
The members sit in one folder named after the store, as ``tar`` users expect. Only the store's
own files go in (not ``gen.zr``, whose change counters belong to the handles of the original,
nor anything else found in the directory).

The archive says what it holds, in pax ``comment`` records that tar programs ignore: the top
folder's header (the first) lists every file with its size -- the manifest -- and each file's
header gives the CRC-32 of its body as stored (computed by reading the file once before it is
written, then checked against what was written). So even an uncompressed archive of a store
without checksums cannot lose a file or change a byte unseen.

``unpack`` reads such an archive, or one made with ``tar --sparse`` or a plain ``tar`` (runs
of zero blocks are then left as holes), into a new directory. An archive is data from
elsewhere, so it is read strictly and bounded before anything is trusted
(:mod:`loaderx._tar_reader`, :mod:`loaderx._archive_stream`): every header's checksum, the
compression's own check (read to the end of the file, nothing after it), the end-of-archive
blocks; only regular files with a store file's name in one top folder, each once and within
the size docs/FORMAT.md gives it; then the manifest when there is one. Nothing is written
outside a private staging directory, and every record is decoded before the directory takes
its name. Every fault of the archive is a CorruptStoreError naming it.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import zlib
from typing import Any, Literal

from loaderx import _native, _schema, staging
from loaderx._archive_stream import ArchiveStream
from loaderx._tar_reader import Limits, Member, TarReader
from loaderx.copying import data_regions, held_still, store_files, verified, write_sparse
from loaderx.errors import CorruptStoreError, DatasetError

__all__ = ["pack", "unpack"]

_BLOCK = 64 << 10  # also the granularity at which runs of zeros become holes

# What docs/FORMAT.md allows each store file to be.
_TABLE_BYTES = 16 + 16 * _native.MAX_RECORDS  # meta.zr and sums.zr: exactly this
_CHUNK_CAPACITY = 1 << 32
_MAX_CHUNKS = _native.MAX_RECORDS * _native.MAX_RECORD_BYTES // _CHUNK_CAPACITY  # 4096
_MAX_DICT_BYTES = 32 << 20
_GEN_BYTES = 64
_CHUNK = re.compile(r"(0|[1-9][0-9]{0,3})\.zr")
_NAMED = {"meta.zr", "sums.zr", "dict.zr", "gen.zr", _schema.SCHEMA_FILE}
_NOT_CARRIED = "gen.zr"  # a fresh store makes its own; a retired one would stay retired

# How much an archive of one store may hold. A store has at most 4096 chunk files and five
# others, each with an extension header or two; names are short; 2**20 data regions per file
# (16 MiB of map) is far more than any file system gives a 4 GiB chunk.
_LIMITS = Limits(headers=4 * (_MAX_CHUNKS + 8), extension_bytes=1 << 20,
                 extension_total=16 << 20, regions=1 << 20, trailing_zeros=16 << 20)

_MANIFEST_KEY, _CRC_KEY = "loaderx-pack", "loaderx-pack-crc32"
_MANIFEST_VERSION = 1


def _size_limit(name: str) -> tuple[int, bool] | None:
    """``(limit, exact)`` for a store file's name, or None when it names none."""
    if name in ("meta.zr", "sums.zr"):
        return _TABLE_BYTES, True
    if name == "gen.zr":
        return _GEN_BYTES, True
    if name == "dict.zr":
        return _MAX_DICT_BYTES, False
    if name == _schema.SCHEMA_FILE:
        return _schema.MAX_SCHEMA_BYTES, False
    m = _CHUNK.fullmatch(name)
    if m is not None and int(m.group(1)) < _MAX_CHUNKS:
        return _CHUNK_CAPACITY, False
    return None


_WriteMode = Literal["w", "w:gz", "w:xz", "w:bz2"]


def _write_mode(archive: str) -> _WriteMode:
    modes: tuple[tuple[tuple[str, ...], _WriteMode], ...] = (
        ((".tar.gz", ".tgz"), "w:gz"), ((".tar.xz", ".txz"), "w:xz"),
        ((".tar.bz2", ".tbz2"), "w:bz2"))
    for suffixes, mode in modes:
        if archive.endswith(suffixes):
            return mode
    return "w"


# -- pack ------------------------------------------------------------------------------------


class _Body(io.RawIOBase):
    """A member's body read from the open file ``fd``: ``head`` (a sparse map, or nothing),
    then the bytes of each ``(offset, length)`` data region back to back. Keeps the CRC-32 of
    what it gave."""

    def __init__(self, fd: int, regions: list[tuple[int, int]], head: bytes = b"") -> None:
        self.head = head
        self.fd, self.regions = fd, [r for r in regions if r[1]]
        self.size = len(head) + sum(length for _, length in regions)
        self.sent = 0
        self.region, self.into = 0, 0  # the data region being sent, and how far into it
        self.crc = 0

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
        self.crc = zlib.crc32(out, self.crc)
        return bytes(out)


def _sparse_map(regions: list[tuple[int, int]]) -> bytes:
    """GNU sparse 1.0's map: the count, then offset and length of each data region, one
    decimal number per line, padded to a 512-byte block."""
    numbers = [len(regions)] + [n for region in regions for n in region]
    head = "".join(f"{n}\n" for n in numbers).encode()
    return head + bytes(-len(head) % tarfile.BLOCKSIZE)


def _comment(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _packable(src: str) -> tuple[list[str], list[str]]:
    """The store files of ``src`` that go into an archive, and the names left out."""
    names = store_files(src)
    kept = [n for n in names if _size_limit(n) is not None and n != _NOT_CARRIED]
    return kept, [n for n in names if n not in kept and n != _NOT_CARRIED]


def pack(src: str | os.PathLike[str], archive: str | os.PathLike[str]) -> dict[str, Any]:
    """Writes the store (or dataset) ``src`` into the new tar archive ``archive``, holes kept
    (GNU sparse format 1.0 inside a pax tar; compressed by the name's suffix), with a manifest
    and each file's CRC-32. The store's writer lock is held meanwhile when it can be taken.
    Returns ``records``, ``bytes_packed`` (data regions stored), ``apparent_bytes``,
    ``archive_bytes`` and ``skipped`` (files in the directory that are not a store's, left
    out)."""
    src, archive = os.fspath(src), os.fspath(archive)
    if os.path.lexists(archive):
        raise DatasetError(f"{archive} exists; pack writes a new archive")
    staging.remove_stale(archive)
    top = os.path.basename(os.path.abspath(src))
    packed = apparent = 0
    with held_still(src):
        records = _record_count(src)
        names, skipped = _packable(src)
        sizes = {name: os.lstat(os.path.join(src, name)).st_size for name in names}
        with staging.private_file(archive, "packing") as (tmp, tmp_fd):
            written = _write_tar(tmp_fd, _write_mode(archive), src, top, sizes)
            staging.publish(tmp, archive)
    for stored, size in written.values():
        packed += stored
        apparent += size
    return {"records": records, "bytes_packed": packed, "apparent_bytes": apparent,
            "archive_bytes": os.path.getsize(archive), "skipped": skipped}


def _write_tar(out_fd: int, mode: _WriteMode, src: str, top: str,
               sizes: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Writes the archive of the files ``sizes`` names (with their sizes) into ``out_fd``;
    returns each file's (data bytes, apparent size)."""
    written: dict[str, tuple[int, int]] = {}
    with os.fdopen(os.dup(out_fd), "wb") as out:
        with tarfile.open(fileobj=out, mode=mode, format=tarfile.PAX_FORMAT) as tar:
            folder = tarfile.TarInfo(top)
            folder.type, folder.mode = tarfile.DIRTYPE, 0o755
            folder.mtime = int(os.stat(src).st_mtime)
            folder.pax_headers = {"comment": _comment(
                {_MANIFEST_KEY: _MANIFEST_VERSION, "files": sizes})}
            tar.addfile(folder)
            for name in sizes:
                fd = os.open(os.path.join(src, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    written[name] = (_add_file(tar, fd, f"{top}/{name}", sizes[name]), sizes[name])
                finally:
                    os.close(fd)
        out.flush()
    return written


def _record_count(path: str) -> int:
    from loaderx.zrecord import Zrecord

    with Zrecord(path) as z:
        return len(z)


def _add_file(tar: tarfile.TarFile, fd: int, name: str, size: int | None = None) -> int:
    """Adds the open file ``fd`` as ``name``, its header carrying the CRC-32 of its body;
    returns the data bytes stored. ``size``: what the manifest says it is."""
    st = os.fstat(fd)
    if size is not None and st.st_size != size:
        raise CorruptStoreError(f"{name} changed size while it was packed")
    regions = list(data_regions(fd, st.st_size))
    data = sum(length for _, length in regions)
    info = tarfile.TarInfo(name)
    info.mode, info.mtime = 0o644, int(st.st_mtime)
    head = b""
    if data == st.st_size:  # no holes: a plain member
        regions = [(0, st.st_size)]
    else:
        # A final empty region at the end marks a trailing hole, as GNU tar writes it
        # (without one, GNU tar ends the file at its last data).
        regions.append((st.st_size, 0))
        head = _sparse_map(regions)
        folder, base = name.rsplit("/", 1)
        info.name = f"{folder}/GNUSparseFile.0/{base}"  # what tools without sparse support show
        info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                            "GNU.sparse.name": name, "GNU.sparse.realsize": str(st.st_size)}
    # The checksum goes in the header, before the body: a first read computes it (the second
    # then mostly comes from the page cache).
    first = _Body(fd, regions, head)
    while first.read(_BLOCK * 16):
        pass
    info.pax_headers = {**info.pax_headers, "comment": _comment({_CRC_KEY: first.crc})}
    body = _Body(fd, regions, head)
    info.size = body.size
    tar.addfile(info, body)
    if body.crc != first.crc:
        raise CorruptStoreError(f"{name} changed while it was packed")
    return data


# -- unpack ----------------------------------------------------------------------------------


def unpack(archive: str | os.PathLike[str], dst: str | os.PathLike[str]) -> dict[str, Any]:
    """Unpacks the store in ``archive`` (made by ``pack``, ``tar --sparse`` or plain ``tar``:
    one top folder of store files) into the new directory ``dst``, holes kept, and decodes
    every record before ``dst`` appears. Returns ``records``, ``bytes_written`` and the
    ``verify()`` report (``failures`` is empty: a store that does not verify is refused)."""
    archive, dst = os.fspath(archive), os.fspath(dst)
    if os.path.lexists(dst):
        raise DatasetError(f"{dst} exists; unpack makes a new directory")
    staging.remove_stale(dst)
    with staging.private_dir(dst, "unpacking") as tmp:
        written = _extract(archive, tmp)
        staging.fsync_dir(tmp)
        records, report = verified(tmp, f"the store unpacked from {archive}:")
        staging.publish(tmp, dst)
    return {"records": records, "bytes_written": written, "verify": report}


class _Contents:
    """What unpack accepts, member by member, and what it has seen."""

    def __init__(self, archive: str) -> None:
        self.archive = archive
        self.top: str | None = None
        self.folder_seen = False
        self.files: dict[str, int | None] = {}  # name -> the CRC-32 its header gives
        self.manifest: dict[str, int] | None = None

    def _refuse(self, why: str) -> CorruptStoreError:
        return CorruptStoreError(f"{self.archive}: {why}")

    def admit(self, member: Member) -> None:
        """Raises unless ``member`` is something a store archive may hold, before any of its
        body is read."""
        if member.kind == "global":
            if any(k in ("path", "size", "linkpath") or k.startswith("GNU.sparse.")
                   for k in member.pax):
                raise self._refuse("a pax global header that changes names or sizes")
            return
        parts = member.name.rstrip("/").split("/")
        if self.top is None:
            self.top = parts[0]
        if member.kind == "dir" and parts == [self.top] and self.top not in ("", ".", ".."):
            if self.folder_seen or self.files or member.stored:
                raise self._refuse(f"the top folder {member.name!r} is listed twice, late, "
                                   "or with contents")
            self.folder_seen = True
            self.manifest = self._pack_comment(member, _MANIFEST_KEY)
            if self.manifest is not None and _schema.META_FILE not in self.manifest:
                raise self._refuse(f"its manifest lists no {_schema.META_FILE}")
            return
        if (len(parts) != 2 or parts[0] != self.top or self.top in ("", ".", "..")
                or member.kind != "file" or _size_limit(parts[1]) is None):
            raise self._refuse(
                f"member {member.name!r} is not a store file in the archive's one top folder "
                "(an archive of one store holds only regular files named like meta.zr, 0.zr "
                f"(chunks 0 to {_MAX_CHUNKS - 1}), dict.zr, schema.msgpack)")
        name = parts[1]
        if name in self.files:
            raise self._refuse(f"{member.name!r} is in it twice")
        limit, exact = _size_limit(name) or (0, True)
        if member.size > limit or (exact and member.size != limit):
            raise self._refuse(f"{name} is {member.size} bytes; a store's {name} is "
                               f"{'exactly' if exact else 'at most'} {limit} bytes")
        crc = self._pack_comment(member, _CRC_KEY)
        if self.manifest is None and crc is not None:
            raise self._refuse("it has the checksums pack writes but not their manifest (its "
                               "first header is lost or damaged)")
        if self.manifest is not None:
            if name not in self.manifest:
                raise self._refuse(f"{name} is not in the archive's manifest")
            if member.size != self.manifest[name]:
                raise self._refuse(f"{name} is {member.size} bytes, its manifest says "
                                   f"{self.manifest[name]}")
            if crc is None:
                raise self._refuse(f"{name} has lost the checksum pack gives every file")
        self.files[name] = crc

    def _pack_comment(self, member: Member, key: str) -> Any:
        """What pack wrote under ``key`` in the member's pax comment (the manifest's table of
        sizes, or a CRC-32), checked; None when the comment is not pack's."""
        text = member.pax.get("comment", "")
        if key not in text:
            return None
        try:
            value = json.loads(text)
        except ValueError:
            raise self._refuse("its manifest or a checksum is damaged (not JSON)") from None
        if not isinstance(value, dict) or key not in value:
            raise self._refuse("its manifest or a checksum is damaged")
        if key == _CRC_KEY:
            crc = value[key]
            if type(crc) is not int or not 0 <= crc < 1 << 32 or len(value) != 1:
                raise self._refuse(f"the checksum of {member.name!r} is damaged")
            return crc
        table = value.get("files")
        if (value[key] != _MANIFEST_VERSION or not isinstance(table, dict)
                or len(table) > _MAX_CHUNKS + len(_NAMED)
                or not all(isinstance(k, str) and _size_limit(k) is not None
                           and type(v) is int and v >= 0 for k, v in table.items())):
            raise self._refuse("its manifest is damaged or of another version")
        return table

    def body_read(self, name: str, crc: int) -> None:
        """The body of ``name`` was read whole; its CRC-32 was ``crc``."""
        if self.files[name] not in (None, crc):
            raise self._refuse(f"{name} does not match its checksum: damaged")

    def complete(self) -> None:
        """Raises unless everything a store needs (and everything the manifest lists) was
        there."""
        if self.manifest is not None:
            missing = sorted(set(self.manifest) - set(self.files))
            if missing:
                raise self._refuse(f"it lacks {', '.join(missing)}, which its manifest lists: "
                                   "cut short or damaged")
        if _schema.META_FILE not in self.files:
            raise self._refuse(f"it holds no {_schema.META_FILE}: not a store archive")


def _extract(archive: str, into: str) -> int:
    """Writes the archive's store files into the empty directory ``into``; returns the data
    bytes written."""
    contents = _Contents(archive)
    written = 0
    with ArchiveStream(archive) as stream:
        reader = TarReader(stream, archive, _LIMITS)
        for member in reader.members(contents.admit):
            if member.kind != "file":
                continue
            name = member.name.rstrip("/").split("/")[1]
            if name == _NOT_CARRIED:
                reader.skip()
            else:
                written += _write_member(reader, member, os.path.join(into, name))
            contents.body_read(name, reader.body_crc())
    contents.complete()
    return written


def _write_member(reader: TarReader, member: Member, path: str) -> int:
    def read_at(at: int, n: int) -> bytes:
        return reader.read(n)  # the regions come in order, their bytes back to back

    return write_sparse(path, member.size, member.data_regions(), read_at, block=_BLOCK,
                        zeros_as_holes=True)
