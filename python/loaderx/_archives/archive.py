"""The implementation behind :mod:`loaderx.archive`, the public module, whose documentation
says what this does and why."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tarfile
import zlib
from dataclasses import dataclass, field
from typing import Any, Literal

from loaderx import _native
from loaderx._archives.copying import (
    DatasetFiles,
    check_dataset,
    claim_new,
    dataset_files,
    dataset_report,
    held_still,
    verified,
    verified_stores,
)
from loaderx._archives.stream import ArchiveStream
from loaderx._archives.tar_reader import Limits, Member, TarReader
from loaderx._store import schema as _schema
from loaderx._store import staging
from loaderx._store.sparse import data_regions, store_files, write_sparse
from loaderx.errors import CorruptStoreError, DatasetError
from loaderx.intake.directory import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    PARTS_DIR,
    ColumnStore,
    column_stores,
    is_dataset_directory,
    is_group_store_name,
    is_part_path,
    is_store_dir_name,
    manifest_and_bytes,
    put_in_place,
    read_manifest,
    release_stores,
)
from loaderx.zrecord import CHUNK_CAPACITY, MAX_CHUNKS, chunk_number

__all__ = ["pack", "unpack"]

_BLOCK = 64 << 10  # also the granularity at which runs of zeros become holes

# What docs/FORMAT.md allows each store file to be.
_TABLE_BYTES = 16 + 16 * _native.MAX_RECORDS  # meta.zr and sums.zr: exactly this
_MAX_DICT_BYTES = 32 << 20
_GEN_BYTES = 64
_NAMED = {"meta.zr", "sums.zr", "dict.zr", "gen.zr", _schema.SCHEMA_FILE}
_NOT_CARRIED = "gen.zr"  # a fresh store makes its own; a retired one would stay retired

# How much an archive of one store may hold. A store has at most 4096 chunk files and five
# others, each with an extension header or two; names are short; 2**20 data regions per file
# (16 MiB of map) is far more than any file system gives a 4 GiB chunk.
_LIMITS = Limits(headers=4 * (MAX_CHUNKS + 8), extension_bytes=1 << 20,
                 extension_total=16 << 20, regions=1 << 20, trailing_zeros=16 << 20)
# An archive of a dataset directory holds any number of stores (a column's, in each part), so
# its bounds are on the whole: 2**20 headers (a file takes one to three: some 350,000 files),
# pax records 256 MiB in all; each file within its own bound as above. Until the archive shows
# it is a dataset directory's, it is read within the bounds of one store.
_DATASET_LIMITS = Limits(headers=1 << 20, extension_bytes=1 << 20, extension_total=256 << 20,
                         regions=1 << 20, trailing_zeros=16 << 20)
#: Files the folders' tables may list in all: an archive's own bound on headers.
_MAX_LISTED = _DATASET_LIMITS.headers

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
    if chunk_number(name) is not None:
        return CHUNK_CAPACITY, False
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
    """Writes the store or dataset directory ``src`` into the new tar archive ``archive``, holes
    kept (GNU sparse format 1.0 inside a pax tar; compressed by the name's suffix), with a
    manifest and each file's CRC-32. Every store's writer lock is held meanwhile when it can
    be taken; a dataset directory is first checked as ``open_dataset`` checks it.

    Returns ``kind`` (``"store"`` or ``"dataset"``), ``records`` (of every store),
    ``bytes_packed`` (data regions stored), ``apparent_bytes``, ``archive_bytes`` and
    ``skipped`` (files in the directory that are not the store's or the dataset's, left out);
    for a dataset directory also ``rows``, ``columns``, ``parts`` and ``stores`` (counts)."""
    src, archive = os.fspath(src), os.fspath(archive)
    if os.path.lexists(archive):
        raise DatasetError(f"{archive} exists; pack writes a new archive")
    staging.remove_stale(archive)
    if is_dataset_directory(src):
        return _pack_dataset(os.path.abspath(src), archive)
    top = os.path.basename(os.path.abspath(src))
    with held_still(src):
        records = _record_count(src)
        entries, skipped = _store_entries(src, top)
        written = _write_archive(archive, entries)
    return {"kind": "store", "records": records, **written, "skipped": skipped}


@dataclass(frozen=True)
class _Folder:
    """A folder member; its pax comment lists the files directly inside it, with their sizes
    (pack's manifest of the folder)."""

    name: str
    mtime: int
    files: dict[str, int]


@dataclass(frozen=True)
class _File:
    """A file member, read from ``path`` (which must still have ``size`` bytes) or, for a
    dataset directory's manifest, from ``data`` (the bytes that were checked)."""

    name: str
    size: int
    path: str = ""
    data: bytes | None = None
    mtime: int = 0  # of ``data``: its folder's


def _store_entries(src: str, folder: str) -> tuple[list[_Folder | _File], list[str]]:
    """The members of the store ``src`` under the folder ``folder``, and the names of the files
    in it that are left out."""
    names, skipped = _packable(src)
    sizes = {name: os.lstat(os.path.join(src, name)).st_size for name in names}
    entries: list[_Folder | _File] = [_Folder(folder, int(os.stat(src).st_mtime), sizes)]
    entries += [_File(f"{folder}/{name}", size, os.path.join(src, name))
                for name, size in sizes.items()]
    return entries, skipped


def _pack_dataset(src: str, archive: str) -> dict[str, Any]:
    """:func:`pack` of a dataset directory: the members in the order docs/FORMAT.md gives (a
    folder's manifest before the stores it names)."""
    files = dataset_files(src)
    top = os.path.basename(src)
    with contextlib.ExitStack() as stack:
        for store in files.stores:
            stack.enter_context(held_still(os.path.join(src, *store.path.split("/"))))
        entries: list[_Folder | _File] = [
            _Folder(top, int(os.stat(src).st_mtime), {MANIFEST_FILE: len(files.manifest_bytes)}),
            _File(f"{top}/{MANIFEST_FILE}", len(files.manifest_bytes),
                  data=files.manifest_bytes, mtime=int(os.stat(src).st_mtime))]
        skipped = _strays(src, files)
        if files.parts:
            entries.append(_Folder(f"{top}/{PARTS_DIR}",
                                   int(os.stat(os.path.join(src, PARTS_DIR)).st_mtime), {}))
        by_part: dict[str, list[ColumnStore]] = {}  # "": the stores of a directory of columns
        for store in files.stores:
            by_part.setdefault("" if store.part is None else store.part.path, []).append(store)
        for path, raw in files.parts or [("", b"")]:
            if path:
                mtime = int(os.stat(os.path.join(src, *path.split("/"))).st_mtime)
                entries += [_Folder(f"{top}/{path}", mtime, {MANIFEST_FILE: len(raw)}),
                            _File(f"{top}/{path}/{MANIFEST_FILE}", len(raw), data=raw,
                                  mtime=mtime)]
            for store in by_part.get(path, []):
                members, left_out = _store_entries(os.path.join(src, *store.path.split("/")),
                                                   f"{top}/{store.path}")
                entries += members
                skipped += [f"{store.path}/{name}" for name in left_out]
        written = _write_archive(archive, entries)
    return {"kind": "dataset", "rows": files.manifest.rows,
            "columns": len(files.manifest.columns), "parts": len(files.parts),
            "stores": len(files.stores), "records": sum(s.rows for s in files.stores),
            **written, "skipped": skipped}


def _strays(src: str, files: DatasetFiles) -> list[str]:
    """What the dataset directory ``src`` holds that is not the dataset's (left out of its
    archive): entries of the directory, of ``parts/`` and of each part beside the manifest and
    the stores it names. Directories end with ``/``."""
    named: dict[str, set[str]] = {"": {MANIFEST_FILE} | ({PARTS_DIR} if files.parts else set())}
    if files.parts:
        named[PARTS_DIR] = {path.split("/")[1] for path, _ in files.parts}
    for path, _ in files.parts:
        named[path] = {MANIFEST_FILE}
    for store in files.stores:
        folder, _, name = store.path.rpartition("/")
        named.setdefault(folder, set()).add(name)
    strays = []
    for folder, names in named.items():
        at = os.path.join(src, *folder.split("/")) if folder else src
        for entry in sorted(set(os.listdir(at)) - names):
            full = os.path.join(at, entry)
            kind = "/" if os.path.isdir(full) and not os.path.islink(full) else ""
            strays.append(f"{folder}/{entry}{kind}" if folder else f"{entry}{kind}")
    return strays


def _write_archive(archive: str, entries: list[_Folder | _File]) -> dict[str, int]:
    """Writes ``entries`` as the new archive ``archive`` (a private file, published when
    complete); returns ``bytes_packed``, ``apparent_bytes`` and ``archive_bytes``."""
    with staging.private_file(archive, "packing") as (tmp, tmp_fd):
        packed, apparent = _write_tar(tmp_fd, _write_mode(archive), entries)
        staging.publish(tmp, archive)
    return {"bytes_packed": packed, "apparent_bytes": apparent,
            "archive_bytes": os.path.getsize(archive)}


def _write_tar(out_fd: int, mode: _WriteMode, entries: list[_Folder | _File]) -> tuple[int, int]:
    """Writes the archive of ``entries`` into ``out_fd``; returns the data bytes stored and the
    files' apparent bytes."""
    packed = apparent = 0
    with os.fdopen(os.dup(out_fd), "wb") as out:
        with tarfile.open(fileobj=out, mode=mode, format=tarfile.PAX_FORMAT) as tar:
            for entry in entries:
                if isinstance(entry, _Folder):
                    folder = tarfile.TarInfo(entry.name)
                    folder.type, folder.mode = tarfile.DIRTYPE, 0o755
                    folder.mtime = entry.mtime
                    folder.pax_headers = {"comment": _comment(
                        {_MANIFEST_KEY: _MANIFEST_VERSION, "files": entry.files})}
                    tar.addfile(folder)
                elif entry.data is not None:
                    packed += _add_bytes(tar, entry.name, entry.data, entry.mtime)
                    apparent += entry.size
                else:
                    fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                    try:
                        packed += _add_file(tar, fd, entry.name, entry.size)
                    finally:
                        os.close(fd)
                    apparent += entry.size
        out.flush()
    return packed, apparent


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


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mtime: int) -> int:
    """Adds ``data`` (a manifest, as it was read and checked) as the file ``name``, its header
    carrying the CRC-32 of its body; returns the bytes stored."""
    info = tarfile.TarInfo(name)
    info.mode, info.mtime, info.size = 0o644, mtime, len(data)
    info.pax_headers = {"comment": _comment({_CRC_KEY: zlib.crc32(data)})}
    tar.addfile(info, io.BytesIO(data))
    return len(data)


# -- unpack ----------------------------------------------------------------------------------


def unpack(archive: str | os.PathLike[str], dst: str | os.PathLike[str], *,
           overwrite: bool = False) -> dict[str, Any]:
    """Unpacks the store or dataset directory in ``archive`` (made by ``pack``, ``tar --sparse``
    or plain ``tar``: one top folder) into the new directory ``dst``, holes kept, and checks it
    before ``dst`` appears: every record decoded, and a dataset directory opened as
    ``open_dataset`` opens it, holding exactly the stores and parts its manifests name.
    ``overwrite=True`` replaces a loaderx store or dataset directory at ``dst`` atomically.

    Returns ``kind`` (``"store"`` or ``"dataset"``), ``records`` (of every store),
    ``bytes_written`` and the ``verify()`` report (of every store, summed; ``failures`` is
    empty: a store that does not verify is refused); for a dataset directory also ``rows``,
    ``columns``, ``parts`` and ``stores`` (counts)."""
    archive, dst = os.fspath(archive), os.path.abspath(os.fspath(dst))
    old = claim_new(dst, overwrite, "unpack")
    try:
        with staging.private_dir(dst, "unpacking") as tmp:
            contents, written = _extract(archive, tmp)
            for folder in sorted(contents.made, key=len, reverse=True):
                staging.fsync_dir(os.path.join(tmp, *folder.split("/")) if folder else tmp)
            if contents.kind == "dataset":
                result = _check_dataset(archive, tmp, contents)
            else:
                records, report = verified(tmp, f"the store unpacked from {archive}:")
                result = {"kind": "store", "records": records, "verify": report}
            put_in_place(tmp, dst, old)
    finally:
        release_stores(old)
    return {**result, "bytes_written": written}


def _check_dataset(archive: str, root: str, contents: _Contents) -> dict[str, Any]:
    """Checks the dataset directory unpacked into ``root``: its manifests (every part's too),
    exactly the stores and parts they name and no other, every record of every store, and
    that it opens as a dataset. Every fault is a CorruptStoreError naming the archive."""
    top = contents.top or ""
    try:
        manifest, raw = manifest_and_bytes(root)
        # Bounded by what the archive held before a store per column and part is listed (a
        # small manifest can name millions); a few missing are named precisely below.
        named_count = len(manifest.columns) * max(1, len(manifest.parts))
        if named_count > 2 * len(contents.stores) + 64:
            raise CorruptStoreError(f"its manifest names {named_count:,} stores, the archive "
                                    f"holds {len(contents.stores):,}")
        stores = column_stores(root, manifest)
        parts = [(p.path, manifest_and_bytes(os.path.join(root, *p.path.split("/")))[1])
                 for p in manifest.parts]
    except (CorruptStoreError, DatasetError, OSError) as e:
        raise CorruptStoreError(f"{archive}: the dataset directory it holds is not whole or "
                                f"not valid: {str(e).replace(root, top)}") from None
    named = {s.path for s in stores}
    for what, found, wanted in (("manifest", contents.manifests, {""} | {p for p, _ in parts}),
                                ("store", contents.stores, named)):
        strays = sorted(found - wanted)
        if strays:
            raise CorruptStoreError(f"{archive}: it holds a {what} in {top}/{strays[0]}, "
                                    "which the manifests of its dataset directory do not name")
    lost = sorted(named - contents.stores)  # (every manifest named is there: it was read)
    if lost:
        raise CorruptStoreError(f"{archive}: it lacks {top}/{lost[0]}, the store of a column "
                                "its manifest names: cut short or damaged")
    try:
        reports = verified_stores(root, stores, top)
        check_dataset(root, top)
    except CorruptStoreError as e:
        raise CorruptStoreError(f"{archive}: {e}") from None
    return dataset_report(DatasetFiles(manifest, raw, parts, stores), reports)


def _folder_kind(path: list[str]) -> str | None:
    """What the folder at ``path`` (below the top folder) is in an archive of a dataset
    directory: ``"dataset"`` (the top, or a part: a manifest.json and stores), ``"parts"``
    (the folder of the parts), ``"store"`` (a store's files), or None (no such folder)."""
    if not path:
        return "dataset"
    if path == [PARTS_DIR]:
        return "parts"
    if len(path) == 1:
        return "store" if _is_store_folder(path[0]) else None
    if path[0] != PARTS_DIR or not is_part_path("/".join(path[:2])) or len(path) > 3:
        return None
    if len(path) == 2:
        return "dataset"
    return "store" if _is_store_folder(path[2]) else None


def _is_store_folder(name: str) -> bool:
    """A column's store or a column group's (the manifest, checked at the end, says which)."""
    return is_store_dir_name(name) or is_group_store_name(name)


def _file_limit(folder_kind: str | None, name: str) -> tuple[int, bool] | None:
    """``(limit, exact)`` of a file ``name`` in a folder of that kind, or None when no such
    file may be there."""
    if folder_kind == "store":
        return _size_limit(name)
    if folder_kind == "dataset" and name == MANIFEST_FILE:
        return MAX_MANIFEST_BYTES, False
    return None


@dataclass
class _SeenFolder:
    """A folder of the archive as unpack has seen it so far."""

    listed: bool = False  # its own header came
    started: bool = False  # a member inside it came
    table: dict[str, int] | None = None  # pack's manifest of it: name -> size
    files: dict[str, int | None] = field(default_factory=dict)  # name -> its header's CRC-32


class _Contents:
    """What unpack accepts, member by member, and what it has seen.

    The kind of archive -- one store, or a dataset directory -- is told by the top folder's
    manifest when pack wrote one, else by the first file: ``<top>/<store file>`` is a store,
    ``<top>/manifest.json`` or a path of the dataset layout below the top folder is a dataset
    directory. Folders before the first file are judged once the kind is known."""

    def __init__(self, archive: str) -> None:
        self.archive = archive
        self.top: str | None = None
        self.kind: str | None = None  # "store" or "dataset", once known
        self.folders: dict[str, _SeenFolder] = {}  # by path below the top folder ("": the top)
        self.waiting: list[Member] = []  # folder members that came before the kind was known
        self.made: set[str] = {""}  # folders created below the staging directory
        self.stores: set[str] = set()  # paths of the store folders that have files
        self.manifests: set[str] = set()  # paths of the folders that have a manifest.json
        self.listed = 0  # files the folders' tables list, in all (kept until the end)

    @property
    def limits(self) -> Limits:
        """The bounds the rest of the archive is read within: those of one store until it is
        known to be a dataset directory's."""
        return _DATASET_LIMITS if self.kind == "dataset" else _LIMITS

    def _refuse(self, why: str) -> CorruptStoreError:
        return CorruptStoreError(f"{self.archive}: {why}")

    def _not_ours(self, member: Member) -> CorruptStoreError:
        if self.kind == "dataset":
            return self._refuse(
                f"member {member.name!r} is not a store file or manifest of the dataset "
                "directory in the archive's one top folder (an archive of a dataset directory "
                "holds only manifest.json, <store>/<file>, parts/NNNNN/manifest.json and "
                "parts/NNNNN/<store>/<file>: regular files, a store's named like meta.zr, 0.zr "
                f"(chunks 0 to {MAX_CHUNKS - 1}), dict.zr, schema.msgpack)")
        return self._refuse(
            f"member {member.name!r} is not a store file in the archive's one top folder "
            "(an archive of one store holds only regular files named like meta.zr, 0.zr "
            f"(chunks 0 to {MAX_CHUNKS - 1}), dict.zr, schema.msgpack)")

    def _folder_kind(self, path: list[str]) -> str | None:
        if self.kind == "dataset":
            return _folder_kind(path)
        return "store" if not path else None

    def admit(self, member: Member) -> None:
        """Raises unless ``member`` is something an archive of a store or a dataset directory
        may hold, before any of its body is read."""
        if member.kind == "global":
            if any(k in ("path", "size", "linkpath") or k.startswith("GNU.sparse.")
                   for k in member.pax):
                raise self._refuse("a pax global header that changes names or sizes")
            return
        parts = member.name.rstrip("/").split("/")
        if self.top is None:
            self.top = parts[0]
        if parts[0] != self.top or self.top in ("", ".", ".."):
            raise self._not_ours(member)
        path = parts[1:]
        if member.kind == "dir":
            for depth in range(len(path)):  # the folders above it have begun
                self.folders.setdefault("/".join(path[:depth]), _SeenFolder()).started = True
            if self.kind is None and path:
                self.waiting.append(member)  # judged when the kind is known
                return
            self._admit_folder(member, path)
            return
        if member.kind != "file" or not path:
            raise self._not_ours(member)
        if self.kind is None:
            self._decide(_file_limit(_folder_kind(path[:-1]), path[-1]) is not None
                         and (len(path) > 1 or path[0] == MANIFEST_FILE))
        self._admit_file(member, path)

    def _decide(self, dataset: bool) -> None:
        """The kind is known: the folders that waited for it are judged."""
        self.kind = "dataset" if dataset else "store"
        waiting, self.waiting = self.waiting, []
        for member in waiting:
            self._admit_folder(member, member.name.rstrip("/").split("/")[1:])

    def _admit_folder(self, member: Member, path: list[str]) -> None:
        kind = self._folder_kind(path)
        if kind is None:
            raise self._not_ours(member)
        seen = self.folders.setdefault("/".join(path), _SeenFolder())
        if seen.listed or seen.started or member.stored:
            raise self._refuse(f"the folder {member.name!r} is listed twice, late, or with "
                               "contents")
        seen.listed = True
        table = self._pack_comment(member, _MANIFEST_KEY)
        if table is None:
            return
        if self.kind is None:  # the top folder of pack's archive says what it holds
            self._decide(MANIFEST_FILE in table and _schema.META_FILE not in table)
            kind = self._folder_kind(path)
        where = f" of {member.name!r}" if path else ""
        wanted = {"store": _schema.META_FILE, "dataset": MANIFEST_FILE}.get(kind or "")
        if wanted is not None and wanted not in table:
            raise self._refuse(f"its manifest{where} lists no {wanted}")
        strays = sorted(name for name in table if _file_limit(kind, name) is None)
        if strays:
            raise self._refuse(f"its manifest{where} lists {strays[0]}, which cannot be in "
                               "that folder: damaged")
        # Every table is kept until the end: together they may list no more files than an
        # archive may hold headers (a few small folders cannot claim gigabytes of tables).
        self.listed += len(table)
        if self.listed > _MAX_LISTED:
            raise self._refuse(f"its folders list more than {_MAX_LISTED:,} files, more than "
                               "an archive may hold")
        seen.table = table

    def _admit_file(self, member: Member, path: list[str]) -> None:
        folder, name = "/".join(path[:-1]), path[-1]
        kind = self._folder_kind(path[:-1])
        limit = _file_limit(kind, name)
        if limit is None:
            raise self._not_ours(member)
        for depth in range(len(path)):  # every folder above it has begun
            self.folders.setdefault("/".join(path[:depth]), _SeenFolder()).started = True
        seen = self.folders[folder]
        shown = f"{folder}/{name}" if folder else name
        if name in seen.files:
            raise self._refuse(f"{member.name!r} is in it twice")
        size, exact = limit
        if member.size > size or (exact and member.size != size):
            raise self._refuse(f"{shown} is {member.size} bytes; a"
                               f"{' store' if kind == 'store' else ' dataset directory'}'s "
                               f"{name} is {'exactly' if exact else 'at most'} {size} bytes")
        crc = self._pack_comment(member, _CRC_KEY)
        if seen.table is None and crc is not None:
            lost = "its first header" if not folder else f"the header of its folder {folder!r}"
            raise self._refuse("it has the checksums pack writes but not their manifest "
                               f"({lost} is lost or damaged)")
        if seen.table is not None:
            if name not in seen.table:
                raise self._refuse(f"{shown} is not in the archive's manifest")
            if member.size != seen.table[name]:
                raise self._refuse(f"{shown} is {member.size} bytes, its manifest says "
                                   f"{seen.table[name]}")
            if crc is None:
                raise self._refuse(f"{shown} has lost the checksum pack gives every file")
        seen.files[name] = crc
        if kind == "store":
            self.stores.add(folder)
        else:
            self.manifests.add(folder)
        for depth in range(1, len(path)):
            self.made.add("/".join(path[:depth]))

    def _pack_comment(self, member: Member, key: str) -> Any:
        """What pack wrote under ``key`` in the member's pax comment (a folder's table of
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
                or len(table) > MAX_CHUNKS + len(_NAMED)
                or not all(isinstance(k, str) and (_size_limit(k) is not None
                                                    or k == MANIFEST_FILE)
                           and type(v) is int and v >= 0 for k, v in table.items())):
            raise self._refuse("its manifest is damaged or of another version")
        return table

    def body_read(self, path: list[str], crc: int) -> None:
        """The body of the file at ``path`` (below the top folder) was read whole; its CRC-32
        was ``crc``."""
        if self.folders["/".join(path[:-1])].files[path[-1]] not in (None, crc):
            shown = "/".join(path)
            raise self._refuse(f"{shown} does not match its checksum: damaged")

    def complete(self) -> None:
        """Raises unless everything a store needs (and everything a folder's manifest lists)
        was there."""
        if self.kind is None:
            self._decide(False)  # no file at all: judged as a store's archive
        for path, seen in self.folders.items():
            if seen.table is not None:
                missing = sorted(set(seen.table) - set(seen.files))
                if missing:
                    shown = ", ".join(f"{path}/{m}" if path else m for m in missing)
                    raise self._refuse(f"it lacks {shown}, which its manifest lists: cut "
                                       "short or damaged")
        top = self.folders.get("", _SeenFolder())
        for path in sorted(self.stores):
            if path and _schema.META_FILE not in self.folders[path].files:
                raise self._refuse(f"{path}/ holds no {_schema.META_FILE}: not a whole store")
        if self.kind == "store" and _schema.META_FILE not in top.files:
            raise self._refuse(f"it holds no {_schema.META_FILE}: not a store archive")
        if self.kind == "dataset" and MANIFEST_FILE not in top.files:
            raise self._refuse(f"it holds no {MANIFEST_FILE} in its top folder: not the "
                               "archive of a dataset directory")


def _extract(archive: str, into: str) -> tuple[_Contents, int]:
    """Writes the archive's files into the empty directory ``into`` (a private staging
    directory: nobody else can put anything in it); returns what it held and the data bytes
    written. A manifest is checked as soon as it is written."""
    contents = _Contents(archive)
    written = 0
    with ArchiveStream(archive) as stream:
        reader = TarReader(stream, archive, _LIMITS)
        for member in reader.members(contents.admit):
            reader.limits = contents.limits
            if member.kind != "file":
                continue
            path = member.name.rstrip("/").split("/")[1:]
            folder = os.path.join(into, *path[:-1])
            os.makedirs(folder, exist_ok=True)  # names checked by admit: no '..', no links
            if path[-1] == _NOT_CARRIED:
                reader.skip()
            else:
                written += _write_member(reader, member, os.path.join(folder, path[-1]))
            contents.body_read(path, reader.body_crc())
            if path[-1] == MANIFEST_FILE:
                _check_manifest(archive, folder, into, contents.top or "")
    contents.complete()
    return contents, written


def _check_manifest(archive: str, folder: str, into: str, top: str) -> None:
    """A manifest just unpacked into ``folder`` (inside the staging directory ``into``, which
    errors call ``top``) is refused at once when it is not valid (a path outside its
    directory, a bad field: see ``read_manifest``)."""
    try:
        read_manifest(folder)
    except (CorruptStoreError, DatasetError) as e:
        raise CorruptStoreError(f"{archive}: {str(e).replace(into, top)}") from None


def _write_member(reader: TarReader, member: Member, path: str) -> int:
    def read_at(at: int, n: int) -> bytes:
        return reader.read(n)  # the regions come in order, their bytes back to back

    return write_sparse(path, member.size, member.data_regions(), read_at, block=_BLOCK,
                        zeros_as_holes=True)
