"""Thread stress: one store, one dataset and one loader hammered from many threads at once.

The native module declares ``gil_used = false``; on the GIL build these threads still overlap
inside every native call (each releases the GIL), which is where a data race would be. The same
test is the one to run under a free-threaded interpreter (see docs/guide/workers.md,
"Free-threaded Python").
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np

import reliability as rel
from loaderx.converter import from_numpy
from loaderx.dataloader import DataLoader
from loaderx.dataset import DenseDataset
from loaderx.errors import StoreBusyError
from loaderx.sampler import Sampler
from loaderx.zrecord import Zrecord

SECONDS = 2.0
N = 2000
ROWS = (np.arange(N * 16, dtype=np.int64).reshape(N, 16) * 3) % 1009
#: The calls the threads count; each must have been made a few times.
KINDS = ("store", "dataset", "loader", "append", "busy")


def test_many_threads_on_one_store_dataset_and_loader(tmp_path):
    z = Zrecord(tmp_path / "store", codec="zstd")
    z.append(*rel.pack([rel.make_record(i) for i in range(300)]))
    from_numpy(tmp_path / "ds", ROWS, codec="zstd", checksums=True)
    ds = DenseDataset(tmp_path / "ds", verify_reads=True)
    loader = DataLoader({"x": ds}, batch_size=32, num_workers=3, seed=11)
    stop = threading.Event()
    problems: list[str] = []
    counts = {"store": 0, "dataset": 0, "loader": 0, "append": 0, "busy": 0}
    taken: list[tuple[int, np.ndarray]] = []
    append_lock = threading.Lock()
    next_index = [300]

    def guard(fn):
        """Runs ``fn`` until stopped. A StoreBusyError (any call while a compact runs, or a
        compact while calls are in flight) is the documented outcome of the race: counted, and
        the loop goes on; anything else is a problem."""
        def run(seed: int) -> None:
            while not stop.is_set():
                try:
                    fn(seed)
                    return
                except StoreBusyError:
                    counts["busy"] += 1
                except BaseException as e:  # reported below
                    problems.append(f"{fn.__name__}: {type(e).__name__}: {e}")
                    return
        return run

    @guard
    def store_reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            idx = rng.integers(0, len(z), 50).astype(np.uint64)
            for i, rec in zip(idx, rel.read_records(z, idx), strict=True):
                p = rel.check_record(int(i), rec)
                if p:
                    problems.append(p)
            z.lengths(idx)
            z.stats()
            counts["store"] += 1

    @guard
    def store_writer(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            with append_lock:
                first = next_index[0]
                k = rng.randrange(1, 20)
                got = z.append(*rel.pack([rel.make_record(first + j) for j in range(k)]))
                next_index[0] += k
            if got != first:
                problems.append(f"append at {got}, expected {first}")
            counts["append"] += 1
            if rng.random() < 0.2:
                z.sync()
            if rng.random() < 0.2:
                z.compact()  # beside readers: refused cleanly, or runs alone

    @guard
    def dataset_reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            idx = rng.integers(-N, N, 40)
            np.testing.assert_array_equal(ds[idx], ROWS[idx])
            s = slice(int(rng.integers(0, N)), None, int(rng.integers(1, 50)))
            np.testing.assert_array_equal(ds[s], ROWS[s])
            counts["dataset"] += 1

    @guard
    def loader_consumer(seed: int) -> None:
        while not stop.is_set():
            batch = next(loader)["x"]
            taken.append((threading.get_ident(), batch.copy()))
            counts["loader"] += 1

    threads = [threading.Thread(target=f, args=(s,))
               for s, f in enumerate([store_reader] * 4 + [store_writer] * 2
                                     + [dataset_reader] * 4 + [loader_consumer] * 4)]
    for t in threads:
        t.start()
    # SECONDS at least, then on until every kind of call was made a few times (a loaded machine
    # makes the run longer, not thinner) or a thread reported a problem; a run that makes no
    # progress gives up after rel.HANG_SECONDS more and fails on the counts below.
    start = time.monotonic()
    while not problems:
        elapsed = time.monotonic() - start
        if elapsed >= SECONDS and min(counts[k] for k in KINDS) > 5:
            break
        if elapsed > SECONDS + rel.HANG_SECONDS:
            break
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join(30)
    loader.close()
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert problems == [], problems[:5]
    assert min(counts[k] for k in KINDS) > 5, counts

    # Consumers raced on one loader: together they got each step exactly once, in any order.
    sampler = Sampler(N, 32, "cyclic", 11)
    expected = {ROWS[sampler.batch(s).astype(np.int64)].tobytes() for s in range(len(taken))}
    assert {b.tobytes() for _, b in taken} == expected
    assert len(taken) == len(expected)
    assert rel.verify_store(z) == []
    assert len(z) == next_index[0]
    z.close()
    ds.close()
