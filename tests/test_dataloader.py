"""The DataLoader: batches against a reference model (sampler indices gathered by NumPy), order
and determinism across worker counts, resume, lifecycle, error delivery and buffer recycling."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time
import traceback

import numpy as np
import pytest

from loaderx.converter import from_iterator, from_numpy
from loaderx.dataloader import DataLoader
from loaderx.dataset import DenseDataset, RaggedDataset
from loaderx.errors import AppendWarning, LoaderClosedError
from loaderx.sampler import Sampler

N = 103
DATA = (np.arange(N * 6, dtype=np.float32) * 0.5).reshape(N, 2, 3)
LABEL = np.arange(N, dtype=np.int64) * 11


@pytest.fixture(scope="module")
def streams(tmp_path_factory):
    root = tmp_path_factory.mktemp("streams")
    from_numpy(root / "data", DATA, codec="zstd")
    from_numpy(root / "label", LABEL, codec="raw")
    s = {"data": DenseDataset(root / "data"), "label": DenseDataset(root / "label")}
    yield s
    for ds in s.values():
        ds.close()


def expected(step: int, batch_size: int, mode, seed) -> dict[str, np.ndarray]:
    idx = Sampler(N, batch_size, mode, seed).batch(step).astype(np.int64)
    return {"data": DATA[idx], "label": LABEL[idx]}


def take(loader: DataLoader, n: int) -> list[dict[str, np.ndarray]]:
    return [next(loader) for _ in range(n)]


#: Seconds to wait for what must happen: only a hang gets near it, not a loaded machine (this
#: suite runs on 2 cores under load averages far above 2, so no test times anything).
DEADLINE = 60.0


def eventually(condition, what: str) -> None:
    """Waits until ``condition()`` is true; fails, saying ``what`` did not happen, only after
    :data:`DEADLINE`."""
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen in {DEADLINE:.0f} s")
        time.sleep(0.005)


def without_hanging(call):
    """``call()`` on a helper thread: its result, or its exception re-raised here; fails
    instead of hanging the suite when it does not return within :data:`DEADLINE`."""
    result = {}

    def run():
        try:
            result["value"] = call()
        except BaseException as e:  # re-raised in the test's thread
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(DEADLINE)
    if t.is_alive():
        pytest.fail(f"the call did not return in {DEADLINE:.0f} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


@pytest.mark.parametrize("mode", ["cyclic", "iid", "sequential", 0, 1, 2])
@pytest.mark.parametrize("workers", [1, 3, 8])
def test_batches_match_the_model_in_step_order(streams, mode, workers):
    with DataLoader(streams, batch_size=10, num_workers=workers, prefetch_size=2, mode=mode,
                    seed=5) as loader:
        for step, batch in enumerate(take(loader, 25)):
            want = expected(step, 10, mode, 5)
            assert set(batch) == {"data", "label"}
            assert batch["data"].shape == (10, 2, 3) and batch["data"].dtype == np.float32
            np.testing.assert_array_equal(batch["data"], want["data"])
            np.testing.assert_array_equal(batch["label"], want["label"])
        assert loader.step == 25


def test_cyclic_is_the_default_and_covers_evenly(streams):
    with DataLoader(streams, batch_size=10) as loader:
        assert loader.mode.name == "CYCLIC"
        seen = np.concatenate([b["label"] // 11 for b in take(loader, N // 10)])
    assert len(set(seen.tolist())) == len(seen) == (N // 10) * 10


def test_same_seed_same_batches_any_worker_count(streams):
    runs = []
    for workers in (1, 2, 5):
        with DataLoader(streams, batch_size=7, num_workers=workers, seed=123) as loader:
            runs.append(np.stack([b["label"] for b in take(loader, 30)]))
    assert all((r == runs[0]).all() for r in runs)
    with DataLoader(streams, batch_size=7, seed=124) as other:
        assert not (np.stack([b["label"] for b in take(other, 30)]) == runs[0]).all()


def test_seek_start_step_and_resume(streams):
    with DataLoader(streams, batch_size=8, seed=9, num_workers=3) as full:
        reference = [b["label"] for b in take(full, 40)]
    with DataLoader(streams, batch_size=8, seed=9, start_step=17) as late:
        assert late.step == 17
        np.testing.assert_array_equal(next(late)["label"], reference[17])
        late.seek(3)
        np.testing.assert_array_equal(next(late)["label"], reference[3])
        assert late.step == 4
    # Interrupted run: checkpoint at step 12, a new loader resumes from it.
    with DataLoader(streams, batch_size=8, seed=9, num_workers=2) as first:
        take(first, 12)
        state = first.state_dict()
    assert state["step"] == 12 and state["length"] == N and state["mode"] == 2  # cyclic
    with DataLoader(streams, batch_size=8, seed=9, num_workers=4) as resumed:
        resumed.load_state_dict(state)
        for step in range(12, 40):
            np.testing.assert_array_equal(next(resumed)["label"], reference[step])


def test_state_from_another_configuration_or_changed_data_is_refused(streams, tmp_path):
    with DataLoader(streams, batch_size=8, seed=9) as loader:
        state = loader.state_dict()
    with DataLoader(streams, batch_size=8, seed=10) as other:
        with pytest.raises(ValueError, match="seed"):
            other.load_state_dict(state)
    # The store grew since the checkpoint.
    from_numpy(tmp_path / "x", DATA)
    from_numpy(tmp_path / "y", LABEL)
    from_numpy(tmp_path / "x", DATA[:1], append=True)
    from_numpy(tmp_path / "y", LABEL[:1], append=True)
    grown = {"data": DenseDataset(tmp_path / "x"), "label": DenseDataset(tmp_path / "y")}
    with DataLoader(grown, batch_size=8, seed=9) as loader:
        with pytest.raises(ValueError, match="data changed"):
            loader.load_state_dict(state)
        assert loader.step == 0


def test_construction_errors(streams, tmp_path):
    from_numpy(tmp_path / "short", LABEL[:50])
    short = DenseDataset(tmp_path / "short")
    with pytest.raises(ValueError, match="same length"):
        DataLoader({"a": streams["data"], "b": short})
    with pytest.raises(TypeError, match="a stream is"):
        DataLoader({"r": [np.arange(3)]})
    with pytest.raises(ValueError):
        DataLoader({})
    with pytest.raises(ValueError, match="mode"):
        DataLoader(streams, mode="shuffle")
    with DataLoader(streams, mode="cyclic", batch_size=N + 1) as too_big:
        with pytest.raises(ValueError, match="batch_size"):  # the endless loader cannot draw it
            next(too_big)
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(streams, num_workers=-1)
    with pytest.raises(TypeError):
        DataLoader(streams, 32)  # keyword-only after streams
    with DataLoader(streams, batch_size=4) as loader:
        with pytest.raises(TypeError, match="endless"):
            len(loader)


def test_transform_runs_on_prefetch_threads(streams):
    names = set()

    def collate(batch):
        names.add(threading.current_thread().name)
        return {"x": batch["data"].reshape(len(batch["data"]), -1) * 2, "y": batch["label"]}

    with DataLoader(streams, batch_size=5, transform=collate, seed=1) as loader:
        b = next(loader)
        want = expected(0, 5, "cyclic", 1)
        np.testing.assert_array_equal(b["x"], want["data"].reshape(5, -1) * 2)
    assert names and all(n.startswith("loaderx-prefetch") for n in names)


class Boom(Exception):
    pass


def test_transform_error_reaches_the_consumer_with_its_traceback(streams):
    def collate(batch):
        raise Boom("bad batch in collate")

    loader = DataLoader(streams, batch_size=4, transform=collate)
    with pytest.raises(Boom, match="bad batch in collate") as info:
        without_hanging(lambda: next(loader))
    frames = [f.name for f in info.traceback]
    assert "collate" in frames
    assert loader.closed
    with pytest.raises(LoaderClosedError):
        next(loader)


def test_errors_arrive_in_step_order(streams):
    # In sequential mode batch k starts at record 4k, so a batch tells its own step.
    def tagged(batch):
        step = int(batch["label"][0] // 11) // 4
        if step == 6:
            raise Boom(f"step {step}")
        return step

    with DataLoader(streams, batch_size=4, mode="sequential", num_workers=4,
                    transform=tagged) as loader:
        assert [next(loader) for _ in range(6)] == list(range(6))
        with pytest.raises(Boom, match="step 6"):
            next(loader)


def test_a_stop_iteration_in_the_transform_does_not_end_a_for_loop(streams):
    """Raised from next() a StopIteration would end `for batch in loader` silently, as if the
    endless data had run out; the consumer gets a RuntimeError instead, as PEP 479 does."""
    def tagged(batch):
        step = int(batch["label"][0] // 11) // 4  # sequential: batch k starts at record 4k
        if step == 3:
            raise StopIteration("no more ideas")
        return step

    seen = []
    loader = DataLoader(streams, batch_size=4, mode="sequential", num_workers=3,
                        transform=tagged)
    with pytest.raises(RuntimeError, match="transform raised StopIteration at step 3") as info:
        for step in loader:
            seen.append(step)
    assert seen == [0, 1, 2]
    cause = info.value.__cause__
    assert isinstance(cause, StopIteration) and cause.args == ("no more ideas",)
    assert "tagged" in [f.f_code.co_name for f, _ in traceback.walk_tb(cause.__traceback__)]
    assert loader.closed


def test_a_stop_iteration_while_building_a_batch_is_an_error_too(streams):
    loader = DataLoader(streams, batch_size=4, num_workers=2)
    stream = loader._pipe.builder.streams[0]

    class Exhausted:
        """The stream, with a gather that raises StopIteration."""

        def __getattr__(self, name):
            return getattr(stream.ds, name)

        def gather_rows(self, *args):
            raise StopIteration

    loader._pipe.builder.streams[0] = stream._replace(ds=Exhausted())
    with pytest.raises(RuntimeError, match="building the batch raised StopIteration at step 0") \
            as info:
        for _ in loader:
            pass
    assert isinstance(info.value.__cause__, StopIteration)


class InterruptOnce(threading.Condition):
    """The pipeline's condition, made to raise KeyboardInterrupt once when ``armed``, in the
    consuming thread, at the place ``where`` names: as a signal handler running there would
    (they run in the main thread, between bytecodes of this Python-level code)."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where
        self.armed = False
        self.consumer = threading.current_thread()

    def _fire(self, where: str) -> None:
        if self.armed and where == self.where and threading.current_thread() is self.consumer:
            self.armed = False
            raise KeyboardInterrupt(where)

    def __enter__(self):
        held = super().__enter__()
        self._fire("__enter__, lock taken")
        return held

    def __exit__(self, *exc):
        self._fire("__exit__, lock held")
        released = super().__exit__(*exc)
        self._fire("__exit__, lock released")
        return released

    def wait(self, timeout=None):
        self._fire("wait")
        return super().wait(timeout)

    def notify_all(self):
        super().notify_all()
        self._fire("notify_all")


