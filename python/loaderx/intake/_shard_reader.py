"""The samples of one WebDataset tar shard, read strictly and bounded.

A shard is a tar file from elsewhere, so it is read with loaderx's own strict tar reader
(:mod:`loaderx._archives.tar_reader` over :mod:`loaderx._archives.stream`, written for ``loaderx
unpack``): every header's checksum, the end-of-archive blocks, a cut or lying archive, and a
compressed shard's own check (gzip's CRC-32 and length, xz's check, bzip2's CRC, read to the
end of the file) are all verified, pax headers and long names are bounded, and each member's
name, kind and size are judged before a byte of its body is read.

WebDataset's rules, as its ``tariterators`` applies them: a member's *key* is its name up to
the first dot of its last path component (directories included: ``train/0001.jpg`` has key
``train/0001``), its *extension* the rest (``seg.png``), lower-cased; consecutive members with
one key make one sample, and a shard's end ends a sample. Members without a dot after a
non-dot character (``README``, ``.hidden``) and WebDataset's metadata members (names starting
``__...__``) are skipped and counted; directories are skipped. Refused (a
:class:`~loaderx.errors.CorruptStoreError` naming the shard and member): absolute names and
``..`` components (names that would leave a folder on export), links, devices and anything
else that is not a regular file, sparse members. Refused as a
:class:`~loaderx.errors.LimitExceededError`: a member over the 1 MiB record limit. Refused as a
:class:`~loaderx.errors.DatasetError`: one extension twice in a sample (as WebDataset does).
"""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from loaderx._archives.stream import ArchiveStream
from loaderx._archives.tar_reader import Limits, Member, TarReader
from loaderx.errors import CorruptStoreError, DatasetError, LimitExceededError
from loaderx.zrecord import MAX_RECORD_BYTES

__all__ = ["SHARD_LIMITS", "Sample", "ShardReport", "read_shard", "split_name"]

#: What one shard may hold. Names and pax headers are metadata: 64 KiB each is far past any
#: real name (PATH_MAX is 4 KiB); the member count is past a store's 2**24 records, four
#: members each.
SHARD_LIMITS = Limits(headers=1 << 26, extension_bytes=64 << 10, extension_total=1 << 40,
                      regions=1, trailing_zeros=16 << 20)
#: Most members (extensions) one sample may have.
MAX_EXTENSIONS = 1024

