"""Record checksums from Python: converters that keep them, datasets that check every read,
and what each mode detects."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import reliability as rel
from loaderx.converter import from_iterator, from_numpy
from loaderx.dataset import DenseDataset, RaggedDataset
from loaderx.errors import CorruptStoreError
from loaderx.zrecord import Zrecord

DATA = np.arange(64 * 32, dtype=np.int32).reshape(64, 32)


def flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def raw_offset(z: Zrecord, index: int) -> int:
    """Where record ``index`` of a raw store starts in 0.zr: records are packed in order."""
    return int(z.lengths(np.arange(index, dtype=np.uint64)).sum())


def test_converted_with_checksums_verify_and_catch_a_changed_byte(tmp_path):
    from_numpy(tmp_path / "d", DATA, codec="raw", checksums=True)
    with Zrecord(tmp_path / "d") as z:
        assert z.has_checksums() and z.stats()["checksums"]
        assert z.verify() == {"records": 64, "checked": 64, "unchecked": 0, "failed": 0,
                              "failures": []}
        at = raw_offset(z, 9) + 17
    flip(tmp_path / "d" / "0.zr", at)
    # Unchecked reads of a raw store cannot see the damage...
    with DenseDataset(tmp_path / "d") as ds:
        assert not np.array_equal(ds[9], DATA[9])
    # ...checked reads and verify can.
    with DenseDataset(tmp_path / "d", verify_reads=True) as ds:
        with pytest.raises(CorruptStoreError, match="record 9 does not match its checksum"):
            ds[9]
        np.testing.assert_array_equal(ds[[8, 10]], DATA[[8, 10]])
        clone = pickle.loads(pickle.dumps(ds))
        with pytest.raises(CorruptStoreError):
            clone[np.arange(64)]
        clone.close()
    with Zrecord(tmp_path / "d") as z:
        report = z.verify()
    assert [i for i, _ in report["failures"]] == [9]
    assert report["checked"] == 64


def test_enabling_on_an_existing_dataset_and_appending(tmp_path):
    recs = [np.arange(n, dtype=np.float32) for n in (5, 0, 300, 2)]
    from_iterator(tmp_path / "r", recs, codec="zstd")
    with Zrecord(tmp_path / "r") as z:
        assert not z.has_checksums()
        assert z.verify()["unchecked"] == 4
    # Sums the 4 there, then the new 4.
    from_iterator(tmp_path / "r", recs, checksums=True, append=True)
    with Zrecord(tmp_path / "r") as z:
        assert z.verify() == {"records": 8, "checked": 8, "unchecked": 0, "failed": 0,
                              "failures": []}
        z.append(*rel.pack([b"\x00" * 8]))  # any later append is summed too
        assert z.verify()["checked"] == 9
    with RaggedDataset(tmp_path / "r", verify_reads=True) as rs:
        for got, want in zip(rs[:8], recs + recs, strict=True):
            np.testing.assert_array_equal(got, want)


def test_verify_reports_every_damaged_record_without_raising(tmp_path):
    with Zrecord(tmp_path / "s", codec="raw") as z:
        z.enable_checksums()
        recs = [rel.make_record(i) for i in range(40)]
        z.append(*rel.pack(recs))
        starts = [raw_offset(z, i) for i in (3, 20, 33)]
    for s in starts:
        flip(tmp_path / "s" / "0.zr", s + 12)
    with Zrecord(tmp_path / "s") as z:
        report = z.verify()
        assert [i for i, _ in report["failures"]] == [3, 20, 33]
        assert all("checksum" in m for _, m in report["failures"])
        z.verify_reads = True
        assert z.verify_reads
        with pytest.raises(CorruptStoreError, match="record 20"):
            rel.read_records(z, np.array([20], dtype=np.uint64))