def interruptible_loader(streams, where: str, **kw) -> tuple[DataLoader, InterruptOnce]:
    loader = DataLoader(streams, batch_size=8, num_workers=2, seed=4, mode="iid", **kw)
    # Replaced before the first next(), which starts the workers: everyone uses this one.
    cond = loader._pipe.cond = InterruptOnce(where)
    return loader, cond


def interrupt_the_fourth_next(loader, cond) -> None:
    """Takes steps 0-2, then interrupts the next() that would deliver step 3 where ``cond`` is
    armed; the loader must still be at step 3, with its lock free."""
    for step in range(3):
        np.testing.assert_array_equal(next(loader)["label"], expected(step, 8, "iid", 4)["label"])
    cond.armed = True
    with pytest.raises(KeyboardInterrupt):
        next(loader)
    assert not cond.armed, "the interrupt was raised where the test meant it"
    assert not cond._is_owned(), "the interrupted next() left the lock held"
    assert loader.step == 3 and loader.state_dict()["step"] == 3


@pytest.mark.parametrize("where", ["notify_all", "__exit__, lock held",
                                   "__exit__, lock released"])
def test_an_interrupt_after_the_step_was_taken_does_not_lose_it(streams, where):
    loader, cond = interruptible_loader(streams, where)
    with loader:
        # Step 3 was taken from the queue but never delivered: it is still the next one.
        interrupt_the_fourth_next(loader, cond)
        for step in range(3, 12):
            np.testing.assert_array_equal(without_hanging(lambda: next(loader))["label"],
                                          expected(step, 8, "iid", 4)["label"])
        assert loader.step == 12


