"""unpack against archives from elsewhere: damaged, cut, hostile and bomb archives are refused
(CorruptStoreError, one line from the CLI), within bounded memory and disk, and nothing is
written through a planted link or left behind by a killed pack or unpack.

Every hostile archive is unpacked in its own subprocess under an address-space limit
(RLIMIT_AS), with the bytes it writes counted (every ``os.pwrite``)."""

from __future__ import annotations

import bz2
import functools
import gzip
import json
import lzma
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest

import tarcraft as tc
from loaderx import DenseDataset, RaggedDataset, Zrecord, from_iterator, from_numpy
from loaderx.archive import pack, unpack
from loaderx.errors import CorruptStoreError

MiB = 1 << 20
MEMORY_CAP = 1 << 30  # address space a hostile unpack may take (the interpreter's ~150 MiB too)
DISK_BUDGET = 1 * MiB  # bytes a refused archive may get written before it is refused
HANG = 300  # seconds: a child past this is hung
# Free-threaded CPython's allocator (mimalloc) reserves 1 GiB of address space as it starts
# (3.13t: VmData 1 GiB before any import); reserving in steps of 64 MiB keeps a cap on the
# child's address space a cap on what it uses. (Other interpreters ignore the variable.)
CHILD_ENV = {**os.environ, "MIMALLOC_ARENA_RESERVE": "64M"}

CHILD = textwrap.dedent("""
    import json, os, resource, sys
    archive, dst, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from loaderx.archive import unpack
    written = [0]
    real_pwrite = os.pwrite
    def counting_pwrite(fd, data, offset):
        written[0] += len(data)
        return real_pwrite(fd, data, offset)
    os.pwrite = counting_pwrite
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        r = unpack(archive, dst)
        out = {"outcome": "unpacked", "records": r["records"]}
    except BaseException as e:
        out = {"outcome": type(e).__name__, "message": str(e)}
    out["written"] = written[0]
    print(json.dumps(out))
""")


def unpack_in_child(archive: os.PathLike[str] | str, dst: os.PathLike[str] | str,
                    cap: int = MEMORY_CAP) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(archive), str(dst), str(cap)],
                          capture_output=True, text=True, timeout=HANG, env=CHILD_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_refused(tmp_path, blob: bytes, needle: str = "", suffix: str = ".tar") -> dict:
    """``blob`` as an archive is refused as corrupt, within the memory cap and the disk budget,
    and leaves nothing beside the target."""
    archive = tmp_path / f"hostile{suffix}"
    archive.write_bytes(blob)
    (tmp_path / "work").mkdir(exist_ok=True)
    out = unpack_in_child(archive, tmp_path / "work" / "dst")
    assert out["outcome"] == "CorruptStoreError", out
    assert needle in out["message"], out
    assert str(archive) in out["message"], "the error names the archive"
    assert out["written"] <= DISK_BUDGET, out
    assert os.listdir(tmp_path / "work") == []
    return out


