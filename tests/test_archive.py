"""pack/unpack: one tar archive per store, holes kept, hostile archives refused."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from conftest import FIXTURES, copy_store
from loaderx import DenseDataset, RaggedDataset, Zrecord, from_iterator, from_numpy
from loaderx.archive import pack, unpack
from loaderx.errors import CorruptStoreError, DatasetError

META_BYTES = 16 + 16 * 2**24


def allocated(path: os.PathLike[str] | str) -> int:
    return os.stat(path).st_blocks * 512


def holey_store(path: os.PathLike[str]) -> np.ndarray:
    """A dense store whose chunk file has a hole (deleted records compacted away)."""
    data = np.random.default_rng(3).normal(size=(600, 256)).astype(np.float32)
    from_numpy(path, data, codec="raw")
    with Zrecord(os.fspath(path)) as z:
        z.delete(np.arange(0, 300, dtype=np.uint64))
        z.compact()
    return data[300:]


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz", ".tar.xz"])
def test_round_trip_keeps_holes(tmp_path, suffix):
    kept = holey_store(tmp_path / "ds")
    archive = tmp_path / f"ds{suffix}"
    r = pack(tmp_path / "ds", archive)
    assert r["records"] == 300
    assert r["apparent_bytes"] > META_BYTES
    assert r["bytes_packed"] < 2 * kept.nbytes, "only data regions are stored"
    assert os.path.getsize(archive) < 2 * kept.nbytes + (1 << 20)
    out = unpack(archive, tmp_path / "back")
    assert out["records"] == 300 and not out["verify"]["failures"]
    np.testing.assert_array_equal(DenseDataset(tmp_path / "back")[:], kept)
    for name in os.listdir(tmp_path / "ds"):
        assert os.path.getsize(tmp_path / "back" / name) == os.path.getsize(tmp_path / "ds" / name)
    assert allocated(tmp_path / "back" / "meta.zr") < 1 << 20, "meta.zr stayed sparse"
    assert not [n for n in os.listdir(tmp_path) if "packing" in n or "unpacking" in n]


def test_ragged_and_dictionary_stores(tmp_path):
    rng = np.random.default_rng(5)
    records = [rng.integers(0, 20, size=rng.integers(1, 300)).astype(np.int16) for _ in range(500)]
    from_iterator(tmp_path / "rg", records, codec="zstd_dict")
    pack(tmp_path / "rg", tmp_path / "rg.tgz")
    unpack(tmp_path / "rg.tgz", tmp_path / "back")
    back = RaggedDataset(tmp_path / "back")
    assert len(back) == len(records)
    for i in (0, 17, 499):
        np.testing.assert_array_equal(back[i], records[i])
    assert os.path.exists(tmp_path / "back" / "dict.zr")


@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar program")
def test_gnu_tar_reads_what_pack_writes(tmp_path):
    kept = holey_store(tmp_path / "ds")
    pack(tmp_path / "ds", tmp_path / "ds.tar.gz")
    (tmp_path / "x").mkdir()
    proc = subprocess.run(["tar", "-xzf", str(tmp_path / "ds.tar.gz"), "-C",
                           str(tmp_path / "x")], capture_output=True, text=True, check=True)
    assert proc.stderr == "", "the manifest and checksums (pax comments) draw no warning"
    assert sorted(os.listdir(tmp_path / "x" / "ds")) == ["0.zr", "meta.zr", "schema.msgpack"]
    assert os.path.getsize(tmp_path / "x" / "ds" / "meta.zr") == META_BYTES
    np.testing.assert_array_equal(DenseDataset(tmp_path / "x" / "ds")[:], kept)


@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar program")
def test_unpacks_a_tar_sparse_archive_of_a_reference_store(tmp_path, reference_stores):
    name = "f32_raw"
    copy_store(reference_stores / name, tmp_path / name)
    subprocess.run(["tar", "--sparse", "-czf", str(tmp_path / "ref.tgz"), "-C", str(tmp_path),
                    name], check=True)
    unpack(tmp_path / "ref.tgz", tmp_path / "back")
    expected = np.load(FIXTURES / f"{name}.expected.npy")
    np.testing.assert_array_equal(DenseDataset(tmp_path / "back")[:], expected)
    assert allocated(tmp_path / "back" / "0.zr") < 1 << 20


def test_plain_tar_zero_runs_become_holes(tmp_path):
    kept = holey_store(tmp_path / "ds")
    with tarfile.open(tmp_path / "plain.tar", "w") as tar:  # no sparse support: zeros stored
        tar.add(tmp_path / "ds", arcname="ds")
    unpack(tmp_path / "plain.tar", tmp_path / "back")
    np.testing.assert_array_equal(DenseDataset(tmp_path / "back")[:], kept)
    assert allocated(tmp_path / "back" / "meta.zr") < 1 << 20


def test_refuses_existing_targets_and_non_stores(tmp_path):
    holey_store(tmp_path / "ds")
    (tmp_path / "taken.tar").write_bytes(b"")
    with pytest.raises(DatasetError, match="exists"):
        pack(tmp_path / "ds", tmp_path / "taken.tar")
    assert (tmp_path / "taken.tar").read_bytes() == b""
    with pytest.raises(DatasetError, match="not a loaderx store"):
        pack(tmp_path, tmp_path / "new.tar")
    pack(tmp_path / "ds", tmp_path / "ds.tar")
    (tmp_path / "there").mkdir()
    with pytest.raises(DatasetError, match="exists"):
        unpack(tmp_path / "ds.tar", tmp_path / "there")


def test_refuses_a_store_another_process_writes(tmp_path):
    holey_store(tmp_path / "ds")
    writer = Zrecord(os.fspath(tmp_path / "ds"))
    writer.lock_for_writing()
    code = ("import sys; from loaderx.archive import pack\n"
            "try:\n    pack(sys.argv[1], sys.argv[2])\n"
            "except Exception as e:\n    print(type(e).__name__)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ds"),
                           str(tmp_path / "ds.tar")], capture_output=True, text=True, check=True)
    writer.close()
    assert proc.stdout.strip() == "StoreBusyError"
    assert not (tmp_path / "ds.tar").exists()


def hostile(path: os.PathLike[str], members: list[tuple[tarfile.TarInfo, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for info, body in members:
            info.size = len(body) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(body) if info.isreg() else None)


def member(name: str, kind: bytes = tarfile.REGTYPE, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize("members, needle", [
    ([(member("ds/../../escape.zr"), b"x")], "not a store file"),
    ([(member("/abs/meta.zr"), b"x"), (member("/abs/0.zr"), b"x")], "not a store file"),
    ([(member("ds/meta.zr", tarfile.SYMTYPE, "/etc/passwd"), b"")], "not a store file"),
    ([(member("ds/0.zr", tarfile.LNKTYPE, "ds/meta.zr"), b"")], "not a store file"),
    ([(member("ds/sub", tarfile.DIRTYPE), b"")], "not a store file"),
    ([(member("ds/run.sh"), b"#!/bin/sh")], "not a store file"),
    ([(member("ds/0.zr"), b"a"), (member("other/0.zr"), b"b")], "not a store file"),
    ([(member("ds/0.zr"), b"a"), (member("ds/0.zr"), b"b")], "twice"),
    ([(member("ds/0.zr"), b"a")], "holds no meta.zr"),
    ([(member("ds/meta.zr"), b"short")], "meta.zr is 5 bytes"),
])
def test_hostile_archives_are_refused_and_leave_nothing(tmp_path, members, needle):
    hostile(tmp_path / "bad.tar", members)
    (tmp_path / "work").mkdir()
    with pytest.raises(CorruptStoreError, match=needle):
        unpack(tmp_path / "bad.tar", tmp_path / "work" / "dst")
    assert os.listdir(tmp_path / "work") == []
    assert sorted(os.listdir(tmp_path)) == ["bad.tar", "work"]


def test_damaged_and_truncated_archives(tmp_path):
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(CorruptStoreError, match="not a tar archive"):
        unpack(tmp_path / "junk.tar", tmp_path / "a")
    holey_store(tmp_path / "ds")
    pack(tmp_path / "ds", tmp_path / "ds.tar.gz")
    whole = (tmp_path / "ds.tar.gz").read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CorruptStoreError):
        unpack(tmp_path / "cut.tar.gz", tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_cli_pack_and_unpack(tmp_path):
    kept = holey_store(tmp_path / "ds")
    cli = [sys.executable, "-m", "loaderx"]
    proc = subprocess.run([*cli, "pack", str(tmp_path / "ds"), str(tmp_path / "ds.tar.gz")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "300 records" in proc.stdout and "holes kept" in proc.stdout
    proc = subprocess.run([*cli, "unpack", str(tmp_path / "ds.tar.gz"), str(tmp_path / "b")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(DenseDataset(tmp_path / "b")[:], kept)
    proc = subprocess.run([*cli, "unpack", str(tmp_path / "ds.tar.gz"), str(tmp_path / "b")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "exists" in proc.stderr and "Traceback" not in proc.stderr


def test_a_file_of_many_data_regions_round_trips(tmp_path):
    """Several data regions and holes, a trailing hole: tarfile reads back the same bytes and
    the same holes (checked against the file itself, not against our own reader)."""
    from loaderx._archives.archive import _add_file

    path = tmp_path / "holes.bin"
    with open(path, "wb") as f:
        f.truncate(9 << 20)
        for at in (0, 1 << 20, (3 << 20) + 4096, 5 << 20):
            f.seek(at)
            f.write(bytes(range(256)) * 64 + at.to_bytes(8, "little"))
    fd = os.open(path, os.O_RDONLY)
    try:
        with tarfile.open(tmp_path / "t.tar", "w", format=tarfile.PAX_FORMAT) as tar:
            stored = _add_file(tar, fd, "top/holes.bin")
    finally:
        os.close(fd)
    assert stored < 1 << 20
    with tarfile.open(tmp_path / "t.tar") as tar:
        member = tar.getmember("top/holes.bin")
        assert member.size == 9 << 20 and len(member.sparse) >= 4
        body = tar.extractfile(member).read()
    assert body == path.read_bytes()