@pytest.mark.parametrize("where", ["wait", "__enter__, lock taken"])
def test_an_interrupt_before_the_step_was_taken_loses_nothing(streams, where):
    gate = threading.Event()

    def slow_step_3(batch):
        if (batch["label"] == expected(3, 8, "iid", 4)["label"]).all():
            gate.wait()  # the consumer now has to wait for step 3
        return batch

    loader, cond = interruptible_loader(streams, where, transform=slow_step_3)
    with loader:
        interrupt_the_fourth_next(loader, cond)
        gate.set()
        for step in range(3, 12):
            np.testing.assert_array_equal(without_hanging(lambda: next(loader))["label"],
                                          expected(step, 8, "iid", 4)["label"])


def test_gather_error_reaches_the_consumer(tmp_path):
    from_numpy(tmp_path / "d", np.ones((20, 4), np.float32))
    ds = DenseDataset(tmp_path / "d")
    loader = DataLoader({"d": ds}, batch_size=4)
    ds.close()  # the gather on the prefetch thread fails
    with pytest.raises(Exception, match="closed"):
        next(loader)
    assert loader.closed


def test_close_ends_the_threads_even_when_the_queue_is_full(streams):
    before = threading.active_count()
    loader = DataLoader(streams, batch_size=4, num_workers=4, prefetch_size=2)
    next(loader)
    pipe = loader._pipe
    threads = list(pipe.threads)

    def all_waiting() -> bool:
        with pipe.cond:  # the window is full and every worker waits on the condition
            return len(pipe.ready) == pipe.window and len(pipe.cond._waiters) == len(threads)

    eventually(all_waiting, "every worker waiting on a full window")
    without_hanging(loader.close)
    # close() wakes the waiting workers; each ends on its own (a worker still waiting after
    # close() would never end, and fails this after DEADLINE).
    eventually(lambda: not any(t.is_alive() for t in threads), "the workers ending")
    assert threading.active_count() == before
    assert not streams["data"].closed, "close() leaves the datasets open"
    loader.close()


