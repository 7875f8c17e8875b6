"""The dense-source protocol (loaderx.source) is all the DataLoader needs of a stream: a
NumPy-backed source written from the protocol's documentation alone loads like a store."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from loaderx import (
    ConcatDataset,
    DataLoader,
    DenseDataset,
    RaggedDataset,
    from_iterator,
    from_numpy,
)
from loaderx.errors import LoaderxIndexError, LoaderxTypeError
from loaderx.source import DenseSource, RaggedSource, is_dense_source, is_ragged_source


class ArraySource:
    """The protocol over an in-memory array."""

    kind = "dense"
    view_digest = ""
    recently_cold = False

    def __init__(self, array: np.ndarray) -> None:
        self.array = np.ascontiguousarray(array)
        self.dtype = self.array.dtype
        self.item_shape = self.array.shape[1:]
        self.record_bytes = self.array[0].nbytes

    def __len__(self) -> int:
        return len(self.array)

    def gather_rows(self, idxs: np.ndarray, dst: np.ndarray, shards: int | None = None,
                    rows: np.ndarray | None = None) -> None:
        if len(idxs) and int(idxs.max()) >= len(self):
            raise LoaderxIndexError("out of range")
        out = dst.view(self.dtype).reshape(-1, *self.item_shape)
        out[np.arange(len(idxs)) if rows is None else rows] = self.array[idxs]

    def prefetch(self, idxs: Any) -> bool:
        return False


def test_a_source_written_from_the_protocol_loads_like_a_store(tmp_path):
    data = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    from_numpy(tmp_path / "d", data)
    mine = ArraySource(data)
    assert isinstance(mine, DenseSource) and is_dense_source(mine)
    with DataLoader({"a": mine, "b": DenseDataset(tmp_path / "d")}, batch_size=8,
                    num_workers=2, seed=3) as loader:
        for _ in range(20):
            batch = next(loader)
            np.testing.assert_array_equal(batch["a"], batch["b"])
        pass_rows = [b["a"] for b in loader.epoch()]
    np.testing.assert_array_equal(np.concatenate(pass_rows), data)


def test_the_store_views_implement_the_dense_or_the_ragged_protocol(tmp_path):
    from_numpy(tmp_path / "d", np.arange(12, dtype=np.int16).reshape(6, 2))
    from_iterator(tmp_path / "r", [np.arange(i) for i in range(1, 5)])
    dense = DenseDataset(tmp_path / "d")
    for view in (dense, ConcatDataset([dense, dense]), dense.subset([0, 2])):
        assert is_dense_source(view), type(view).__name__
    ragged = RaggedDataset(tmp_path / "r")
    for view in (ragged, ragged.subset([1]), ConcatDataset([ragged, ragged])):
        assert not is_dense_source(view) and is_ragged_source(view), type(view).__name__
        assert isinstance(view, RaggedSource)
        with DataLoader({"x": view}, batch_size=1, mode="sequential") as loader:
            np.testing.assert_array_equal(next(loader)["x"][0], view[0])
    with pytest.raises(LoaderxTypeError, match="loaderx.source"):
        DataLoader({"x": np.arange(4)}, batch_size=1)


def test_a_batch_across_parts_lands_in_its_rows(tmp_path):
    """ConcatDataset hands each part its records and their rows of the one batch array."""
    parts = [np.arange(i * 100, i * 100 + 30, dtype=np.int64).reshape(10, 3) for i in range(3)]
    for i, p in enumerate(parts):
        from_numpy(tmp_path / f"p{i}", p)
    cat = ConcatDataset([tmp_path / f"p{i}" for i in range(3)])
    whole = np.concatenate(parts)
    idx = np.random.default_rng(1).integers(0, 30, 64).astype(np.uint64)
    dst = np.zeros(64 * cat.record_bytes, np.uint8)
    cat.gather_rows(idx, dst)
    np.testing.assert_array_equal(dst.view(np.int64).reshape(64, 3), whole[idx])
    # Into chosen rows of a bigger array, through a subset of the concatenation.
    sub = cat.subset(np.arange(29, -1, -1))
    dst = np.full(8 * cat.record_bytes, 0xFF, np.uint8)
    sub.gather_rows(np.array([0, 15, 29], np.uint64), dst, rows=np.array([1, 4, 7], np.uint64))
    got = dst.view(np.int64).reshape(8, 3)
    np.testing.assert_array_equal(got[[1, 4, 7]], whole[[29, 14, 0]])
    assert (got[[0, 2, 3, 5, 6]] == -1).all(), "other rows untouched"
    with pytest.raises(LoaderxIndexError):
        sub.gather_rows(np.array([30], np.uint64), dst)