@functools.cache
def bz2_zeros(mib: int) -> bytes:
    """``mib`` MiB of zeros, bzip2-compressed (whole streams of 16 MiB: a few hundred bytes)."""
    c = bz2.BZ2Compressor(9)
    one = b"".join(c.compress(bytes(MiB)) for _ in range(16)) + c.flush()
    return one * (mib // 16)


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def dataset(path, codec: str = "raw", checksums: bool = False) -> np.ndarray:
    data = (np.arange(200 * 16, dtype=np.int32) % 251).reshape(200, 16)
    from_numpy(path, data, codec=codec, checksums=checksums)
    return data


def member_spans(archive: os.PathLike[str]) -> list[tuple[int, int]]:
    """(start, end) in the tar of each member with its extension headers and padding, and
    where the end-of-archive blocks start."""
    with tarfile.open(archive) as tar:
        starts = [m.offset for m in tar.getmembers()]
        end = tar.offset
    return list(zip(starts, [*starts[1:], end], strict=True))


def crafted(store: os.PathLike[str]) -> bytes:
    """A tar of a small store, as another program might write it: a folder, then every file
    (the two tables as sparse members of their first page), no manifest, no checksums."""
    out = tc.folder("ds")
    for name in sorted(os.listdir(store)):
        with open(pathlib.Path(store) / name, "rb") as f:
            data = f.read(4096 if name in ("meta.zr", "sums.zr") else -1)
        if name in ("meta.zr", "sums.zr"):
            out += tc.sparse10(f"ds/{name}", tc.TABLE_BYTES, [(0, len(data))], data)
        else:
            out += tc.member(f"ds/{name}", data)
    return out + tc.end()


def headers_of(archive: os.PathLike[str]) -> list[int]:
    """The offset of every 512-byte header block (extension headers included)."""
    raw = pathlib.Path(archive).read_bytes()
    at, out = 0, []
    while at + 512 <= len(raw) and raw[at:at + 512].count(0) != 512:
        out.append(at)
        size = int(raw[at + 124:at + 136].split(b"\0")[0] or b"0", 8)
        at += 512 + -(-size // 512) * 512
    return out


# -- staging: no planted link is followed, nothing left behind --------------------------------


def test_pack_never_writes_through_a_link_at_its_temporary_name(tmp_path):
    dataset(tmp_path / "ds")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    archive = tmp_path / "ds.tar"
    os.symlink(victim, f"{archive}.packing-{os.getpid()}")  # the old, predictable name
    pack(tmp_path / "ds", archive)
    assert victim.read_text() == "precious"
    assert not os.path.islink(archive) and os.path.isfile(archive)
    unpack(archive, tmp_path / "back")
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["ds", "victim.txt", "ds.tar", f"ds.tar.packing-{os.getpid()}", "back"])


def test_unpack_ignores_what_is_planted_at_its_old_staging_name(tmp_path):
    data = dataset(tmp_path / "ds")
    pack(tmp_path / "ds", tmp_path / "ds.tar")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / f"back.unpacking-{os.getpid()}")
    (tmp_path / f"b2.unpacking-{os.getpid()}").mkdir()  # a pid collision: a leftover
    unpack(tmp_path / "ds.tar", tmp_path / "back")
    unpack(tmp_path / "ds.tar", tmp_path / "b2")
    assert os.listdir(elsewhere) == []
    np.testing.assert_array_equal(DenseDataset(tmp_path / "back")[:], data)
    np.testing.assert_array_equal(DenseDataset(tmp_path / "b2")[:], data)


KILL_AT_RENAME = textwrap.dedent("""
    import os, signal, sys
    from loaderx import _native
    from loaderx.archive import pack, unpack
    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    os.rename = os.replace = os.link = die  # killed where the result would take its name
    _native.rename_noreplace = die
    (pack if sys.argv[1] == "pack" else unpack)(sys.argv[2], sys.argv[3])
""")


def test_a_killed_pack_or_unpack_leaves_nothing_behind_for_long(tmp_path):
    data = dataset(tmp_path / "ds", codec="zstd")
    pack(tmp_path / "ds", tmp_path / "ds.tar.gz")
    before = set(os.listdir(tmp_path))
    for args in (["unpack", tmp_path / "ds.tar.gz", tmp_path / "back"],
                 ["pack", tmp_path / "ds", tmp_path / "again.tar.gz"]):
        proc = subprocess.run([sys.executable, "-c", KILL_AT_RENAME, *map(str, args)],
                              capture_output=True, text=True, timeout=HANG)
        assert proc.returncode == -9, proc.stderr
    assert set(os.listdir(tmp_path)) - before, "the kills left their staging behind"
    unpack(tmp_path / "ds.tar.gz", tmp_path / "back")  # the next run clears what they left
    pack(tmp_path / "ds", tmp_path / "again.tar.gz")
    assert set(os.listdir(tmp_path)) == before | {"back", "again.tar.gz"}
    np.testing.assert_array_equal(DenseDataset(tmp_path / "back")[:], data)