def test_a_slow_consumer_and_early_stop(streams):
    with DataLoader(streams, batch_size=4, num_workers=2, prefetch_size=1) as loader:
        for i, _ in enumerate(loader):
            time.sleep(0.01)
            if i == 5:
                break
    assert loader.closed


def test_many_open_close_cycles_leak_nothing(streams):
    gc.collect()
    threads = threading.active_count()
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(1000):
        loader = DataLoader(streams, batch_size=4, num_workers=2)
        next(loader)
        loader.close()
    gc.collect()
    # close() joins each worker for a while only; on a loaded machine a few may end later.
    eventually(lambda: threading.active_count() == threads, "every worker thread ending")
    assert len(os.listdir("/proc/self/fd")) <= fds


def test_a_dropped_loader_stops_its_threads(streams):
    threads = threading.active_count()
    loader = DataLoader(streams, batch_size=4, num_workers=3)
    next(loader)
    del loader
    gc.collect()
    eventually(lambda: threading.active_count() == threads, "the dropped loader's threads ending")


def test_program_exits_promptly_without_close(streams):
    code = textwrap.dedent(f"""
        from loaderx.dataset import DenseDataset
        from loaderx.dataloader import DataLoader
        s = {{"d": DenseDataset({streams['data'].path!r})}}
        loader = DataLoader(s, batch_size=8, num_workers=4)
        next(loader)
        print("done")
    """)
    # A program that hangs at exit runs into the timeout (generous: starting Python and NumPy
    # on a loaded machine is slow).
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=2 * DEADLINE)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "done"


def test_buffers_are_recycled_but_never_while_visible(streams):
    with DataLoader(streams, batch_size=16, num_workers=2, prefetch_size=2, seed=3) as loader:
        kept = next(loader)
        kept_view = kept["data"][3:5]
        kept_copy = {k: v.copy() for k, v in kept.items()}
        del kept
        for step in range(1, 300):
            b = next(loader)
            np.testing.assert_array_equal(b["label"], expected(step, 16, "cyclic", 3)["label"])
        np.testing.assert_array_equal(kept_view, kept_copy["data"][3:5])
        pools = loader._pipe.pools
        # 299 batches were handed out, a few buffers served them all. Free-threaded builds
        # release a batch dropped by the consumer only once the worker that made it runs
        # Python again (biased reference counting; see loaderx._views.recycle), so a buffer looks
        # busy a little longer there: within what the pool follows (2 * keep), still.
        bound = loader._pipe.window + 4
        if sysconfig.get_config_var("Py_GIL_DISABLED"):
            bound = 2 * pools[0].keep
        assert all(p.allocated <= bound for p in pools), [p.allocated for p in pools]
        # Batches the consumer keeps are never overwritten.
        keep = [next(loader) for _ in range(40)]
        copies = [b["label"].copy() for b in keep]
        take(loader, 50)
        assert all((b["label"] == c).all() for b, c in zip(keep, copies, strict=True))
        # ... and no two kept batches were handed out in the same memory: each holds a buffer
        # of its own while it is visible, for every stream.
        shared = [(i, j, k) for k in keep[0] for i in range(len(keep))
                  for j in range(i + 1, len(keep))
                  if np.shares_memory(keep[i][k], keep[j][k])]
        assert shared == [], f"kept batches (i, j, stream) sharing memory: {shared[:5]}"


def test_each_step_is_a_new_array(streams):
    with DataLoader(streams, batch_size=4) as loader:
        a = next(loader)["label"]
        b = next(loader)["label"]
        assert not np.shares_memory(a, b)


def test_use_in_a_forked_child_is_a_clear_error(streams):
    loader = DataLoader(streams, batch_size=4)
    next(loader)
    pid = os.fork()
    if pid == 0:  # child
        try:
            next(loader)
        except LoaderClosedError as e:
            os._exit(0 if "fork" in str(e) else 2)
        except BaseException:
            os._exit(3)
        os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    next(loader)  # the parent's loader still works
    loader.close()


