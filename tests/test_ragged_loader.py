"""Ragged streams in the DataLoader (issue 20): a ragged dataset, subset or concatenation is a
stream whose batch value is a list of arrays, one per record, views into one leased buffer;
every loader promise (step order, workers, epoch(), seek, state_dict, shards, readahead, errors)
holds for them. Also the companion-arrays hook of loaderx.source."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from loaderx import DataLoader
from loaderx.errors import LoaderxTypeError, LoaderxValueError

# -- the companion-arrays hook ------------------------------------------------------------------


class CompanionSource:
    """A dense in-memory stream that adds two arrays of its own to every batch: each row's
    record index and its value doubled (what a packed stream does with segment ids)."""

    kind = "dense"
    view_digest = ""
    recently_cold = False

    def __init__(self, array: np.ndarray, declare: bool = True,
                 names: tuple[str, ...] = ("idx", "twice")) -> None:
        self.array = np.ascontiguousarray(array)
        self.dtype = self.array.dtype
        self.item_shape = self.array.shape[1:]
        self.record_bytes = self.array[0].nbytes
        self.names = names
        self.calls = 0
        if declare:
            self.companion_names = self._declared

    def _declared(self, name: str) -> tuple[str, ...]:
        return tuple(f"{name}_{n}" for n in self.names)

    def __len__(self) -> int:
        return len(self.array)

    def gather_rows(self, idxs: np.ndarray, dst: np.ndarray, shards: int | None = None,
                    rows: np.ndarray | None = None) -> None:
        dst.view(self.dtype).reshape(-1, *self.item_shape)[:len(idxs)] = self.array[idxs]

    def prefetch(self, idxs: Any) -> bool:
        return False

    def companions(self, name: str, idxs: np.ndarray) -> dict[str, np.ndarray]:
        self.calls += 1
        assert idxs.dtype == np.uint64
        values = [idxs.astype(np.int64), self.array[idxs] * 2]
        return {f"{name}_{n}": v for n, v in zip(self.names, values, strict=False)}


VALUES = np.arange(30, dtype=np.int64) * 7


def check_companions(batch: dict[str, Any]) -> None:
    np.testing.assert_array_equal(batch["v"], VALUES[batch["v_idx"]])
    np.testing.assert_array_equal(batch["v_twice"], 2 * batch["v"])


@pytest.mark.parametrize("workers", [0, 1, 4])
def test_companions_join_every_batch_in_every_worker_count(workers):
    with DataLoader({"v": CompanionSource(VALUES)}, batch_size=4, num_workers=workers,
                    seed=1) as loader:
        batches = [next(loader) for _ in range(12)]
        for step, batch in enumerate(batches):
            assert set(batch) == {"v", "v_idx", "v_twice"}
            np.testing.assert_array_equal(batch["v_idx"], loader.batch_indices(step))
            check_companions(batch)
        loader.seek(3)
        np.testing.assert_array_equal(next(loader)["v_idx"], batches[3]["v_idx"])
    with DataLoader({"v": CompanionSource(VALUES)}, batch_size=4, num_workers=workers,
                    seed=1) as resumed:
        resumed.load_state_dict({**resumed.state_dict(), "step": 5})
        np.testing.assert_array_equal(next(resumed)["v_twice"], batches[5]["v_twice"])


def test_companions_see_the_transform_and_padded_rows():
    seen = []

    def transform(batch):
        seen.append(sorted(batch))
        return batch

    with DataLoader({"v": CompanionSource(VALUES)}, batch_size=8, num_workers=2,
                    transform=transform) as loader:
        batches = list(loader.epoch(pad=True))
    assert seen[0] == ["mask", "v", "v_idx", "v_twice"]  # merged before the transform
    last = batches[-1]  # 30 records: the last batch has 6 real rows and 2 repeated records
    np.testing.assert_array_equal(last["mask"], [True] * 6 + [False] * 2)
    np.testing.assert_array_equal(last["v_idx"], [24, 25, 26, 27, 28, 29, 0, 1])
    check_companions(last)


def test_companions_of_shards_concatenate_to_the_global_batch():
    def first(loader):
        return [next(loader) for _ in range(5)]

    with DataLoader({"v": CompanionSource(VALUES)}, batch_size=6, seed=2) as whole:
        glob = first(whole)
    parts = []
    for i in range(3):
        with DataLoader({"v": CompanionSource(VALUES)}, batch_size=6, seed=2, shard_index=i,
                        shard_count=3) as shard:
            parts.append(first(shard))
    for step in range(5):
        for key in ("v", "v_idx", "v_twice"):
            np.testing.assert_array_equal(
                np.concatenate([p[step][key] for p in parts]), glob[step][key])


def test_colliding_companion_names_are_refused_at_construction():
    plain = CompanionSource(VALUES)
    with pytest.raises(LoaderxValueError, match="also a stream's name"):
        DataLoader({"v": CompanionSource(VALUES), "v_idx": plain})
    with pytest.raises(LoaderxValueError, match="both add"):
        DataLoader({"v": CompanionSource(VALUES, names=("a",)),
                    "w": _renamed(CompanionSource(VALUES), "v_a")})
    with DataLoader({"v": CompanionSource(VALUES)}, batch_size=4) as loader:
        with pytest.raises(LoaderxValueError, match="companion"):
            loader.epoch(pad=True, mask_key="v_idx")


def _renamed(source: CompanionSource, fixed: str) -> CompanionSource:
    """A source whose companion is called ``fixed`` whatever the stream's name."""
    source.companion_names = lambda name: (fixed,)
    source.companions = lambda name, idxs: {fixed: idxs}
    return source


def test_undeclared_collisions_reach_the_consumer_at_their_step():
    sneaky = CompanionSource(VALUES, declare=False, names=("x",))  # adds "v_x"
    for workers in (0, 2):
        loader = DataLoader({"v": sneaky, "v_x": CompanionSource(VALUES)}, batch_size=4,
                            num_workers=workers)
        with loader, pytest.raises(LoaderxValueError, match="already has"):
            next(loader)

    class Bad(CompanionSource):
        def companions(self, name, idxs):
            return [idxs]

    with DataLoader({"v": Bad(VALUES)}, batch_size=4, num_workers=0) as loader:
        with pytest.raises(LoaderxTypeError, match="not a dict"):
            next(loader)