# WebDataset's tariterators.base_plus_ext and its skip_meta default.
_BASE_PLUS_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$", re.DOTALL)
_META = re.compile(r"__[^/]*__($|/)")
_ZSTD = b"\x28\xb5\x2f\xfd"


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name by WebDataset's rule (the extension as written,
    not lower-cased), or None where it has none."""
    m = _BASE_PLUS_EXT.match(name)
    return (m.group(1), m.group(2)) if m else None


@dataclass
class Sample:
    """One sample: its key, each extension's bytes (lower-cased extension -> bytes), and the
    extensions whose spelling in the shard was not lower-case (lower -> as written)."""

    key: str
    members: dict[str, bytes] = field(default_factory=dict)
    spelled: dict[str, str] = field(default_factory=dict)


@dataclass
class ShardReport:
    """What a shard held besides its samples."""

    samples: int = 0
    members: int = 0
    bytes: int = 0
    skipped_meta: list[str] = field(default_factory=list)  # names, the first few
    skipped_meta_count: int = 0
    skipped_no_extension: list[str] = field(default_factory=list)
    skipped_no_extension_count: int = 0
    directories: int = 0

    def skip(self, kind: str, name: str) -> None:
        count = f"skipped_{kind}_count"
        setattr(self, count, getattr(self, count) + 1)
        names = getattr(self, f"skipped_{kind}")
        if len(names) < 5:
            names.append(name)


class _ShardReader(TarReader):
    """The strict tar reader, with messages that speak of a shard."""

    def _corrupt(self, why: str) -> CorruptStoreError:
        return CorruptStoreError(f"{self.archive}: {why} (at byte {self.at} of the tar); the "
                                 "shard is damaged, cut short or not a tar file -- take it "
                                 "again from its source")


def _check_member(shard: str, member: Member) -> None:
    """Refuses, before its body is read, a member a WebDataset shard must not hold."""
    if member.kind == "global":
        if any(k in ("path", "size", "linkpath") or k.startswith("GNU.sparse.")
               for k in member.pax):
            raise CorruptStoreError(f"{shard}: a pax global header that changes names or "
                                    "sizes; a WebDataset shard has none")
        return
    name = member.name
    if member.kind == "other":
        what = {b"1": "a hard link", b"2": "a symbolic link", b"3": "a character device",
                b"4": "a block device", b"6": "a FIFO"}.get(member.typeflag, "not a regular "
                                                              "file")
        raise CorruptStoreError(f"{shard}: member {name!r} is {what}; a WebDataset shard holds "
                                "regular files only (recreate the shard with the files the "
                                "links point to)")
    parts = name.split("/")
    if name.startswith("/") or ".." in parts:
        raise CorruptStoreError(f"{shard}: member {name!r} has an absolute name or a '..' "
                                "component, which would point outside any folder it is "
                                "extracted to; the shard cannot be trusted")
    if member.kind == "file" and member.layout != "plain":
        raise CorruptStoreError(f"{shard}: member {name!r} is a sparse file; a WebDataset "
                                "shard holds plain files")
    if member.kind == "file" and member.size > MAX_RECORD_BYTES:
        raise LimitExceededError(
            f"{shard}: member {name!r} is {member.size} bytes, over the {MAX_RECORD_BYTES}-byte "
            "record limit of one value; shrink it (re-encode the image or audio), or split the "
            "value into several members before converting")


def _refuse_zstd(path: str) -> None:
    """A zstd shard gets its own message (ArchiveStream's speaks of unpack)."""
    # Non-blocking: a FIFO at the path must not hang (ArchiveStream refuses it next).
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        head = os.read(fd, 4) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)
    if head == _ZSTD:
        raise DatasetError(f"{path} is zstd-compressed, which is not read here; decompress it "
                           "first (zstd -d), or use .tar, .tar.gz, .tar.xz or .tar.bz2")


def read_shard(path: str, batch_bytes: int, report: ShardReport) -> Iterator[list[Sample]]:
    """The samples of the shard at ``path`` in order, in lists of about ``batch_bytes``.

    Ends once the shard was read to its end and every check passed; a failure raises where
    it is found (the samples before it may have been handed out already)."""
    _refuse_zstd(path)
    with ArchiveStream(path) as stream:
        reader = _ShardReader(stream, path, SHARD_LIMITS)
        batch: list[Sample] = []
        held = 0
        current: Sample | None = None
        for member in reader.members(functools.partial(_check_member, path)):
            if member.kind == "dir":
                report.directories += 1
                continue
            if member.kind != "file":  # a pax global header
                continue
            name = member.name
            if _META.match(name):
                report.skip("meta", name)
                continue
            parts = split_name(name)
            if parts is None:
                report.skip("no_extension", name)
                continue
            key, written = parts
            ext = written.lower()
            if current is None or key != current.key:
                if current is not None:
                    batch.append(current)
                    if held >= batch_bytes:
                        yield batch
                        batch, held = [], 0
                current = Sample(key)
                report.samples += 1
            if ext in current.members:
                raise DatasetError(f"{path}: sample {key!r} has the extension {ext!r} twice "
                                   f"(member {name!r}); a sample holds each extension once")
            if len(current.members) >= MAX_EXTENSIONS:
                raise DatasetError(f"{path}: sample {key!r} has over {MAX_EXTENSIONS} members")
            data = reader.read(member.size)
            current.members[ext] = data
            if written != ext:
                current.spelled[ext] = written
            held += len(data)
            report.members += 1
            report.bytes += len(data)
        if current is not None:
            batch.append(current)
        if batch:
            yield batch
