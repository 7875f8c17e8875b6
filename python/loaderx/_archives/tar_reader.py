"""A strict, bounded reader of tar archives, for archives that come from elsewhere.

Python's ``tarfile`` is made to extract what it can: a damaged header or a cut archive reads
as the end of the archive, a pax header or GNU long name is read whole into memory at
whatever size it claims, and a sparse map is turned into Python objects before anyone can look
at the member's name. Unpacking a store needs the opposite, so this reader parses the format
itself (it is a simple one: 512-byte headers, each followed by its body) and trusts nothing
before it is bounded:

* every header's checksum is verified; a block that is neither a valid header nor the
  end-of-archive blocks is damage, and so is a stream that ends anywhere but after them;
* pax headers and GNU long names are limited in size (each, and all together), the number of
  headers is limited, and numbers are checked to be plain octal, base-256 or decimal;
* a sparse member's map (GNU's formats 0.0, 0.1, 1.0 and the old GNU header) is read into a
  compact array, limited in entries, and must describe ordered, non-overlapping regions inside
  the file whose lengths add up to exactly the bytes stored;
* each member's name, kind and sizes go to the caller's ``admit`` before a byte of its body is
  read, so the caller refuses what it does not want before it costs anything.

Bodies are read through :meth:`TarReader.read` (the data regions' bytes, in order); a CRC-32
of each body as stored (a sparse map included) is kept for the archive's own manifest. Every
failure of the data is a :class:`~loaderx.errors.CorruptStoreError` naming the archive.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from loaderx._archives.stream import ArchiveStream
from loaderx.errors import CorruptStoreError

__all__ = ["BLOCK", "Limits", "Member", "TarReader"]

BLOCK = 512
_FILE_TYPES = (b"0", b"\x00", b"S")  # regular files (S: old GNU sparse)
_DECIMAL_DIGITS = 20  # enough for any 64-bit size
_HIGH_BYTES = bytes(range(128, 256))
_LARGEST = (1 << 63) - 1  # any number past this is damage (and would not fit the map's array)


@dataclass(frozen=True)
class Limits:
    """How much of each thing an archive may hold before it is refused."""

    headers: int  # headers of every kind, extension headers included
    extension_bytes: int  # one pax header's or GNU long name's body
    extension_total: int  # all of them together
    regions: int  # entries of one sparse map
    trailing_zeros: int  # bytes of zeros after the end-of-archive blocks


@dataclass
class Member:
    """A member's header: ``kind`` is ``"file"``, ``"dir"``, ``"global"`` (a pax global
    header, its records in ``pax``) or ``"other"`` (links, devices, anything else)."""

    name: str
    kind: str
    size: int  # the file's size (a sparse file's apparent size)
    stored: int  # the body's bytes in the archive
    typeflag: bytes
    pax: dict[str, str] = field(default_factory=dict)
    layout: str = "plain"  # or where a sparse map is: "headers", "body" (1.0), "gnu" (old)
    regions: array = field(default_factory=lambda: array("q"))  # offset, length, offset, ...

    def data_regions(self) -> Iterator[tuple[int, int]]:
        """``(offset, length)`` of each data region, in order; the rest of the file is holes."""
        r = self.regions
        for i in range(0, len(r), 2):
            yield r[i], r[i + 1]

    @property
    def data_bytes(self) -> int:
        return sum(self.regions[1::2])


class TarReader:
    """Reads the tar in ``stream`` (named ``archive`` in errors) member by member."""

    def __init__(self, stream: ArchiveStream, archive: str, limits: Limits) -> None:
        self.stream, self.archive, self.limits = stream, archive, limits
        self.headers = 0
        self.extension_total = 0
        self.at = 0  # offset in the decompressed tar of the next byte to read
        self.left = 0  # data bytes of the current member not yet read
        self.pad = 0  # bytes of the current member's body after its data, then padding
        self.crc = 0  # CRC-32 of the current member's body so far

    def _corrupt(self, why: str) -> CorruptStoreError:
        return CorruptStoreError(f"{self.archive}: {why} (at byte {self.at} of the tar); it is "
                                 "damaged, cut short or not a tar archive of a store")

    def _take(self, n: int, what: str) -> bytes:
        data = self.stream.read(n)
        self.at += len(data)
        if len(data) != n:
            raise self._corrupt(f"cut short inside {what}")
        return data

    def _body(self, n: int, what: str) -> bytes:
        data = self._take(n, what)
        self.crc = zlib.crc32(data, self.crc)
        return data

    # -- members -----------------------------------------------------------------------------

    def members(self, admit: Callable[[Member], None]) -> Iterator[Member]:
        """Each member in turn, after ``admit(member)`` accepted it (by returning) and its
        sparse map was read. Read its data with :meth:`read` (or leave it: the rest is skipped
        when the next member is asked for). Ends after the end-of-archive blocks, with the
        whole stream read and checked (:meth:`ArchiveStream.finish`)."""
        pax: dict[str, str] = {}
        sparse_pairs: list[int] = []  # GNU sparse 0.0: offset/numbytes records in order
        long_name: str | None = None
        while True:
            self._skip_rest()
            header = self._first() if self.at == 0 else self._take(BLOCK, "a header")
            if header.count(0) == BLOCK:
                if pax or long_name is not None:
                    raise self._corrupt("an extension header with no member after it")
                if self.stream.read(BLOCK).count(0) != BLOCK:
                    raise self._corrupt("a zero block that is not the end of the archive")
                self.stream.finish(self.limits.trailing_zeros)
                return
            self.headers += 1
            if self.headers > self.limits.headers:
                raise self._corrupt(f"over {self.limits.headers} headers")
            self._check_sum(header)
            typeflag = header[156:157]
            size = self._octal(header[124:136], "size")
            if typeflag in (b"x", b"g", b"L", b"K"):
                body = self._extension(size, typeflag)
                if typeflag == b"x":
                    records = self._pax_records(body, sparse_pairs)
                    pax.update(records)
                elif typeflag == b"g":
                    records = self._pax_records(body, None)
                    yield self._admitted(admit, Member("", "global", 0, 0, typeflag, records))
                elif typeflag == b"L":
                    long_name = self._text(body.split(b"\x00", 1)[0], "a long name")
                continue
            member = self._member(header, typeflag, size, pax, sparse_pairs, long_name)
            pax, sparse_pairs, long_name = {}, [], None
            self.crc, self.left, self.pad = 0, 0, _padded(member.stored)
            admit(member)
            self._read_map(member, header)
            yield member

    def _first(self) -> bytes:
        header = self.stream.read(BLOCK)
        self.at += len(header)
        if len(header) != BLOCK:
            raise CorruptStoreError(f"{self.archive} is not a tar archive (it is "
                                    f"{'empty' if not header else 'shorter than one block'})")
        return header

    def _admitted(self, admit: Callable[[Member], None], member: Member) -> Member:
        admit(member)
        return member

    def read(self, n: int) -> bytes:
        """The next ``n`` (or fewer, where the data ends) bytes of the current member's data
        regions, back to back."""
        n = min(n, self.left)
        data = self._body(n, "a member's data")
        self.left -= n
        self.pad -= n
        return data

    def skip(self) -> None:
        """Reads the rest of the current member's data without keeping it."""
        while self.left:
            self.read(min(self.left, 1 << 20))

    def body_crc(self) -> int:
        """The CRC-32 of the current member's body as stored, once its data is read."""
        if self.left:
            raise AssertionError("the member's data was not all read")
        return self.crc

    def _skip_rest(self) -> None:
        self.skip()
        while self.pad:  # the padding to the next block
            n = min(self.pad, 1 << 20)
            self._take(n, "a member's padding")
            self.pad -= n

    # -- header fields -----------------------------------------------------------------------

    def _check_sum(self, header: bytes) -> None:
        try:
            stored = self._octal(header[148:156], "checksum")
        except CorruptStoreError:
            stored = -1
        blanked = header[:148] + b" " * 8 + header[156:]
        unsigned = sum(blanked)
        # The signed sum (old tars) only when the usual one fails: counting high bytes in
        # Python is most of a header's cost, and WebDataset shards have a header per file.
        if stored != unsigned and stored != unsigned - 256 * (
                len(blanked) - len(blanked.translate(None, _HIGH_BYTES))):
            if self.at == BLOCK:
                raise CorruptStoreError(f"{self.archive} is not a tar archive (its first block "
                                        "is not a tar header), or its first header is damaged")
            raise self._corrupt("a header whose checksum does not match (a damaged header)")

    def _octal(self, field: bytes, what: str) -> int:
        """A header number: octal digits (NUL- or space-ended), or GNU's base-256."""
        if field[:1] == b"\x80":  # base-256, positive
            n = int.from_bytes(field[1:], "big")
        elif field[:1] and field[0] & 0x80:
            raise self._corrupt(f"a negative or malformed {what} field")
        else:
            text = field.split(b"\x00", 1)[0].strip(b" ")
            if text.strip(b"01234567"):  # a byte that is not an octal digit
                raise self._corrupt(f"a {what} field that is not an octal number")
            n = int(text, 8) if text else 0
        if n > _LARGEST:
            raise self._corrupt(f"a {what} field past any file's size")
        return n

    def _decimal(self, text: str, what: str) -> int:
        if not (0 < len(text) <= _DECIMAL_DIGITS and text.isascii() and text.isdigit()):
            raise self._corrupt(f"{what} {text[:40]!r} is not a decimal number")
        if int(text) > _LARGEST:
            raise self._corrupt(f"{what} {text!r} is past any file's size")
        return int(text)

    def _text(self, raw: bytes, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self._corrupt(f"{what} that is not UTF-8") from None

    def _extension(self, size: int, typeflag: bytes) -> bytes:
        if size > self.limits.extension_bytes:
            raise self._corrupt(f"an extension header ({typeflag.decode()}) of {size} bytes, "
                                f"over the {self.limits.extension_bytes}-byte limit")
        self.extension_total += size
        if self.extension_total > self.limits.extension_total:
            raise self._corrupt(f"extension headers of over {self.limits.extension_total} "
                                "bytes in all")
        body = self._take(size, "an extension header")
        self._take(_padded(size) - size, "an extension header's padding")
        return body

    def _pax_records(self, body: bytes, sparse_pairs: list[int] | None) -> dict[str, str]:
        """The ``LENGTH KEY=VALUE\\n`` records of a pax header (GNU sparse 0.0's repeated
        offset/numbytes records go to ``sparse_pairs`` in order)."""
        records: dict[str, str] = {}
        at = 0
        while at < len(body):
            if body[at] == 0 and body[at:].count(0) == len(body) - at:
                break  # NUL padding after the last record
            space = body.find(b" ", at, at + _DECIMAL_DIGITS + 1)
            if space < 0:
                raise self._corrupt("a pax record without its length")
            length = self._decimal(body[at:space].decode("ascii", "replace"), "a pax length")
            end = at + length
            if end > len(body) or end <= space + 1 or body[end - 1] != 0x0A:
                raise self._corrupt("a pax record whose length does not fit")
            key, eq, value = body[space + 1:end - 1].partition(b"=")
            if not eq or not key:
                raise self._corrupt("a pax record that is not KEY=VALUE")
            k, v = self._text(key, "a pax key"), self._text(value, "a pax value")
            if k in ("GNU.sparse.offset", "GNU.sparse.numbytes") and sparse_pairs is not None:
                want = "GNU.sparse.offset" if len(sparse_pairs) % 2 == 0 else "GNU.sparse.numbytes"
                if k != want:
                    raise self._corrupt("GNU sparse 0.0 records out of order")
                if len(sparse_pairs) >= 2 * self.limits.regions:
                    raise self._corrupt(f"a sparse map of over {self.limits.regions} regions")
                sparse_pairs.append(self._decimal(v, k))
            else:
                records[k] = v
            at = end
        return records

    def _member(self, header: bytes, typeflag: bytes, size: int, pax: dict[str, str],
                sparse_pairs: list[int], long_name: str | None) -> Member:
        name = self._text(header[0:100].split(b"\x00", 1)[0], "a name")
        if header[257:263] == b"ustar\x00":  # POSIX ustar: a prefix completes long names
            prefix = self._text(header[345:500].split(b"\x00", 1)[0], "a name prefix")
            name = f"{prefix}/{name}" if prefix else name
        name = pax.get("GNU.sparse.name") or pax.get("path") or long_name or name
        if "size" in pax:
            size = self._decimal(pax["size"], "the pax size")
        if typeflag in _FILE_TYPES and not name.endswith("/"):
            kind = "file"
        elif typeflag == b"5" or (typeflag == b"\x00" and name.endswith("/")):
            kind = "dir"
        else:
            kind = "other"
        member = Member(name, kind, size, size, typeflag, pax)
        if kind == "file":
            self._sparse_layout(member, header, sparse_pairs)
        elif sparse_pairs:
            raise self._corrupt("a sparse map on a member that is not a file")
        return member

    def _sparse_layout(self, member: Member, header: bytes, sparse_pairs: list[int]) -> None:
        """Sets the member's apparent size, and its map where the map is in the headers."""
        pax = member.pax
        if pax.get("GNU.sparse.major") == "1" and pax.get("GNU.sparse.minor") == "0":
            member.size = self._decimal(pax.get("GNU.sparse.realsize", ""), "the sparse size")
            member.layout = "body"  # the map is at the start of the body: read later
        elif "GNU.sparse.map" in pax or sparse_pairs:
            member.size = self._decimal(pax.get("GNU.sparse.size", ""), "the sparse size")
            if "GNU.sparse.map" in pax:
                text = pax["GNU.sparse.map"]
                if text.count(",") >= 2 * self.limits.regions:
                    raise self._corrupt(f"a sparse map of over {self.limits.regions} regions")
                sparse_pairs = [self._decimal(n, "a sparse map entry")
                                for n in text.split(",")] if text else []
            if len(sparse_pairs) % 2:
                raise self._corrupt("a sparse map with an odd count of numbers")
            member.regions = array("q", sparse_pairs)
            member.layout = "headers"
        elif member.typeflag == b"S":
            member.size = self._octal(header[483:495], "sparse size")
            member.layout = "gnu"  # the map is in this header and extension blocks: later
        elif any(k.startswith("GNU.sparse.") for k in pax):
            raise self._corrupt(f"{member.name!r} is in a sparse format this reader does not "
                                "know")
        else:
            member.regions = array("q", [0, member.size])

    def _read_map(self, member: Member, header: bytes) -> None:
        """Reads a sparse map that lives in the body (1.0) or in extension blocks (old GNU),
        then checks the map against the file and the body."""
        if member.kind != "file":
            return
        map_bytes = 0
        if member.layout == "body":
            map_bytes = self._read_map_10(member)
        elif member.layout == "gnu":
            self._read_map_gnu(member, header)
        end = 0
        for offset, length in member.data_regions():
            if offset < end or length < 0 or offset + length > member.size:
                raise self._corrupt(f"{member.name!r} has a sparse map with regions out of "
                                    "order, overlapping, or past the end of the file")
            end = offset + length
        data = member.data_bytes
        if data + map_bytes != member.stored:
            raise self._corrupt(f"{member.name!r}: its sparse map names {data} bytes of data "
                                f"but {member.stored - map_bytes} are stored")
        self.left = data

    def _read_map_10(self, member: Member) -> int:
        """GNU sparse 1.0: decimal numbers one per line (count, then offset and length of
        each region) at the start of the body, padded to a block. Returns the map's bytes."""
        numbers: list[int] = []
        count: int | None = None
        line = b""
        used = 0
        while count is None or len(numbers) < 2 * count:
            if used + BLOCK > member.stored:
                raise self._corrupt(f"{member.name!r}: its sparse map runs past its body")
            block = self._body(BLOCK, "a sparse map")
            used += BLOCK
            pieces = (line + block).split(b"\n")
            line = pieces.pop()
            for piece in pieces:
                if count is not None and len(numbers) >= 2 * count:
                    break  # the rest of the block is padding
                n = self._decimal(piece.decode("ascii", "replace"), "a sparse map entry")
                if count is None:
                    if n > self.limits.regions:
                        raise self._corrupt(f"{member.name!r}: a sparse map of {n} regions, "
                                            f"over the limit of {self.limits.regions}")
                    count = n
                else:
                    numbers.append(n)
            if (count is None or len(numbers) < 2 * count) and len(line) > _DECIMAL_DIGITS:
                raise self._corrupt(f"{member.name!r}: a sparse map entry is not a number")
        member.regions = array("q", numbers)
        self.pad -= used
        return used

    def _read_map_gnu(self, member: Member, header: bytes) -> None:
        """The old GNU sparse header: four entries in the header, then extension blocks of 21
        entries while the 'is extended' byte says more follow."""
        numbers = array("q")
        block, entries, extended_at = header[386:482], 4, 482
        more = header[extended_at]
        while True:
            for i in range(entries):
                field = block[24 * i:24 * i + 24]
                if field[0] == 0:  # an unused entry: the map ends
                    more = 0
                    break
                numbers.append(self._octal(field[:12], "sparse offset"))
                numbers.append(self._octal(field[12:], "sparse length"))
                if len(numbers) > 2 * self.limits.regions:
                    raise self._corrupt(f"{member.name!r}: a sparse map of over "
                                        f"{self.limits.regions} regions")
            if not more:
                break
            # No count of its own: every full block adds 21 regions, which are limited.
            ext = self._take(BLOCK, "a sparse extension block")
            block, entries, more = ext[:504], 21, ext[504]
        member.regions = numbers


def _padded(n: int) -> int:
    return -(-n // BLOCK) * BLOCK
