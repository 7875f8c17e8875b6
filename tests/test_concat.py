"""ConcatDataset: several stores of one schema as one index space, through the datasets' API
and the DataLoader, checked against NumPy concatenation."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaderx.concat import ConcatDataset
from loaderx.converter import from_iterator, from_numpy
from loaderx.dataloader import DataLoader
from loaderx.dataset import DenseDataset
from loaderx.errors import CorruptStoreError, DatasetError, LoaderxIndexError, StoreClosedError
from loaderx.sampler import Sampler
from loaderx.zrecord import Zrecord

SIZES = (7, 1, 30, 12)
PARTS = [np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3) + 1000 * k
         for k, n in enumerate(SIZES)]
ALL = np.concatenate(PARTS)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("concat")
    out = []
    for k, part in enumerate(PARTS):
        from_numpy(root / f"p{k}", part, codec="zstd" if k % 2 else "raw")
        out.append(root / f"p{k}")
    return out


@pytest.fixture(scope="module")
def view(paths):
    with ConcatDataset(paths) as ds:
        yield ds


def test_indexing_matches_numpy(view):
    assert len(view) == len(ALL) and view.dtype == ALL.dtype and view.item_shape == (2, 3)
    for idx in (0, 6, 7, 8, 37, 49, -1, -50, slice(None), slice(5, 40, 3), [49, 0, 7, 7, 8],
                np.array([[1, 2], [40, 9]]), ALL[:, 0, 0] % 2 == 0):
        np.testing.assert_array_equal(view[idx], ALL[idx])
    with pytest.raises(IndexError):
        view[len(ALL)]
    out = np.empty((3, 2, 3), np.float32)
    assert view.gather([48, 0, 20], out=out) is out
    np.testing.assert_array_equal(out, ALL[[48, 0, 20]])
    np.testing.assert_array_equal(view.__getitems__([3, 45]), ALL[[3, 45]])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(ALL) - 1), max_size=80))
def test_any_batch_matches_numpy(view, idx):
    np.testing.assert_array_equal(view.gather(np.array(idx, dtype=np.uint64)),
                                  ALL[np.array(idx, dtype=np.int64)].reshape(-1, 2, 3))


def test_loader_over_a_concatenation(view, paths):
    labels = ConcatDataset([p for p in paths])
    with DataLoader({"x": view, "same": labels}, batch_size=10, num_workers=3, seed=4,
                    mode="iid") as loader:
        sampler = Sampler(len(ALL), 10, "iid", 4)
        for step in range(20):
            batch = next(loader)
            idx = sampler.batch(step).astype(np.int64)
            np.testing.assert_array_equal(batch["x"], ALL[idx])
            np.testing.assert_array_equal(batch["same"], ALL[idx])
    labels.close()


def test_one_call_per_batch_refuses_what_a_part_would(paths):
    """The native concatenation (``_native.Across``) locates the batch itself: an index past
    the end is an index error before any row is written, negative ones count from the end as
    NumPy's do, and once a part is closed the view is closed: every read says so."""
    ds = ConcatDataset([DenseDataset(p) for p in paths])
    n = len(ds)
    np.testing.assert_array_equal(ds[np.array([n - 1, 0, -1], np.int64)], ALL[[n - 1, 0, -1]])
    out = np.full((2, *ds.item_shape), 7, ds.dtype)
    with pytest.raises(LoaderxIndexError, match=f"{n}"):
        ds.gather(np.array([0, n], np.uint64), out=out)
    assert (out == 7).all()
    ds.parts[-1].close()
    assert ds.closed
    with pytest.raises(StoreClosedError):
        ds[[0, 1]]
    ds.close()


def test_pickles_by_paths_and_checks_schemas(paths, tmp_path):
    ds = ConcatDataset(paths, verify_reads=True)
    clone = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(clone[[0, 49]], ALL[[0, 49]])
    assert all(p.store.verify_reads for p in clone.parts)
    clone.close()
    ds.close()
    assert ds.closed
    from_numpy(tmp_path / "other", np.zeros((3, 2, 3), np.float64))
    with pytest.raises(DatasetError, match="one schema"):
        ConcatDataset([paths[0], tmp_path / "other"])
    with pytest.raises(ValueError, match="non-empty"):
        ConcatDataset([])
    with pytest.raises(ValueError):
        ConcatDataset(str(paths[0]))


