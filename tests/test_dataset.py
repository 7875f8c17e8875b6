"""DenseDataset, RaggedDataset and pad against NumPy as the reference model, the reference
fixtures through the dataset views, and the errors for bad indices and wrong stores."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FIXTURES
from loaderx.converter import from_iterator, from_numpy
from loaderx.dataset import DenseDataset, RaggedDataset, pad
from loaderx.errors import CorruptStoreError, DatasetError, StoreClosedError, ZrecordValueError
from loaderx.zrecord import Zrecord

ARR = (np.arange(50 * 3 * 4, dtype=np.int32) * 3 % 101).reshape(50, 3, 4)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense") / "d"
    from_numpy(path, ARR, codec="zstd")
    with DenseDataset(path) as ds:
        yield ds


@pytest.mark.parametrize("idx", [
    0, 49, -1, -50, np.int64(7), np.uint8(3),
    [3, 1, 3], np.array([5, -2]), np.array([[1, 2], [3, 4]]), [],
    slice(None), slice(5, 30, 7), slice(None, None, -3), slice(100, 200),
    (2, 1), ([0, 4], slice(None), 2), (-1, 2, 3),
])
def test_dense_indexing_matches_numpy(dense, idx):
    got = dense[idx]
    want = ARR[idx]
    assert type(got) is type(want)
    np.testing.assert_array_equal(got, want)
    if isinstance(want, np.ndarray):
        assert got.shape == want.shape and got.dtype == want.dtype


def test_boolean_mask(dense):
    mask = ARR[:, 0, 0] % 2 == 0
    np.testing.assert_array_equal(dense[mask], ARR[mask])
    with pytest.raises(IndexError, match="boolean index"):
        dense[mask[:-1]]


@pytest.mark.parametrize("idx", [50, -51, [0, 50], np.array([-51]), 1.0, [1.5], True, "a", ()])
def test_bad_indices_raise_index_error(dense, idx):
    with pytest.raises(IndexError):
        dense[idx]


def test_gather_into_a_preallocated_array(dense):
    out = np.full((4, 3, 4), -1, dtype=np.int32)
    res = dense.gather([9, 0, 9, 49], out=out)
    assert res is out
    np.testing.assert_array_equal(out, ARR[[9, 0, 9, 49]])
    for bad in (np.empty((4, 3, 4), np.int64), np.empty((3, 3, 4), np.int32),
                np.empty((4, 4, 3), np.int32).transpose(0, 2, 1), [[0]]):
        with pytest.raises(ZrecordValueError):
            dense.gather([9, 0, 9, 49], out=bad)
    ro = np.empty((4, 3, 4), np.int32)
    ro.flags.writeable = False
    with pytest.raises(ZrecordValueError, match="read-only"):
        dense.gather([9, 0, 9, 49], out=ro)


def test_getitems_batch_fetch(dense):
    np.testing.assert_array_equal(dense.__getitems__([4, 2, 0]), ARR[[4, 2, 0]])


def test_properties_and_lifecycle(tmp_path):
    from_numpy(tmp_path / "d", np.zeros((3, 2), np.float16))
    ds = DenseDataset(tmp_path / "d")
    assert (len(ds), ds.dtype, ds.item_shape, ds.record_bytes) == (3, np.float16, (2,), 4)
    assert "records=3" in repr(ds)
    ds.close()
    ds.close()
    assert ds.closed and "closed" in repr(ds)
    with pytest.raises(StoreClosedError):
        ds[0]


def test_datasets_pickle_by_path(dense, tmp_path):
    clone = pickle.loads(pickle.dumps(dense))
    assert clone.path == dense.path
    np.testing.assert_array_equal(clone[[1, 2]], ARR[[1, 2]])
    clone.close()
    from_iterator(tmp_path / "r", [np.arange(3)])
    rs = pickle.loads(pickle.dumps(RaggedDataset(tmp_path / "r")))
    np.testing.assert_array_equal(rs[0], np.arange(3))


def _child_sum(ds: DenseDataset, idx: list[int]) -> int:
    return int(ds[idx].sum())


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_datasets_in_worker_processes(dense, method):
    ctx = mp.get_context(method)
    with ctx.Pool(2) as pool:
        got = pool.starmap(_child_sum, [(dense, [0, 1]), (dense, [10, 20, 30])])
    assert got == [int(ARR[[0, 1]].sum()), int(ARR[[10, 20, 30]].sum())]
    np.testing.assert_array_equal(dense[5], ARR[5])  # the parent still works


def test_opening_the_wrong_thing(tmp_path):
    with pytest.raises(FileNotFoundError):
        DenseDataset(tmp_path / "missing")
    assert not (tmp_path / "missing").exists(), "opening a dataset must not create a store"
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="not a loaderx dataset"):
        DenseDataset(tmp_path / "empty")
    with Zrecord(tmp_path / "raw") as z:
        z.append(b"abc", [0])
    with pytest.raises(DatasetError, match="raw Zrecord store"):
        DenseDataset(tmp_path / "raw")
    from_numpy(tmp_path / "d", np.ones((2, 2)))
    with pytest.raises(DatasetError, match="DenseDataset"):
        RaggedDataset(tmp_path / "d")
    (tmp_path / "d" / "schema.msgpack").write_bytes(b"\xc1garbage")
    with pytest.raises(CorruptStoreError, match="msgpack"):
        DenseDataset(tmp_path / "d")


def test_a_record_that_does_not_match_the_schema_is_reported(tmp_path):
    from_numpy(tmp_path / "d", np.ones((4, 2), np.float32))
    with Zrecord(tmp_path / "d") as z:
        z.append(b"\0" * 4, [0])  # a 4-byte record in a dataset of 8-byte records
    with DenseDataset(tmp_path / "d") as ds:
        np.testing.assert_array_equal(ds[:4], np.ones((4, 2)))
        with pytest.raises(CorruptStoreError, match="record 4 holds 4 bytes"):
            ds[[0, 4]]


def test_ragged_dataset(tmp_path):
    rng = np.random.default_rng(4)
    recs = [rng.integers(0, 9, size=(int(k), 2)).astype(np.int8) for k in (3, 0, 5, 1)]
    from_iterator(tmp_path / "r", recs)
    with RaggedDataset(tmp_path / "r") as rs:
        assert len(rs) == 4 and rs.item_shape == (2,) and rs.dtype == np.int8
        np.testing.assert_array_equal(rs[-2], recs[2])
        got = rs[[2, 0, 1, 2]]
        assert isinstance(got, list) and len(got) == 4
        for g, k in zip(got, [2, 0, 1, 2], strict=True):
            np.testing.assert_array_equal(g, recs[k])
        assert got[0].base is not None and got[0].base is got[1].base  # views of one buffer
        assert rs[[]] == []
        np.testing.assert_array_equal(rs.lengths(slice(None)), [3, 0, 5, 1])
        with pytest.raises(IndexError):
            rs[4]


def test_pad():
    recs = [np.arange(3), np.arange(1), np.arange(4)]
    padded, lengths = pad(recs, pad_value=-1)
    np.testing.assert_array_equal(padded, [[0, 1, 2, -1], [0, -1, -1, -1], [0, 1, 2, 3]])
    np.testing.assert_array_equal(lengths, [3, 1, 4])
    padded, _ = pad(recs, max_len=6)
    assert padded.shape == (3, 6)
    with pytest.raises(ValueError, match="does not truncate"):
        pad(recs, max_len=3)
    with pytest.raises(ValueError, match="trailing shape"):
        pad([np.zeros((2, 2)), np.zeros((2, 3))])
    with pytest.raises(ValueError, match="at least one"):
        pad([])
    two_d, lens = pad([np.ones((2, 3), np.float32), np.zeros((0, 3), np.float32)])
    assert two_d.shape == (2, 2, 3) and two_d.dtype == np.float32 and list(lens) == [2, 0]
    many = [np.arange(k % 5, dtype=np.int16) for k in range(300)]  # more than NumPy's arg limit
    assert pad(many)[0].shape == (300, 4)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_ragged_round_trip_property(tmp_path_factory, data):
    lens = data.draw(st.lists(st.integers(0, 30), min_size=1, max_size=40))
    recs = [np.arange(k, dtype=np.float64) * (i + 1) for i, k in enumerate(lens)]
    path = tmp_path_factory.mktemp("r") / "r"
    from_iterator(path, recs, codec=data.draw(st.sampled_from(["raw", "zstd"])),
                  chunk_bytes=data.draw(st.integers(1, 500)))
    idx = data.draw(st.lists(st.integers(0, len(recs) - 1), max_size=20))
    with RaggedDataset(path) as rs:
        got = rs[idx]
        assert len(got) == len(idx)
        for g, i in zip(got, idx, strict=True):
            np.testing.assert_array_equal(g, recs[i])


# -- the reference's stores, through the dataset views --------------------------------------


def test_reference_fixtures_read_through_the_datasets(reference_stores, manifest):
    for name, info in manifest.items():
        path = reference_stores / name
        if info["kind"] == "dense":
            want = np.load(FIXTURES / f"{name}.expected.npy")
            with DenseDataset(path) as ds:
                assert ds.dtype == want.dtype and ds.item_shape == want.shape[1:]
                np.testing.assert_array_equal(ds[:], want)
                k = len(want) // 2
                np.testing.assert_array_equal(ds[k], want[k])
        elif info["kind"] == "ragged":
            with np.load(FIXTURES / f"{name}.expected.npz") as z:
                want = [z[f"arr_{i}"] for i in range(len(z.files))]
            with RaggedDataset(path) as rs:
                got = rs[:]
                assert len(got) == len(want)
                for g, w in zip(got, want, strict=True):
                    assert g.dtype == w.dtype
                    np.testing.assert_array_equal(g, w)
        else:
            with pytest.raises(DatasetError):
                DenseDataset(path)


SPAWN_AFTER_CHDIR = '''
import multiprocessing as mp
import os
import sys

import numpy as np

from loaderx import ConcatDataset, DenseDataset, RaggedDataset


def read(ds):
    if isinstance(ds, RaggedDataset):
        return [r.tolist() for r in ds[:]]
    return ds[:].tolist()


def settings(ds):
    return [part.verify_reads for part in ds.parts]


if __name__ == "__main__":
    here, elsewhere = sys.argv[1:3]
    os.chdir(here)
    opened = [DenseDataset("d"), RaggedDataset("r"), ConcatDataset(["d", "d"]),
              DenseDataset("d").subset([2, 0])]
    checked = ConcatDataset([DenseDataset("d", verify_reads=True), "d"])
    want = [read(ds) for ds in opened]
    os.chdir(elsewhere)  # holds datasets of the same names, with other records
    with mp.get_context("spawn").Pool(1) as pool:
        got = pool.map(read, opened)
        kept = pool.apply(settings, (checked,))
    assert got == want, (got, want)
    assert kept == [True, False], kept
    assert all(os.path.isabs(ds.path) for ds in opened[:2]), [ds.path for ds in opened]
    print("same")
'''


def test_a_spawn_worker_after_chdir_reads_the_same_datasets(tmp_path):
    """Datasets keep absolute paths: a spawn worker started after os.chdir into a directory with
    namesakes reads the parent's datasets (it read the namesakes, silently), and pickled
    settings (verify_reads of each part) survive."""
    for name, value in (("here", 1), ("elsewhere", 7)):
        from_numpy(tmp_path / name / "d", np.full((3, 2), value, np.int32))
        from_iterator(tmp_path / name / "r", [np.arange(value, dtype=np.int16)])
    script = tmp_path / "spawn_after_chdir.py"
    script.write_text(SPAWN_AFTER_CHDIR)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "here"),
                        str(tmp_path / "elsewhere")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "same"


def test_a_dataset_path_is_absolute(tmp_path, monkeypatch):
    from_numpy(tmp_path / "d", np.zeros(2, np.int8))
    monkeypatch.chdir(tmp_path)
    with DenseDataset("d") as ds:
        assert ds.path == str(tmp_path / "d") and not ds.verify_reads
        assert pickle.loads(pickle.dumps(ds)).path == str(tmp_path / "d")
