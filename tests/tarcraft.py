"""Tar archives built block by block, for the hostile-archive tests and the archive fuzzer:
headers with any field (checksums right unless told otherwise), pax records, GNU long names
and sparse maps, end-of-archive blocks."""

from __future__ import annotations

BLOCK = 512
TABLE_BYTES = 16 + 16 * 2**24  # meta.zr and sums.zr


def pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def octal(n: int, width: int) -> bytes:
    return f"{n:0{width - 1}o}".encode() + b"\x00"


def checksum(block: bytes | bytearray) -> int:
    return sum(block[:148]) + 8 * 32 + sum(block[156:])


def header(name: str, size: int, typeflag: bytes = b"0", *, size_field: bytes | None = None,
           gnu: bool = False, fix_checksum: bool = True) -> bytes:
    """A ustar header (GNU's magic with ``gnu``); ``size_field`` replaces the 12-byte size."""
    h = bytearray(BLOCK)
    raw = name.encode()
    h[0:len(raw[:100])] = raw[:100]
    h[100:108] = octal(0o644, 8)
    h[108:116] = octal(0, 8)
    h[116:124] = octal(0, 8)
    h[124:136] = size_field if size_field is not None else octal(size, 12)
    h[136:148] = octal(1_700_000_000, 12)
    h[156:157] = typeflag
    h[257:265] = b"ustar  \x00" if gnu else b"ustar\x0000"
    if fix_checksum:
        set_checksum(h)
    return bytes(h)


def set_checksum(h: bytearray) -> None:
    h[148:156] = f"{checksum(h):06o}".encode() + b"\x00 "


def pax_body(records: list[tuple[str, str]]) -> bytes:
    body = b""
    for key, value in records:
        text = f" {key}={value}\n".encode()
        length = len(text) + 1
        while len(str(length)) + len(text) != length:
            length += 1
        body += str(length).encode() + text
    return body


def pax(records: list[tuple[str, str]], typeflag: bytes = b"x") -> bytes:
    body = pax_body(records)
    return header("././@PaxHeader", len(body), typeflag) + pad(body)


def member(name: str, body: bytes, typeflag: bytes = b"0") -> bytes:
    return header(name, len(body), typeflag) + pad(body)


def folder(name: str) -> bytes:
    return header(name.rstrip("/") + "/", 0, b"5")


def sparse_map(regions: list[tuple[int, int]]) -> bytes:
    return pad("".join(f"{n}\n" for n in [len(regions), *(x for r in regions for x in r)])
               .encode())


def sparse10(name: str, size: int, regions: list[tuple[int, int]], data: bytes,
             map_bytes: bytes | None = None, extra: list[tuple[str, str]] = ()) -> bytes:
    """A GNU sparse 1.0 member: its pax header, its header, the map, then the data."""
    body = (sparse_map(regions) if map_bytes is None else map_bytes) + data
    folder_name, base = name.rsplit("/", 1)
    return (pax([("GNU.sparse.major", "1"), ("GNU.sparse.minor", "0"),
                 ("GNU.sparse.name", name), ("GNU.sparse.realsize", str(size)), *extra])
            + header(f"{folder_name}/GNUSparseFile.0/{base}", len(body)) + pad(body))


def end() -> bytes:
    return bytes(2 * BLOCK)


def empty_meta() -> bytes:
    """The data of an empty store's meta.zr header (the rest of the file is a hole)."""
    return b"ZREC" + (3).to_bytes(2, "little") + bytes(10)


def meta_member(top: str = "ds") -> bytes:
    """A meta.zr of an empty store, as a sparse member."""
    return sparse10(f"{top}/meta.zr", TABLE_BYTES, [(0, 16), (TABLE_BYTES, 0)], empty_meta())