def test_ragged_parts(tmp_path):
    a = [np.arange(n, dtype=np.int64) for n in (3, 0, 2)]
    b = [np.arange(n, dtype=np.int64) * -1 for n in (4, 1)]
    from_iterator(tmp_path / "a", a)
    from_iterator(tmp_path / "b", b)
    with ConcatDataset([tmp_path / "a", tmp_path / "b"]) as ds:
        assert ds.kind == "ragged" and len(ds) == 5
        got = ds[[4, 0, 3]]
        for g, w in zip(got, [b[1], a[0], b[0]], strict=True):
            np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(ds[2], a[2])
        with pytest.raises(DatasetError, match="dense"):
            ds.gather([0])
        with DataLoader({"r": ds}, batch_size=2, mode="sequential") as loader:  # issue 20
            for g, w in zip(next(loader)["r"], [a[0], a[1]], strict=True):
                np.testing.assert_array_equal(g, w)


def test_open_datasets_can_be_parts(paths):
    parts = [DenseDataset(p) for p in paths]
    with ConcatDataset(parts) as ds:
        np.testing.assert_array_equal(ds[:], ALL)


def test_a_pickled_view_keeps_each_parts_verify_reads(tmp_path):
    """A part opened with verify_reads=True stays checked after pickling (the view reopened
    its parts with its own verify_reads, False, and read a damaged record silently)."""
    data = np.arange(40 * 8, dtype=np.int32).reshape(40, 8)
    from_numpy(tmp_path / "a", data, codec="raw", checksums=True)
    from_numpy(tmp_path / "b", data, codec="raw")
    with Zrecord(tmp_path / "a") as z:
        at = int(z.lengths(np.arange(5, dtype=np.uint64)).sum()) + 3  # inside record 5
    with open(tmp_path / "a" / "0.zr", "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x40]))
    view = ConcatDataset([DenseDataset(tmp_path / "a", verify_reads=True), tmp_path / "b"])
    for ds in (view, pickle.loads(pickle.dumps(view))):
        assert [p.verify_reads for p in ds.parts] == [True, False]
        with pytest.raises(CorruptStoreError, match="checksum"):
            ds[5]
        np.testing.assert_array_equal(ds[45], data[5])  # the unchecked part is intact
        ds.close()
    checked = ConcatDataset([tmp_path / "a"], verify_reads=True)
    clone = pickle.loads(pickle.dumps(checked))
    assert clone.verify_reads and clone.parts[0].verify_reads
    with pytest.raises(CorruptStoreError):
        clone[5]
    for ds in (checked, clone):
        ds.close()


RAGGED = [[np.arange(n, dtype=np.int32) + 100 * k for n in sizes]
          for k, sizes in enumerate([(3, 0, 2), (4, 1), (), (6, 6, 0, 1)])]


@pytest.fixture(scope="module")
def ragged(tmp_path_factory):
    root = tmp_path_factory.mktemp("ragged-concat")
    paths = []
    for k, part in enumerate(RAGGED):
        if not part:
            continue  # an empty part cannot be written; the others straddle it
        from_iterator(root / f"r{k}", part, codec="zstd" if k % 2 else "raw")
        paths.append(root / f"r{k}")
    with ConcatDataset(paths) as ds:
        yield ds


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 8), max_size=60))
def test_any_ragged_batch_matches_the_parts(ragged, idx):
    """One native call per batch (``lengths_across``, ``gather_across``) over every part."""
    flat = [r for part in RAGGED for r in part]
    got = ragged[np.array(idx, dtype=np.int64)]
    assert len(got) == len(idx)
    for g, i in zip(got, idx, strict=True):
        np.testing.assert_array_equal(g, flat[i])


def test_a_record_of_a_later_part_that_is_not_whole_rows_names_its_part(tmp_path):
    from_iterator(tmp_path / "a", [np.arange(3, dtype=np.int32)])
    from_iterator(tmp_path / "b", [np.arange(2, dtype=np.int32)])
    with Zrecord(tmp_path / "b") as z:  # 3 bytes in a store of 4-byte rows
        z.append(np.frombuffer(b"xyz", np.uint8), np.array([0], np.uint64))
    with ConcatDataset([tmp_path / "a", tmp_path / "b"]) as ds:
        with pytest.raises(CorruptStoreError, match=r"record 1 of .*b holds 3 bytes"):
            ds[[0, 2]]