def test_pack_leaves_out_strays_and_its_own_temporary(tmp_path):
    data = dataset(tmp_path / "ds")
    (tmp_path / "ds" / "notes.txt").write_text("mine")
    (tmp_path / "ds" / "0.zr.orig").write_bytes(b"old")
    (tmp_path / "ds" / "sub").mkdir()
    r = pack(tmp_path / "ds", tmp_path / "ds" / "inside.tar")  # written inside the store
    assert r["skipped"] == ["0.zr.orig", "notes.txt"]
    with tarfile.open(tmp_path / "ds" / "inside.tar") as tar:
        names = sorted(m.name for m in tar)
    assert names == ["ds", "ds/0.zr", "ds/meta.zr", "ds/schema.msgpack"]
    unpack(tmp_path / "ds" / "inside.tar", tmp_path / "back")
    np.testing.assert_array_equal(DenseDataset(tmp_path / "back")[:], data)


def test_unpack_never_carries_a_retired_gen_file(tmp_path):
    data = dataset(tmp_path / "ds")
    with Zrecord(tmp_path / "ds") as z:
        z._retire()  # what an overwrite does to the store it replaced
    with tarfile.open(tmp_path / "plain.tar", "w") as tar:  # gen.zr and all
        tar.add(tmp_path / "ds", arcname="ds")
    unpack(tmp_path / "plain.tar", tmp_path / "back")
    with Zrecord(tmp_path / "back") as z:  # a fresh store: it may be written
        z.append(np.zeros(64, np.uint8), [0])
        assert len(z) == 201
    np.testing.assert_array_equal(DenseDataset(tmp_path / "back")[:200], data)


# -- cut or damaged: never a silent end --------------------------------------------------------


@pytest.mark.parametrize("maker", ["pack", "by hand"])
def test_an_archive_cut_at_any_member_boundary_is_refused(tmp_path, maker):
    dataset(tmp_path / "ds", checksums=True)
    archive = tmp_path / "ds.tar"
    if maker == "pack":
        pack(tmp_path / "ds", archive)
    else:  # no manifest: only the end-of-archive blocks can tell a whole archive
        archive.write_bytes(crafted(tmp_path / "ds"))
    whole = archive.read_bytes()
    spans = member_spans(archive)
    cuts = [start for start, _ in spans[1:]] + [spans[-1][1], spans[-1][1] + 512]
    for cut in cuts:
        assert_refused(tmp_path, whole[:cut], "cut short")


def test_a_damaged_header_is_refused_not_taken_for_the_end(tmp_path):
    dataset(tmp_path / "ds", checksums=True)
    pack(tmp_path / "ds", tmp_path / "ds.tar")
    whole = (tmp_path / "ds.tar").read_bytes()
    for at in headers_of(tmp_path / "ds.tar")[1:]:
        for field in (0, 124, 156):  # name, size, type
            damaged = bytearray(whole)
            damaged[at + field] ^= 0x10
            assert_refused(tmp_path, bytes(damaged), "checksum")


def test_a_lone_zero_block_is_not_the_end(tmp_path):
    dataset(tmp_path / "ds")
    pack(tmp_path / "ds", tmp_path / "ds.tar")
    whole = (tmp_path / "ds.tar").read_bytes()
    at = member_spans(tmp_path / "ds.tar")[-1][0]  # before the last member
    assert_refused(tmp_path, whole[:at] + bytes(512) + whole[at:], "zero block")


def test_damage_to_the_data_of_an_uncompressed_archive_is_seen(tmp_path):
    """A raw store without checksums: only the archive's own CRC-32 of each file can see it."""
    dataset(tmp_path / "ds", codec="raw")
    pack(tmp_path / "ds", tmp_path / "ds.tar")
    whole = (tmp_path / "ds.tar").read_bytes()
    with tarfile.open(tmp_path / "ds.tar") as tar:
        chunk = tar.getmember("ds/0.zr")
    for at in (chunk.offset_data, chunk.offset_data + 777, chunk.offset_data + chunk.size - 1):
        damaged = bytearray(whole)
        damaged[at] ^= 0x01
        assert_refused(tmp_path, bytes(damaged), "does not match its checksum")