def test_the_specs_examples_run_as_written(tmp_path, monkeypatch):
    """The spec's Quick Start, "Converting a NumPy tensor" and "Records" flows, with their
    inputs defined, in a fresh directory."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 4, size=(600, 8, 8), dtype=np.uint8)
    np.save("data.npy", images)
    np.save("label.npy", np.arange(600) % 10)

    from_numpy("train_data", np.load("data.npy", mmap_mode="r"))
    from_numpy("train_label", np.load("label.npy", mmap_mode="r"))
    loader = DataLoader({"data": DenseDataset("train_data"), "label": DenseDataset("train_label")},
                        transform=lambda batch: batch)
    for i, batch in enumerate(loader):  # noqa: B007 -- README loop as written; batch used below
        if i >= 256:
            break
    assert batch["data"].shape == (256, 8, 8) and batch["label"].shape == (256,)
    loader.close()

    # Appending more images to the same dataset with a trained dictionary.
    with pytest.warns(AppendWarning, match="appended"):  # as 0.9.11 does, now with a warning
        from_numpy("train_data", images, codec="zstd_dict")
    with DenseDataset("train_data") as ds:
        assert len(ds) == 1200
        np.testing.assert_array_equal(ds[600:], images)

    from_numpy("data", np.arange(64, dtype=np.float32).reshape(8, 2, 4))
    assert DenseDataset("data")[[0, 5, 2]].shape == (3, 2, 4)
    seqs = [np.arange(L, dtype=np.int32) for L in (3, 1, 4, 1, 5)]
    from_iterator("tokens", seqs)
    from loaderx.dataset import pad

    padded, lengths = pad(RaggedDataset("tokens")[[0, 2, 4]])
    assert padded.shape == (3, 5) and list(lengths) == [3, 4, 5]

    dense_tokens, labelset = DenseDataset("data"), DenseDataset("train_label")
    from_numpy("lab8", np.arange(8))
    labelset = DenseDataset("lab8")

    def collate(batch):
        return {"input_ids": batch["tokens"], "label": batch["label"]}

    with DataLoader({"tokens": dense_tokens, "label": labelset}, batch_size=4,
                    transform=collate) as loader:
        b = next(loader)
        assert b["input_ids"].shape == (4, 2, 4) and b["label"].shape == (4,)


def test_several_threads_may_consume_one_loader(streams):
    """Each step goes to exactly one consumer; none waits forever on a step another took."""
    import concurrent.futures

    with DataLoader(streams, batch_size=8, num_workers=2, seed=6, mode="iid") as loader:
        def consume(_: int) -> list[bytes]:
            return [next(loader)["label"].tobytes() for _ in range(25)]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(consume, i) for i in range(4)]
            _, hung = concurrent.futures.wait(futures, timeout=DEADLINE)
            loader.close()  # releases any consumer still waiting
            assert not hung, "a consumer waited forever for a step another consumer took"
            got = [b for f in futures for b in f.result()]
    want = [expected(s, 8, "iid", 6)["label"].tobytes() for s in range(100)]
    assert sorted(got) == sorted(want)


def _evict(path) -> None:
    for name in os.listdir(path):
        fd = os.open(os.path.join(path, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@pytest.mark.parametrize("readahead", [None, 0, 3, 50])
def test_readahead_over_an_evicted_store_gives_the_same_batches(tmp_path, readahead):
    """Readahead only starts reads early: over a store evicted from the page cache (so gathers
    take the pread path and the loader reads ahead) the batches are those of the sampler, in
    order, whatever the readahead; seek starts it again from the new step."""
    from_numpy(tmp_path / "data", DATA, codec="zstd")
    from_numpy(tmp_path / "label", LABEL, codec="raw")
    for name in ("data", "label"):
        _evict(tmp_path / name)
    fresh = {n: DenseDataset(tmp_path / n) for n in ("data", "label")}
    options = {} if readahead is None else {"readahead": readahead}
    with DataLoader(fresh, batch_size=8, seed=5, mode="iid", num_workers=2, **options) as loader:
        assert loader.readahead == (0 if readahead is None else readahead)
        for step in range(6):
            got = next(loader)
            np.testing.assert_array_equal(got["data"], expected(step, 8, "iid", 5)["data"])
        loader.seek(40)
        for step in range(40, 44):
            np.testing.assert_array_equal(next(loader)["label"],
                                          expected(step, 8, "iid", 5)["label"])
    for ds in fresh.values():
        ds.close()


def test_readahead_defaults_to_the_prefetch_depth_without_workers(streams):
    """With workers, their window already keeps its batches' reads in flight: no readahead by
    default. Without, batches are built only when asked for: readahead of prefetch_size."""
    with DataLoader(streams, batch_size=8, num_workers=0, prefetch_size=3) as loader:
        assert loader.readahead == 3
    with DataLoader(streams, batch_size=8, num_workers=2, prefetch_size=3) as loader:
        assert loader.readahead == 0


def test_readahead_is_checked(streams):
    with pytest.raises(ValueError, match="readahead"):
        DataLoader(streams, batch_size=8, readahead=-1)


@pytest.mark.parametrize("mode", ["cyclic", "iid", "sequential"])
def test_in_process_mode_gives_the_batches_of_any_worker_count(streams, mode):
    """num_workers=0 builds each batch on the consumer's thread: no thread is started, and the
    batches (also after seek and across a checkpoint) are those of four workers."""
    def running() -> int:
        # (Not the short-lived helper a free-threaded build makes a new pool buffer on, which
        # the 4 workers may be doing now: see loaderx._views.recycle.)
        return sum(t.name != "loaderx-buffer" for t in threading.enumerate())

    threads = running()
    with DataLoader(streams, batch_size=8, mode=mode, seed=3, num_workers=0) as inline, \
            DataLoader(streams, batch_size=8, mode=mode, seed=3, num_workers=4) as workers:
        for _ in range(7):
            a, b = next(inline), next(workers)
            for name in ("data", "label"):
                np.testing.assert_array_equal(a[name], b[name])
        assert running() == threads + 4, "only the 4-worker loader has threads"
        inline.seek(30)
        workers.seek(30)
        np.testing.assert_array_equal(next(inline)["data"], next(workers)["data"])
        state = inline.state_dict()
    with DataLoader(streams, batch_size=8, mode=mode, seed=3, num_workers=0) as resumed:
        resumed.load_state_dict(state)
        np.testing.assert_array_equal(next(resumed)["data"], expected(31, 8, mode, 3)["data"])


def test_in_process_mode_raises_the_transform_error_itself_and_keeps_the_step(streams):
    calls = []

    def flaky(batch):
        calls.append(1)
        if len(calls) == 2:
            raise KeyError("a bug in the transform")
        return batch

    with DataLoader(streams, batch_size=8, seed=1, num_workers=0, transform=flaky) as loader:
        next(loader)
        with pytest.raises(KeyError, match="a bug in the transform"):
            next(loader)  # raised as is, on this thread: a debugger stops in the transform
        assert loader.step == 1 and not loader.closed
        np.testing.assert_array_equal(next(loader)["label"], expected(1, 8, "cyclic", 1)["label"])


def test_in_process_mode_turns_stop_iteration_into_an_error(streams):
    def stop(batch):
        raise StopIteration

    with DataLoader(streams, batch_size=8, num_workers=0, transform=stop) as loader:
        with pytest.raises(RuntimeError, match="StopIteration") as info:
            for _ in loader:
                pass
        assert isinstance(info.value.__cause__, StopIteration)


def test_the_public_names_import_from_the_package():
    import loaderx
    from loaderx import (
        ConcatDataset,
        Mode,
        RaggedDataset,
        Sampler,
        Zrecord,
        errors,
        from_iterator,
        pad,
        set_num_threads,
    )
    from loaderx import DataLoader as DL
    from loaderx import DenseDataset as DD
    from loaderx import from_numpy as fn

    assert DL is DataLoader and DD is DenseDataset and fn is from_numpy
    assert errors.StoreChangedError.__module__ == "loaderx.errors"
    assert set(loaderx.__all__) >= {"ConcatDataset", "Mode", "RaggedDataset", "Sampler",
                                    "Zrecord", "from_iterator", "pad", "set_num_threads"}
    assert all(callable(x) for x in (ConcatDataset, Mode, RaggedDataset, Sampler, Zrecord,
                                     from_iterator, pad, set_num_threads))


@pytest.mark.parametrize("workers", [0, 1, 4])
@pytest.mark.parametrize("batch_size", [7, 8, 64])
def test_a_finite_pass_reads_every_record_once_in_order(streams, workers, batch_size):
    """epoch(): each record exactly once, in index order, a last shorter batch unless
    drop_last, len() the number of batches, the endless position untouched."""
    transform = lambda b: {**b, "twice": b["label"] * 2}  # noqa: E731
    with DataLoader(streams, batch_size=batch_size, num_workers=workers, seed=2,
                    transform=transform) as loader:
        next(loader)
        for drop_last in (False, True):
            p = loader.epoch(drop_last=drop_last)
            batches = list(p)
            full, rest = divmod(N, batch_size)
            assert len(p) == len(batches) == full + (0 if drop_last or not rest else 1)
            labels = np.concatenate([b["label"] for b in batches])
            seen = full * batch_size if drop_last else N
            np.testing.assert_array_equal(labels, LABEL[:seen])
            np.testing.assert_array_equal(np.concatenate([b["data"] for b in batches]),
                                          DATA[:seen])
            assert all((b["twice"] == b["label"] * 2).all() for b in batches)
            assert all(len(b["data"]) == batch_size for b in batches[:full])
            with pytest.raises(StopIteration):
                next(p)
        assert loader.step == 1


def test_a_finite_pass_splits_batches_across_shards(streams):
    """Shards of a pass take contiguous, equal parts of every batch (the last one too, when it
    divides); together, every record once."""
    parts = []
    for index in range(3):
        with DataLoader(streams, batch_size=12, shard_index=index, shard_count=3,
                        num_workers=2) as loader:  # 103 = 8 * 12 + 7: no even last batch
            with pytest.raises(ValueError, match=r"pad=True"):
                loader.epoch()
            with DataLoader(streams, batch_size=9, shard_index=index, shard_count=3,
                            num_workers=2) as nine:  # the last batch of 103 % 9 = 4 neither
                with pytest.raises(ValueError, match="do not split evenly into 3 shards"):
                    nine.epoch()
        with DataLoader({k: ds.subset(range(102)) for k, ds in streams.items()}, batch_size=9,
                        shard_index=index, shard_count=3, num_workers=2) as loader:
            p = loader.epoch()  # 102 = 11 * 9 + 3: one row each in the last batch
            parts.append([b["label"] for b in p])
            assert [len(b) for b in parts[-1]] == [3] * 11 + [1]
            assert [len(p.batch_indices(k)) for k in range(len(p))] == [3] * 11 + [1]
    rebuilt = np.concatenate([np.concatenate([p[k] for p in parts]) for k in range(len(parts[0]))])
    np.testing.assert_array_equal(rebuilt, LABEL[:102])


def test_a_pass_stops_its_threads(streams):
    before = threading.active_count()
    with DataLoader(streams, batch_size=8, num_workers=3) as loader:
        p = loader.epoch()
        next(p)
        p.close()
        deadline = time.monotonic() + 60
        while threading.active_count() > before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert threading.active_count() == before


@pytest.mark.parametrize("workers", [0, 3])
def test_a_padded_pass_has_full_batches_and_a_mask(streams, workers):
    """epoch(pad=True): every batch full, the last filled with records from the start of the
    data; batch["mask"] (or mask_key=) True for the real rows, also when the transform builds
    a new dict; a stream named like the mask is refused."""
    def collate(batch):  # a new dict: the mask is added back to it
        assert "mask" not in batch or batch["mask"].dtype == np.bool_
        return {"inputs": batch["data"], "target": batch["label"]}

    with DataLoader(streams, batch_size=10, num_workers=workers, transform=collate) as loader:
        batches = list(loader.epoch(pad=True))
        assert len(batches) == 11 and all(len(b["target"]) == 10 for b in batches)
        labels = np.concatenate([b["target"] for b in batches])
        mask = np.concatenate([b["mask"] for b in batches])
        np.testing.assert_array_equal(mask, np.arange(110) < N)
        np.testing.assert_array_equal(labels, LABEL[np.arange(110) % N])
        dropped = list(loader.epoch(pad=True, drop_last=True))
        assert len(dropped) == 10 and all(b["mask"].all() for b in dropped)
        plain = list(loader.epoch())
        assert "mask" not in plain[-1] and len(plain[-1]["target"]) == 3
    with DataLoader({"valid": streams["label"]}, batch_size=10, num_workers=workers) as loader:
        with pytest.raises(ValueError, match="mask_key 'valid' is also a stream's name"):
            loader.epoch(pad=True, mask_key="valid")
        with pytest.raises(TypeError, match="mask_key must be a str"):
            loader.epoch(pad=True, mask_key=3)
        last = list(loader.epoch(pad=True, mask_key="real"))[-1]
        assert sorted(last) == ["real", "valid"] and last["real"].sum() == 3


@pytest.mark.parametrize("workers", [0, 2])
def test_a_cyclic_loader_with_a_batch_larger_than_the_data_serves_passes(streams, workers):
    """A pass does not sample: batch_size > len(data) in cyclic mode gives one short batch (or
    one padded batch); only the endless next() refuses, naming epoch()."""
    with DataLoader(streams, batch_size=N + 20, num_workers=workers) as loader:
        (only,) = list(loader.epoch())
        np.testing.assert_array_equal(only["label"], LABEL)
        (padded,) = list(loader.epoch(pad=True))
        assert len(padded["label"]) == N + 20 and padded["mask"].sum() == N
        np.testing.assert_array_equal(padded["label"], LABEL[np.arange(N + 20) % N])
        assert list(loader.epoch(drop_last=True)) == []
        with pytest.raises(ValueError, match=r"cannot draw batches of 123 from 103 .*epoch\(\)"):
            next(loader)
        with pytest.raises(ValueError, match="epoch"):
            loader.batch_indices(0)
        assert not loader.closed and loader.state_dict()["step"] == 0
    with DataLoader(streams, batch_size=4 * N, shard_index=1, shard_count=2) as shard:
        (half,) = list(shard.epoch(pad=True))  # rows 2N..4N of the padded batch: all padding
        assert len(half["label"]) == 2 * N and not half["mask"].any()


class Blocking:
    """A transform that blocks until ``release`` is set, saying when it has started."""

    def __init__(self) -> None:
        self.started = threading.Semaphore(0)
        self.release = threading.Event()
        self.finished = threading.Event()

    def __call__(self, batch):
        self.started.release()
        self.release.wait(DEADLINE)
        self.finished.set()
        return batch


def test_close_returns_while_an_in_process_transform_runs(streams):
    """num_workers=0: close() from another thread returns while the consumer's transform is
    still blocked (it waited for the transform); that next() then raises LoaderClosedError and
    its batch is discarded."""
    transform = Blocking()
    loader = DataLoader(streams, batch_size=4, num_workers=0, transform=transform)
    outcome = {}

    def consume():
        try:
            outcome["batch"] = next(loader)
        except BaseException as e:
            outcome["error"] = e

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    assert transform.started.acquire(timeout=DEADLINE), "the transform did not start"
    try:
        without_hanging(loader.close)
        assert loader.closed and not transform.finished.is_set()
    finally:
        transform.release.set()
    consumer.join(DEADLINE)
    assert not consumer.is_alive()
    assert isinstance(outcome.get("error"), LoaderClosedError), outcome
    assert "closed while this batch was being built" in str(outcome["error"])


class FakeClock:
    """close()'s clock, moved only by joins that time out (as a stuck thread's would)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now


