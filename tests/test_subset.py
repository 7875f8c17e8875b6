"""Subset views and seeded splits, against NumPy indexing of the same arrays."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaderx import DataLoader, from_iterator, from_numpy, split
from loaderx.concat import ConcatDataset
from loaderx.dataset import DenseDataset, RaggedDataset
from loaderx.errors import LoaderxValueError
from loaderx.subset import Subset

DATA = np.arange(120 * 6, dtype=np.float32).reshape(120, 2, 3)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    root = tmp_path_factory.mktemp("subset")
    from_numpy(root / "d", DATA)
    ds = DenseDataset(root / "d")
    yield ds
    ds.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 119), min_size=1, max_size=40),
       st.lists(st.integers(-50, 49), min_size=1, max_size=20))
def test_a_subset_indexes_like_numpy(dense, indices, queries):
    sub = dense.subset(indices)
    want = DATA[indices]
    assert len(sub) == len(want)
    queries = [q % len(want) - (len(want) if q < 0 else 0) for q in queries]
    np.testing.assert_array_equal(sub[queries], want[queries])
    np.testing.assert_array_equal(sub[queries[0]], want[queries[0]])
    np.testing.assert_array_equal(sub[:], want)
    np.testing.assert_array_equal(sub.gather(np.array([len(want) - 1], np.uint64)), want[-1:])
    nested = sub.subset(slice(None, None, 2))
    np.testing.assert_array_equal(nested[:], want[::2])
    assert nested.dataset is dense


def test_ragged_and_concatenated_subsets(tmp_path):
    recs = [np.arange(n, dtype=np.int16) for n in (3, 0, 5, 1, 4)]
    from_iterator(tmp_path / "r", recs)
    sub = RaggedDataset(tmp_path / "r").subset([4, 0, 2])
    got = sub[:]
    assert [list(a) for a in got] == [list(recs[i]) for i in (4, 0, 2)]
    from_numpy(tmp_path / "a", DATA[:50])
    from_numpy(tmp_path / "b", DATA[50:])
    both = ConcatDataset([tmp_path / "a", tmp_path / "b"]).subset([49, 50, 119, 0])
    np.testing.assert_array_equal(both[:], DATA[[49, 50, 119, 0]])


def test_subsets_pickle_by_path_and_indices(dense):
    sub = dense.subset(np.arange(10, 60, 7))
    again = pickle.loads(pickle.dumps(sub))
    np.testing.assert_array_equal(again[:], sub[:])
    np.testing.assert_array_equal(again.indices, sub.indices)


def test_bad_subsets_are_refused(dense):
    with pytest.raises(IndexError):
        dense.subset([0, 120])
    with pytest.raises(IndexError):
        dense.subset([0.5])
    with pytest.raises(IndexError):
        dense.subset([1, 2])[2]
    with pytest.raises(ValueError, match="fractions"):
        split(dense, [0.8, 0.3])
    with pytest.raises(ValueError, match="fractions"):
        split(dense, [0.5, 0])


@pytest.mark.parametrize("fractions", [[0.8, 0.2], [0.7, 0.2, 0.1], [0.5, 0.25]])
def test_split_is_disjoint_seeded_and_sized(dense, fractions):
    parts = split(dense, fractions, seed=7)
    sizes = [len(p) for p in parts]
    assert all(abs(s - f * len(dense)) <= 1 for s, f in zip(sizes, fractions, strict=True))
    flat = np.concatenate([p.indices for p in parts])
    assert len(np.unique(flat)) == len(flat), "disjoint"
    if abs(sum(fractions) - 1) < 1e-9:
        assert sorted(flat) == list(range(len(dense)))
    assert all((np.diff(p.indices.astype(np.int64)) > 0).all() for p in parts)
    again = split(dense, fractions, seed=7)
    assert all((a.indices == b.indices).all() for a, b in zip(parts, again, strict=True))
    other = split(dense, fractions, seed=8)
    assert any((a.indices != b.indices).any() for a, b in zip(parts, other, strict=True))


def test_a_loader_over_subsets(dense, tmp_path):
    """Subsets are dense streams: batches hold the subset's records, a finite pass reads each
    once, and a checkpoint taken on one split is refused on another."""
    train, val = split(dense, [0.75, 0.25], seed=3)
    with DataLoader({"x": train}, batch_size=10, num_workers=2, seed=1) as loader:
        batch = next(loader)["x"]
        idx = loader.batch_indices(0).astype(np.int64)
        np.testing.assert_array_equal(batch, DATA[train.indices[idx]])
        state = loader.state_dict()
        evaluated = np.concatenate([b["x"] for b in loader.epoch()])
        np.testing.assert_array_equal(evaluated, DATA[train.indices])
    with DataLoader({"x": train}, batch_size=10, seed=1) as same:
        same.load_state_dict(state)
        np.testing.assert_array_equal(next(same)["x"],
                                      DATA[train.indices[loader.batch_indices(1).astype(int)]])
    other, _ = split(dense, [0.75, 0.25], seed=4)
    with DataLoader({"x": other}, batch_size=10, seed=1) as different:
        with pytest.raises(ValueError, match="other subsets"):
            different.load_state_dict(state)
    assert isinstance(train, Subset) and train.kind == "dense"


def test_split_of_aligned_streams_keeps_records_paired(dense, tmp_path):
    """split({"x": x, "y": y}, ...) cuts every stream at the same indices: each part is a dict
    of subsets whose records stay paired (two separate calls with different seeds paired
    images with other images' labels, silently)."""
    labels = np.arange(120, dtype=np.int64) * 3
    from_numpy(tmp_path / "y", labels)
    y = DenseDataset(tmp_path / "y")
    parts = split({"x": dense, "y": y}, [0.8, 0.2], seed=5)
    assert [sorted(p) for p in parts] == [["x", "y"], ["x", "y"]]
    assert [len(p["x"]) for p in parts] == [96, 24]
    alone = split(dense, [0.8, 0.2], seed=5)
    for part, single in zip(parts, alone, strict=True):
        assert isinstance(part["x"], Subset) and isinstance(part["y"], Subset)
        np.testing.assert_array_equal(part["x"].indices, part["y"].indices)
        np.testing.assert_array_equal(part["x"].indices, single.indices)  # the same cut
        np.testing.assert_array_equal(part["y"][:], labels[part["x"].indices.astype(int)])
    (train, _) = parts
    with DataLoader(train, batch_size=16, seed=2, num_workers=1) as loader:
        batch = next(loader)
        np.testing.assert_array_equal(batch["y"], batch["x"][:, 0, 0].astype(np.int64) // 2)
    from_numpy(tmp_path / "short", labels[:100])
    with pytest.raises(LoaderxValueError, match="one length"):
        split({"x": dense, "y": DenseDataset(tmp_path / "short")}, [0.5, 0.5])
    with pytest.raises(LoaderxValueError, match="empty"):
        split({}, [0.5, 0.5])
    y.close()