def test_a_file_missing_from_a_packed_archive_is_refused(tmp_path):
    dataset(tmp_path / "ds", checksums=True)
    pack(tmp_path / "ds", tmp_path / "ds.tar")
    whole = (tmp_path / "ds.tar").read_bytes()
    with tarfile.open(tmp_path / "ds.tar") as tar:
        names = [m.name for m in tar]
    for i, (start, end) in enumerate(member_spans(tmp_path / "ds.tar")):
        if names[i] != "ds":
            out = assert_refused(tmp_path, whole[:start] + whole[end:], "manifest")
            assert names[i].split("/")[1] in out["message"]


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.xz", ".tar.bz2"])
def test_the_compression_check_is_verified_and_nothing_may_follow(tmp_path, suffix):
    dataset(tmp_path / "ds")
    pack(tmp_path / "ds", tmp_path / f"ds{suffix}")
    whole = (tmp_path / f"ds{suffix}").read_bytes()
    for bit in range(0, 64, 9):  # the stream's check and length at its end (gzip: CRC, ISIZE)
        damaged = bytearray(whole)
        damaged[len(whole) - 8 - (12 if suffix == ".tar.xz" else 0) + bit // 8] ^= 1 << bit % 8
        assert_refused(tmp_path, bytes(damaged), "damaged", suffix)
    assert_refused(tmp_path, whole + b"trailing garbage", "after the end", suffix)
    assert_refused(tmp_path, whole[:-1], "cut short", suffix)


def test_single_bit_flips_of_a_gzip_archive_never_change_a_record(tmp_path):
    """The finding: 71 of 300 flips were accepted, some with other record values. Now a flip
    is refused, or lands where nothing depends on it (the gzip header's time and flags)."""
    data = dataset(tmp_path / "ds", codec="raw")  # no checksums: only gzip's CRC can tell
    pack(tmp_path / "ds", tmp_path / "ds.tar.gz")
    whole = (tmp_path / "ds.tar.gz").read_bytes()
    rng = random.Random(19)
    (tmp_path / "work").mkdir()
    accepted = []
    for case in range(24):
        at = rng.randrange(len(whole))
        damaged = bytearray(whole)
        damaged[at] ^= 1 << rng.randrange(8)
        (tmp_path / "flip.tar.gz").write_bytes(damaged)
        dst = tmp_path / "work" / f"d{case}"
        out = unpack_in_child(tmp_path / "flip.tar.gz", dst)
        if out["outcome"] == "unpacked":
            accepted.append(at)
            np.testing.assert_array_equal(DenseDataset(dst)[:], data)
        else:
            assert out["outcome"] == "CorruptStoreError", out
    assert all(at < 10 for at in accepted), accepted  # the gzip header: flags, time, OS


# -- hostile members and bombs -----------------------------------------------------------------


@functools.cache
def hostile_cases() -> dict[str, tuple[bytes, str, str]]:
    """id -> (archive bytes, needle in the error, suffix); built once, when first needed."""
    meta = tc.meta_member()
    big = 32 * MiB
    nonzero = bz2.compress(bytes([1]) * (4 * MiB))  # data that cannot be a hole
    cases = [
        # Names past the format's limits, sizes past a file's limit (the 1 GiB writes).
        ("chunk id past 4095", meta + tc.header("ds/4096.zr", big), "not a store file", ".tar"),
        ("padded chunk id", meta + tc.member("ds/007.zr", b"x"), "not a store file", ".tar"),
        ("chunk past 4 GiB", meta + tc.sparse10("ds/0.zr", (4 << 30) + 1, [(0, 1)], b"x"),
         "at most 4294967296", ".tar"),
        ("dict past 32 MiB", meta + tc.header("ds/dict.zr", 33 * MiB), "at most", ".tar"),
        ("schema past 1 MiB", meta + tc.header("ds/schema.msgpack", 2 * MiB), "at most",
         ".tar"),
        ("gen.zr not 64 bytes", meta + tc.member("ds/gen.zr", bytes(65)), "exactly 64", ".tar"),
        ("sums.zr of the wrong size", meta + tc.member("ds/sums.zr", b"ZSUM"), "exactly",
         ".tar"),
        # Extension headers that claim more than any store needs.
        ("pax header of 1 GiB", tc.header("././@PaxHeader", 1 << 30, b"x"), "extension header",
         ".tar"),
        ("long name of 1 GiB", tc.header("././@LongLink", 1 << 30, b"L", gnu=True),
         "extension header", ".tar"),
        ("sparse map of 10**7 regions", meta + tc.sparse10(
            "ds/0.zr", 1 << 30, [], b"", map_bytes=tc.pad(b"10000000\n" + b"0\n0\n" * 4096)),
         "over the limit", ".tar"),
        ("sparse regions out of order", meta + tc.sparse10(
            "ds/0.zr", 4096, [(100, 1), (50, 1)], b"ab"), "out of order", ".tar"),
        ("sparse regions overlapping", meta + tc.sparse10(
            "ds/0.zr", 4096, [(0, 10), (5, 10)], bytes(20)), "overlapping", ".tar"),
        ("sparse region past the file", meta + tc.sparse10(
            "ds/0.zr", 4096, [(4000, 200)], bytes(200)), "past the end", ".tar"),
        ("sparse region past any offset", meta + tc.sparse10(
            "ds/0.zr", 4096, [(2**64, 1)], b"x"), "past any file", ".tar"),
        ("sparse map naming more data than stored", meta + tc.sparse10(
            "ds/0.zr", 4096, [(0, 100)], bytes(10)), "are stored", ".tar"),
        ("sparse map that is not numbers", meta + tc.sparse10(
            "ds/0.zr", 4096, [], b"", map_bytes=tc.pad(b"1\nzero\n10\n")), "not a decimal",
         ".tar"),
        ("unknown sparse format", meta + tc.pax([("GNU.sparse.major", "2")])
         + tc.member("ds/0.zr", b"x"), "sparse format", ".tar"),
        ("size field in base-256 past 2**63", meta + tc.header(
            "ds/0.zr", 0, size_field=b"\x80" + b"\xff" * 11), "past any file", ".tar"),
        ("negative size field", meta + tc.header("ds/0.zr", 0, size_field=b"\xff" * 12),
         "negative", ".tar"),
        ("pax size that is not a number", meta + tc.pax([("size", "12x")])
         + tc.member("ds/0.zr", b"x"), "not a decimal", ".tar"),
        ("pax record of the wrong length", meta + tc.header("././@PaxHeader", 20, b"x")
         + tc.pad(b"99 path=ds/0.zr\n\0\0\0\0"), "length", ".tar"),
        ("pax global header renaming members", tc.pax([("path", "ds/meta.zr")], b"g") + meta,
         "global header", ".tar"),
        ("extension header and then the end", meta + tc.pax([("mtime", "1")]) + tc.end(),
         "no member after it", ".tar"),
        ("over the header limit", gz(b"".join(tc.pax([("comment", "x")], b"g")
                                              for _ in range(17_000)) + meta + tc.end()),
         "headers", ".tar.gz"),
        ("a member after checksummed pack files with no manifest", meta
         + tc.pax([("comment", '{"loaderx-pack-crc32":1}')]) + tc.member("ds/0.zr", b"x"),
         "manifest", ".tar"),
        ("a zstd-compressed archive", b"\x28\xb5\x2f\xfd" + bytes(100), "zstd", ".tar.zst"),
        ("empty", b"", "empty", ".tar"),
        ("shorter than a block", b"ds/meta.zr", "shorter than one block", ".tar"),
        # Bombs: a few KiB that decompress to GiB.
        ("pax header of 1 GiB, bz2", bz2.compress(tc.header("././@PaxHeader", 1 << 30, b"x"))
         + bz2_zeros(256), "extension header", ".tar.bz2"),
        ("long name of 1 GiB, bz2", bz2.compress(tc.header("././@LongLink", 1 << 30, b"L"))
         + bz2_zeros(256), "extension header", ".tar.bz2"),
        ("chunk past the limit with data, bz2", bz2.compress(meta + tc.header(
            "ds/99999.zr", 4 * MiB)) + nonzero + bz2.compress(tc.end()), "not a store file",
         ".tar.bz2"),
        ("sparse map of 10**7 regions, gz", gz(meta + tc.sparse10(
            "ds/0.zr", 1 << 30, [], b"", map_bytes=tc.pad(b"10000000\n" + b"0\n0\n" * 10**7))),
         "over the limit", ".tar.gz"),
        ("1 GiB of zeros after the end, bz2", bz2.compress(meta + tc.end()) + bz2_zeros(1024),
         "zeros after", ".tar.bz2"),
        ("data after the end", meta + tc.end() + tc.member("ds/0.zr", b"x"), "data after",
         ".tar"),
    ]
    return {name: rest for name, *rest in cases}


HOSTILE = ["chunk id past 4095", "padded chunk id", "chunk past 4 GiB", "dict past 32 MiB",
           "schema past 1 MiB", "gen.zr not 64 bytes", "sums.zr of the wrong size",
           "pax header of 1 GiB", "long name of 1 GiB", "sparse map of 10**7 regions",
           "sparse regions out of order", "sparse regions overlapping",
           "sparse region past the file", "sparse region past any offset",
           "sparse map naming more data than stored", "sparse map that is not numbers",
           "unknown sparse format", "size field in base-256 past 2**63", "negative size field",
           "pax size that is not a number", "pax record of the wrong length",
           "pax global header renaming members", "extension header and then the end",
           "over the header limit", "a member after checksummed pack files with no manifest",
           "a zstd-compressed archive", "empty", "shorter than a block",
           "pax header of 1 GiB, bz2", "long name of 1 GiB, bz2",
           "chunk past the limit with data, bz2", "sparse map of 10**7 regions, gz",
           "1 GiB of zeros after the end, bz2", "data after the end"]


def test_every_hostile_case_is_run():
    assert list(hostile_cases()) == HOSTILE


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_and_bomb_archives_are_refused_within_bounds(tmp_path, name):
    blob, needle, suffix = hostile_cases()[name]
    assert_refused(tmp_path, blob, needle, suffix)


def test_a_crafted_archive_of_a_valid_store_unpacks(tmp_path):
    """The hostile cases above are refused for what they change, not for being hand-made."""
    archive = tmp_path / "ok.tar"
    archive.write_bytes(tc.folder("ds") + tc.meta_member() + tc.end())
    assert unpack_in_child(archive, tmp_path / "dst")["outcome"] == "unpacked"
    assert len(Zrecord(tmp_path / "dst")) == 0


def test_gnu_sparse_formats_all_read(tmp_path):
    """Sparse maps in pax records (0.0, 0.1) and in the old GNU header, as GNU tar writes
    them, give the same file."""
    rng = np.random.default_rng(0)
    records = [rng.integers(0, 255, size=int(n), dtype=np.uint8) for n in (10, 3000, 70)]
    from_iterator(tmp_path / "src", records, codec="raw")
    size = os.path.getsize(tmp_path / "src" / "0.zr")
    body = (tmp_path / "src" / "0.zr").read_bytes()
    with open(tmp_path / "src" / "meta.zr", "rb") as f:
        meta = f.read(4096)
    regions = [(0, 100), (100, size - 100)]  # two regions covering the file
    map01 = ",".join(str(n) for r in regions for n in r)
    s = [("GNU.sparse.size", str(size)), ("GNU.sparse.name", "ds/0.zr")]
    variants = {
        "0.1": tc.pax([*s, ("GNU.sparse.map", map01)]) + tc.member("ds/GNUSparseFile/0.zr",
                                                                   body),
        "0.0": tc.pax([*s, ("GNU.sparse.offset", "0"), ("GNU.sparse.numbytes", "100"),
                       ("GNU.sparse.offset", "100"),
                       ("GNU.sparse.numbytes", str(size - 100))])
        + tc.member("ds/GNUSparseFile/0.zr", body),
        "old GNU": old_gnu_sparse("ds/0.zr", size, regions, body),
    }
    meta_member = tc.sparse10("ds/meta.zr", tc.TABLE_BYTES, [(0, 4096)], meta)
    for name, chunk in variants.items():
        archive = tmp_path / f"{name}.tar"
        schema = tc.member("ds/schema.msgpack",
                           (tmp_path / "src" / "schema.msgpack").read_bytes())
        archive.write_bytes(tc.folder("ds") + meta_member + schema + chunk + tc.end())
        unpack(archive, tmp_path / name)
        with RaggedDataset(tmp_path / name) as back:
            for got, want in zip(back[:], records, strict=True):
                np.testing.assert_array_equal(got, want, err_msg=name)


def old_gnu_sparse(name: str, size: int, regions: list[tuple[int, int]], body: bytes) -> bytes:
    """An old GNU sparse member ('S'): the first four regions in the header, the rest in
    extension blocks of 21."""
    h = bytearray(tc.header(name, len(body), b"S", gnu=True, fix_checksum=False))
    for i, (offset, length) in enumerate(regions[:4]):
        h[386 + 24 * i:386 + 24 * i + 24] = tc.octal(offset, 12) + tc.octal(length, 12)
    h[483:495] = tc.octal(size, 12)
    assert len(regions) <= 4
    tc.set_checksum(h)
    return bytes(h) + tc.pad(body)


# -- what the caller sees ----------------------------------------------------------------------


def test_the_cli_reports_a_hostile_archive_in_one_line_with_its_own_status(tmp_path):
    (tmp_path / "bad.tar.gz").write_bytes(gz(tc.meta_member() + tc.header("ds/4096.zr", 9)))
    cli = [sys.executable, "-m", "loaderx"]
    proc = subprocess.run([*cli, "unpack", str(tmp_path / "bad.tar.gz"), str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 3, proc.stderr  # EXIT_CORRUPT: not 1 (damaged records)
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "CorruptStoreError" in proc.stderr and "4096.zr" in proc.stderr
    proc = subprocess.run([*cli, "unpack", str(tmp_path / "missing.tar"), str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar program")
@pytest.mark.parametrize("options", [["--format=gnu"], ["--format=oldgnu"], ["--format=posix"],
                                     ["--format=posix", "--sparse-version=0.0"],
                                     ["--format=posix", "--sparse-version=0.1"]])
def test_gnu_tar_archives_of_every_format_unpack(tmp_path, options):
    """Archives of a store made without pack (no manifest), in each of GNU tar's formats and
    sparse versions, under a top folder whose name needs a long-name header."""
    top = "a-dataset-with-a-long-name-" + "x" * 100
    data = dataset(tmp_path / top, checksums=True)
    subprocess.run(["tar", "--sparse", *options, "-czf", str(tmp_path / "a.tgz"), "-C",
                    str(tmp_path), top], check=True, timeout=HANG)
    unpack(tmp_path / "a.tgz", tmp_path / "back")
    np.testing.assert_array_equal(DenseDataset(tmp_path / "back")[:], data)
    assert os.stat(tmp_path / "back" / "meta.zr").st_blocks * 512 < MiB


def test_unpack_errors_are_corrupt_store_errors_in_process(tmp_path):
    """The same refusals in this process: the class, and the archive's name."""
    (tmp_path / "x.tar.xz").write_bytes(lzma.compress(tc.meta_member())[:-30])
    with pytest.raises(CorruptStoreError, match="x.tar.xz"):
        unpack(tmp_path / "x.tar.xz", tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_fuzzed_archives_are_refused_or_unpack_intact():
    """1000 seeded mutations of packed archives (scripts/fuzz_archive.py; the stress run gives
    it minutes): every unpack is refused as corrupt or gives back every record unchanged --
    never other data, another exception, a crash, a hang or a memory blow-up."""
    script = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "fuzz_archive.py"
    r = subprocess.run([sys.executable, str(script), "--cases", "1000", "--seconds", "600",
                        "--seed", "19"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["cases"] == 1000 and summary["bugs"] == 0
    assert summary["refused"] > 0 and summary["intact"] > 0