class StuckThread:
    """Stands for a worker that does not end: join(timeout) waits out its timeout."""

    def __init__(self, thread: threading.Thread, clock: FakeClock) -> None:
        self.thread, self.clock = thread, clock

    def join(self, timeout=None):
        self.clock.waits.append(timeout)
        self.clock.now += timeout


def test_close_waits_once_for_all_stuck_workers(streams, monkeypatch):
    """Four workers stuck in a transform: close() waits one deadline for all of them together
    (it waited a second per worker, in turn: four), and returns while they are still stuck."""
    from loaderx import dataloader

    transform = Blocking()
    loader = DataLoader(streams, batch_size=4, num_workers=4, transform=transform)
    def consume():
        with pytest.raises(LoaderClosedError):
            next(loader)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    for _ in range(4):
        assert transform.started.acquire(timeout=DEADLINE), "every worker in the transform"
    clock = FakeClock()
    monkeypatch.setattr(dataloader, "_clock", clock)
    threads = list(loader._pipe.threads)
    loader._pipe.threads = [StuckThread(t, clock) for t in threads]
    try:
        without_hanging(loader.close)
        assert not transform.finished.is_set()
        assert len(clock.waits) == 4 and sum(clock.waits) == dataloader._JOIN_SECONDS, \
            clock.waits
    finally:
        transform.release.set()
    eventually(lambda: not any(t.is_alive() for t in threads), "the workers ending")
    consumer.join(DEADLINE)


