"""The read-ahead prefetcher (loaderx.prefetch) keeps the training loop's place: its own
``step``/``state_dict()`` and the wrapped loader's ``state_dict()`` point at the next batch the
loop gets, not at the batches taken ahead. No framework needed: ``put`` is any function."""

from __future__ import annotations

import numpy as np
import pytest

from loaderx.converter import from_numpy
from loaderx.dataloader import DataLoader
from loaderx.dataset import DenseDataset
from loaderx.errors import LoaderxTypeError, LoaderxValueError
from loaderx.prefetch import Prefetcher

N = 60
DATA = np.arange(N, dtype=np.int64)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("prefetch") / "x"
    from_numpy(p, DATA)
    return p


def make_loader(path, **kwargs):
    return DataLoader({"x": DenseDataset(path)}, batch_size=4, seed=5, num_workers=2, **kwargs)


def rows(batch):
    return batch["x"].tolist()


def reference(path, steps):
    with make_loader(path) as loader:
        return [rows(next(loader)) for _ in range(steps)]


def copy(batch):
    return {k: np.array(v) for k, v in batch.items()}


@pytest.mark.parametrize("size", [1, 2, 5])
def test_checkpoint_inside_the_loop_resumes_at_the_next_untrained_batch(path, size):
    """The finding: with size=k the loader had handed out k-1 batches more than the loop
    trained, and loader.state_dict() pointed past them."""
    want = reference(path, 12)
    with make_loader(path) as loader:
        batches = Prefetcher(loader, copy, size=size)
        trained = [rows(next(batches)) for _ in range(7)]
        assert loader.step == 7 + size - 1  # what was taken ahead
        state, through_prefetcher = loader.state_dict(), batches.state_dict()
        assert batches.step == 7 and state["step"] == 7 and through_prefetcher == state
    with make_loader(path) as resumed:
        resumed.load_state_dict(state)
        rest = [rows(b) for b, _ in zip(Prefetcher(resumed, copy, size=size), range(5),
                                        strict=False)]
    assert trained + rest == want


def test_close_hands_the_held_batches_back(path):
    want = reference(path, 8)
    with make_loader(path) as loader:
        with Prefetcher(loader, copy, size=4) as batches:
            got = [rows(next(batches)) for _ in range(3)]
            assert loader.step == 6
        assert loader.step == 3 and loader.state_dict()["step"] == 3
        got += [rows(next(loader)) for _ in range(5)]
        with pytest.raises(StopIteration):
            next(batches)
    assert got == want


def test_moving_the_loader_drops_the_held_batches(path):
    want = reference(path, 20)
    with make_loader(path) as loader:
        batches = Prefetcher(loader, copy, size=3)
        assert rows(next(batches)) == want[0]
        loader.seek(10)  # as a resume through the loader would
        assert batches.step == 10 and loader.state_dict()["step"] == 10
        assert rows(next(batches)) == want[10]
        # Seeking to exactly where the prefetcher had read up to still drops what it holds.
        loader.seek(loader.step)
        assert rows(next(batches)) == want[13]
        batches.seek(2)
        assert [rows(next(batches)) for _ in range(2)] == want[2:4]
        batches.load_state_dict({**loader.state_dict(), "step": 0})
        assert rows(next(batches)) == want[0]
        # Batches taken from the loader by someone else: the prefetcher follows the loader.
        next(loader)
        assert batches.step == loader.step == 4
        assert rows(next(batches)) == want[4]


def test_a_failing_put_skips_no_batch(path):
    want = reference(path, 8)
    calls = []

    def put(batch):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("device out of memory")
        return copy(batch)

    with make_loader(path) as loader:
        batches = Prefetcher(loader, put, size=3)
        got = [rows(next(batches))]  # takes 0, 1, 2
        with pytest.raises(RuntimeError, match="out of memory"):
            next(batches)  # taking 3 fails: the loader is rewound to 1, the first not delivered
        assert loader.step == 1 and batches.step == 1
        got += [rows(next(batches)) for _ in range(7)]
    assert got == want


def test_a_dropped_prefetcher_no_longer_counts(path):
    import gc

    with make_loader(path) as loader:
        batches = Prefetcher(loader, copy, size=3)
        next(batches)
        assert loader.state_dict()["step"] == 1
        del batches
        gc.collect()
        # Nobody holds the batches taken ahead any more: the loader's next batch is its step.
        assert loader.state_dict()["step"] == loader.step == 3


def test_finite_passes_and_plain_iterables(path):
    with make_loader(path) as loader:
        passed = Prefetcher(loader.epoch(), copy, size=3)
        assert [rows(b) for b in passed] == [DATA[i:i + 4].tolist() for i in range(0, N, 4)]
        assert passed.step == N // 4
    plain = Prefetcher(iter(range(5)), lambda v: v * 10, size=2)
    assert list(plain) == [0, 10, 20, 30, 40]
    with pytest.raises(LoaderxTypeError, match="no step"):
        _ = plain.step
    with pytest.raises(LoaderxTypeError, match="state_dict"):
        plain.state_dict()
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(LoaderxValueError, match="size"):
            Prefetcher([], copy, size=bad)