def ints_only(state) -> bool:
    return all(type(k) is str and type(v) is int for k, v in state.items())


def test_the_checkpoint_is_plain_ints(streams):
    """state_dict() has no strings and no None (Orbax's StandardSave refused the mode's
    name): every value is a Python int, also for subsets and seeds outside int64, and it
    survives JSON and arrays (what array checkpointers restore)."""
    import json

    for seed in (9, -3, 2**63 + 5, 2**70 + 1):
        with DataLoader(streams, batch_size=8, seed=seed, mode="iid") as loader:
            take(loader, 3)
            state = loader.state_dict()
            after = next(loader)["label"]
        assert ints_only(state), state
        assert state["mode"] == 1 and state["view"] == 0 and state["version"] == 2
        assert -2**63 <= state["seed"] < 2**63
        restored = [json.loads(json.dumps(state)),
                    {k: np.int64(v) for k, v in state.items()},
                    {k: np.asarray(v) for k, v in state.items()}]
        for again in restored:
            with DataLoader(streams, batch_size=8, seed=seed, mode="iid") as resumed:
                resumed.load_state_dict(again)
                assert resumed.step == 3
                np.testing.assert_array_equal(next(resumed)["label"], after)
    sub = {k: ds.subset(range(1, N)) for k, ds in streams.items()}
    with DataLoader(sub, batch_size=8) as loader:
        state = loader.state_dict()
    assert ints_only(state) and state["view"] != 0
    with DataLoader({k: ds.subset(range(N - 1)) for k, ds in streams.items()},
                    batch_size=8) as other:
        with pytest.raises(ValueError, match="other subsets"):
            other.load_state_dict(state)
    with DataLoader(streams, batch_size=8, seed=9) as loader:
        for bad, match in (({**loader.state_dict(), "mode": "iid"}, "mode: 'iid' in the state"),
                           ({**loader.state_dict(), "step": 1.5}, "'step' must be an integer"),
                           ({**loader.state_dict(), "version": 3}, "upgrade"),
                           ({"step": 0}, "missing length")):
            with pytest.raises(ValueError, match=match):
                loader.load_state_dict(bad)


def test_a_version_1_checkpoint_still_loads(streams):
    """Checkpoints written before the int-only format (mode and view as strings) resume."""
    old = {"version": 1, "length": N, "batch_size": 8, "mode": "cyclic", "seed": 9, "step": 12}
    with DataLoader(streams, batch_size=8, seed=9) as loader:
        loader.load_state_dict(old)
        np.testing.assert_array_equal(next(loader)["label"], expected(12, 8, "cyclic", 9)["label"])
    sub = {k: ds.subset(range(1, N)) for k, ds in streams.items()}
    with DataLoader(sub, batch_size=8, seed=9) as loader:
        view = loader._view()  # version 1 stored the digests as text
        loader.load_state_dict({**old, "length": N - 1, "view": view, "step": 4})
        assert loader.step == 4
        with pytest.raises(ValueError, match="other subsets"):
            loader.load_state_dict({**old, "length": N - 1, "step": 4})  # whole datasets
