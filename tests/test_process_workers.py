"""Process workers (issue 22): ``DataLoader(..., worker_mode="process")`` gives the batches the
thread loader gives -- for any worker count, with ragged streams and ``ctx`` transforms, after
``seek`` and ``load_state_dict``, in ``epoch()`` passes and shards -- returns what the transform
returned (containers of arrays, torch tensors, plain values), never reuses memory the consumer
still sees, delivers transform errors with their type, message and the worker's traceback, and
turns a dead worker into a ``WorkerError``. Workers are reaped by ``close()``, a ``with`` block
and interpreter exit, and end on their own when the consumer is killed, leaving nothing in
/dev/shm. Crash scenarios run in subprocesses; the transforms live in ``_process_helpers`` so
that forkserver and spawn workers can unpickle them."""

from __future__ import annotations

import functools
import gc
import itertools
import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import numpy as np
import pytest

import _process_helpers as helpers
from frameworks_required import need
from loaderx import (
    ConcatDataset,
    DataLoader,
    DenseDataset,
    RaggedDataset,
    Subset,
    from_iterator,
    from_numpy,
    pack,
)
from loaderx.errors import (
    LoaderClosedError,
    LoaderxError,
    LoaderxValueError,
    RemoteTraceback,
    WorkerError,
)
from loaderx.workers.start import gil_enabled

TESTS = pathlib.Path(__file__).parent
#: Seconds a subprocess may take: only a hang gets near it (2 loaded cores start Python slowly).
HANG = 180
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)}

N = 61
RNG = np.random.default_rng(22)
X = RNG.normal(size=(N, 2, 3)).astype(np.float32)
Y = np.arange(N, dtype=np.int64) * 10
#: Ragged records of shape (n_i, 3), some of them empty.
R = [RNG.integers(-999, 999, size=(int(RNG.integers(0, 9)), 3)).astype(np.int16)
     for _ in range(N)]
BATCH = 6


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("process_workers")
    from_numpy(out / "x", X, codec="zstd")
    from_numpy(out / "y", Y, codec="raw")
    from_iterator(out / "r", R, codec="zstd")
    return out


def dense(root: pathlib.Path) -> dict[str, Any]:
    return {"x": DenseDataset(root / "x"), "y": DenseDataset(root / "y")}


def mixed(root: pathlib.Path) -> dict[str, Any]:
    """A dense float stream, a dense label stream and a ragged stream."""
    return {**dense(root), "r": RaggedDataset(root / "r")}


def frozen(value: Any) -> Any:
    """A batch as nested tuples of types, dtypes, shapes and bytes: what "identical" compares
    (a torch tensor stays distinct from a NumPy array, a tuple from a list or a namedtuple, a
    masked array from a plain one)."""
    torch = sys.modules.get("torch")
    kind = type(value).__name__
    if isinstance(value, dict):
        return (kind, tuple((k, frozen(v)) for k, v in value.items()))
    if isinstance(value, (tuple, list)):
        return (kind, tuple(frozen(v) for v in value))
    if torch is not None and isinstance(value, torch.Tensor):
        raw = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        return (kind, str(value.dtype), tuple(value.shape), raw.numpy().tobytes())
    if isinstance(value, np.ma.MaskedArray):
        return (kind, frozen(value.data), frozen(np.ma.getmaskarray(value)))
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return (kind, value.shape, value.tolist())
        return (kind, value.dtype.str, str(value.dtype), value.shape, value.tobytes())
    if isinstance(value, np.generic):
        return (kind, value.item())
    return (kind, value)


def take(loader: Any, n: int) -> list[Any]:
    return [frozen(next(loader)) for _ in range(n)]


def reference(streams: dict[str, Any], n: int, start: int = 0, **kw: Any) -> list[Any]:
    """Batches ``start .. start + n`` of the thread loader (built on the consumer's thread)."""
    with DataLoader(streams, batch_size=BATCH, num_workers=0, start_step=start, **kw) as loader:
        return take(loader, n)


def process(streams: dict[str, Any], **kw: Any) -> DataLoader:
    kw.setdefault("num_workers", 2)
    kw.setdefault("prefetch_size", 2)
    return DataLoader(streams, batch_size=BATCH, worker_mode="process", **kw)


def assert_reaped(pids: list[int]) -> None:
    """Every pid ends and is reaped (no zombie stays behind) within the deadline."""
    helpers.wait_until(lambda: all(helpers.state_of(p) is None for p in pids),
                       f"workers {pids} ending and being reaped")


def run_child(code: str, *args: str, timeout: float = HANG) -> dict[str, Any]:
    """Runs ``code`` in a fresh interpreter and returns the JSON it prints last."""
    try:
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                           capture_output=True, text=True, timeout=timeout, env=ENV)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the child hung ({timeout:.0f} s): {e.stderr!r}") from None
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- configuration ------------------------------------------------------------------------------


def test_modes_and_default_worker_counts(root):
    cores = len(os.sched_getaffinity(0))
    with DataLoader(dense(root), batch_size=BATCH) as threads:
        assert threads.worker_mode == "thread"
        assert threads.num_workers == (min(4, cores) if gil_enabled() else cores)
        next(threads)
        assert threads.worker_pids == [] and threads.start_method is None
    with process(dense(root), num_workers=None) as loader:
        assert loader.worker_mode == "process"
        assert loader.num_workers == cores
        assert loader.worker_pids == []  # workers start at the first next()


def test_bad_arguments_are_refused(root):
    with pytest.raises(LoaderxValueError, match="process"):
        DataLoader(dense(root), worker_mode="bogus")
    with pytest.raises(LoaderxValueError, match="forkserver"):
        DataLoader(dense(root), worker_mode="process", start_method="bogus")


# -- the same batches as threads ----------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_batches_match_threads_with_ragged_stream_and_ctx(root, workers):
    """12 steps of 6 over 61 records cross a cycle of the sampler."""
    want = reference(mixed(root), 12, transform=helpers.augment, seed=7)
    with process(mixed(root), num_workers=workers, transform=helpers.augment,
                 seed=7) as loader:
        assert loader.worker_pids == []
        assert take(loader, 12) == want
        assert len(loader.worker_pids) == workers
        if workers:
            # Auto: fork where it is safe (no other Python thread, no CUDA), else forkserver.
            assert loader.start_method in ("fork", "forkserver")
            assert all(helpers.alive(p) for p in loader.worker_pids)


def test_identity_batches_match_threads(root):
    want = reference(mixed(root), 9, mode="iid", seed=123)
    with process(mixed(root), mode="iid", seed=123) as loader:
        batch = next(loader)
        assert isinstance(batch["r"], list) and all(isinstance(a, np.ndarray)
                                                    for a in batch["r"])
        assert [frozen(batch)] + take(loader, 8) == want


def test_seek_and_resume_match_threads(root):
    want = reference(mixed(root), 30, transform=helpers.augment, seed=3)
    kw = {"transform": helpers.augment, "seed": 3}
    with process(mixed(root), **kw) as loader:
        loader.seek(9)  # before the workers start
        assert take(loader, 2) == want[9:11]
        loader.seek(2)  # after
        assert take(loader, 3) == want[2:5]
        state = loader.state_dict()
        assert state["step"] == 5
        assert take(loader, 4) == want[5:9]
        loader.seek(25)
        assert take(loader, 5) == want[25:30]
    with process(mixed(root), num_workers=3, **kw) as resumed:
        resumed.load_state_dict(state)
        assert take(resumed, 4) == want[5:9]
    with process(mixed(root), num_workers=1, start_step=20, **kw) as started:
        assert take(started, 3) == want[20:23]


def test_epochs_match_threads(root):
    kw = {"transform": helpers.augment, "seed": 4}
    with DataLoader(mixed(root), batch_size=BATCH, num_workers=0, **kw) as threads:
        want = {name: [frozen(b) for b in threads.epoch(**opts)]
                for name, opts in (("whole", {}), ("padded", {"pad": True}),
                                   ("dropped", {"drop_last": True}))}
    with process(mixed(root), **kw) as loader:
        whole = loader.epoch()
        assert len(whole) == 11
        assert [frozen(b) for b in whole] == want["whole"]
        padded = [frozen(b) for b in loader.epoch(pad=True)]
        assert padded == want["padded"]
        assert [frozen(b) for b in loader.epoch(drop_last=True)] == want["dropped"]
        assert loader.step == 0  # a pass does not move the endless loader


@pytest.mark.parametrize("shard_index", [0, 1])
def test_shards_match_threads(root, shard_index):
    kw = {"transform": helpers.augment, "seed": 8, "shard_index": shard_index,
          "shard_count": 2}
    want = reference(mixed(root), 6, **kw)
    with DataLoader(mixed(root), batch_size=BATCH, num_workers=0, **kw) as threads:
        want_pass = [frozen(b) for b in threads.epoch(pad=True)]
    with process(mixed(root), num_workers=1, readahead=2, **kw) as loader:
        assert take(loader, 6) == want
        assert [frozen(b) for b in loader.epoch(pad=True)] == want_pass


# -- what comes back ----------------------------------------------------------------------------


@pytest.mark.parametrize("transform", [
    helpers.as_tuple, helpers.as_list, helpers.as_namedtuple, helpers.bare_array,
    helpers.nested, helpers.odd_containers, helpers.non_arrays, helpers.odd_arrays,
    helpers.masked, helpers.growing], ids=lambda f: f.__name__)
def test_returned_values_come_back_as_returned(root, transform):
    want = reference(dense(root), 4, transform=transform, seed=1)
    with process(dense(root), num_workers=1, transform=transform, seed=1) as loader:
        assert take(loader, 4) == want


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_read_only_arrays_stay_read_only(root, mode):
    """What threads hand over as it is -- a read-only array -- comes back read-only from a
    worker process too, with the same values; writable ones stay writable."""
    want = reference(dense(root), 4, seed=1)
    with DataLoader(dense(root), batch_size=BATCH, num_workers=1, seed=1, worker_mode=mode,
                    transform=helpers.read_only) as loader:
        for step in range(4):
            batch = next(loader)
            flags = {k: v.flags.writeable for k, v in batch.items() if k != "nested"}
            assert flags == {"x": False, "doubled": False, "view": False, "y": True}
            assert not batch["nested"][0].flags.writeable
            x = want[step][1][0][1][4]
            assert batch["x"].tobytes() == x
            with pytest.raises(ValueError, match="read-only"):
                batch["x"][0] = 0


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_self_referencing_and_shared_containers_come_back_alike(root, mode):
    """A list or dict that holds itself comes back holding itself (not a RecursionError), and
    one held twice is one object, as the thread loader hands them over."""
    want = reference(dense(root), 3, seed=8)
    with DataLoader(dense(root), batch_size=BATCH, num_workers=1, seed=8, worker_mode=mode,
                    transform=helpers.self_referencing) as loader:
        for step in range(3):
            batch = next(loader)
            loop, ring = batch["loop"], batch["ring"]
            assert loop[1] is loop and ring["me"] is ring
            assert batch["b"][0] is batch["a"]
            assert loop[0].tobytes() == want[step][1][0][1][4]
            assert ring["y"].tobytes() == want[step][1][1][1][4]


def _draws_by_worker(root: pathlib.Path, method: str, seed: int) -> dict[int, list[Any]]:
    """Each worker's draws from the global generators, in the order it made them."""
    by_pid: dict[int, list[Any]] = {}
    with process(dense(root), num_workers=2, transform=helpers.global_draws, seed=seed,
                 start_method=method) as loader:
        for _ in range(16):
            batch = next(loader)
            by_pid.setdefault(batch["pid"], []).append(
                (batch["random"], batch["np"], batch["torch"]))
    return by_pid


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_workers_draw_different_random_numbers(root, method):
    """Python's random, NumPy's and torch's global generators are seeded per worker, as
    torch's DataLoader does: no two workers repeat a stream, whatever the start method (a
    forked worker inherits the consumer's NumPy and torch state; forkserver workers the
    server's). torch here is imported by the transform lazily, in the worker."""
    need("torch")
    np.random.random()  # the consumer has drawn: a forked worker would inherit this state
    by_pid = _draws_by_worker(root, method, seed=3)
    assert len(by_pid) == 2, "both workers built steps"
    first, second = by_pid.values()
    for kind in range(3):
        mine = {d[kind] for d in first}
        theirs = {d[kind] for d in second}
        assert not mine & theirs, f"generator {('random', 'numpy', 'torch')[kind]} repeats"
    # Another seed, other streams.
    other = _draws_by_worker(root, method, seed=4)
    assert not {d for ds in by_pid.values() for d in ds} & {d for ds in other.values()
                                                            for d in ds}


def test_torch_tensors_come_back_as_tensors(root):
    torch = need("torch")
    want = reference(dense(root), 3, transform=helpers.to_torch, seed=2)
    with process(dense(root), num_workers=1, transform=helpers.to_torch, seed=2) as loader:
        batch = next(loader)
        assert isinstance(batch["x"], torch.Tensor) and isinstance(batch["y"], torch.Tensor)
        assert isinstance(batch["tuple"], tuple) and isinstance(batch["tuple"][0], torch.Tensor)
        assert isinstance(batch["tuple"][1], np.ndarray)
        assert [frozen(batch)] + take(loader, 2) == want


def test_odd_torch_tensors_come_back_as_returned(root):
    need("torch")
    want = reference(dense(root), 3, transform=helpers.odd_tensors, seed=2)
    with process(dense(root), num_workers=1, transform=helpers.odd_tensors, seed=2) as loader:
        assert take(loader, 3) == want


def test_views_and_packed_streams_match_threads(root, tmp_path):
    """Subsets, concatenations and packed token rows pickle into the workers and give the
    thread loader's batches (a packed stream's companion arrays included)."""
    docs = [np.arange(1, int(n) + 1, dtype=np.uint16) for n in RNG.integers(1, 20, size=40)]
    from_iterator(tmp_path / "docs", docs)
    idx = np.random.default_rng(5).permutation(2 * N)[:50]
    views = {"x": Subset(ConcatDataset([root / "x", root / "x"]), idx),
             "r": Subset(ConcatDataset([root / "r", root / "r"]), idx)}
    packed = {"t": pack(RaggedDataset(tmp_path / "docs"), 8, eos_id=0)}
    for streams in (views, packed):
        want = reference(streams, 8, seed=12)
        with process(streams, seed=12) as loader:
            assert take(loader, 8) == want
    assert "t_segment_ids" in next(iter(DataLoader(packed, batch_size=BATCH, num_workers=0)))


def test_arrays_are_writable_as_in_threads(root):
    want = reference(mixed(root), 8, seed=13)
    with process(mixed(root), seed=13) as loader:
        for step in range(8):
            batch = next(loader)
            assert frozen(batch) == want[step]
            batch["x"] *= 0  # a consumer normalizing in place
            batch["r"][0][...] = 1
            assert not batch["x"].any()


def memfd_bytes() -> int:
    """Bytes of memfd (anonymous shared) memory this process maps."""
    total = 0
    for line in pathlib.Path("/proc/self/maps").read_text().splitlines():
        if "/memfd:" in line:
            start, end = (int(v, 16) for v in line.split()[0].split("-"))
            total += end - start
    return total


def test_kept_batches_are_never_overwritten(root):
    want = reference(mixed(root), 200, seed=6)
    with process(mixed(root), seed=6) as loader:
        kept = next(loader)
        view = next(loader)["x"][2:4]  # a view outlives its dict
        ragged_record = next(loader)["r"][1]
        for step in range(3, 53):
            assert frozen(next(loader)) == want[step]
        assert frozen(kept) == want[0]
        np.testing.assert_array_equal(view, X[_indices(loader, 1)][2:4])
        np.testing.assert_array_equal(ragged_record, R[int(_indices(loader, 2)[1])])
        # Batches held together never share memory.
        held = [next(loader) for _ in range(8)]
        shared = [(i, j, k) for k in ("x", "y") for i in range(len(held))
                  for j in range(i + 1, len(held)) if np.shares_memory(held[i][k], held[j][k])]
        assert shared == []
        assert [frozen(b) for b in held] == want[53:61]
        del held
        # Memory released is reused: the mapped shared memory stays bounded.
        early = memfd_bytes()
        for step in range(61, 200):
            assert frozen(next(loader)) == want[step]
        assert memfd_bytes() <= 2 * early + (1 << 20)


@pytest.mark.parametrize("mode", ["thread", "process"])
@pytest.mark.parametrize("workers", [1, 2])
def test_views_the_transform_keeps_are_never_overwritten(root, mode, workers):
    """A transform that keeps views of its input for later steps (without a copy) sees them
    unchanged then, in both modes: a worker reuses a segment only once nothing in it, the
    transform's state included, sees the segment any more."""
    streams = mixed(root)
    lag = helpers.KeepsEarlier.LAG
    with DataLoader(streams, batch_size=BATCH, num_workers=0, seed=4) as loader:
        # Steps past the last one taken too: with several workers sharing the transform, the
        # last steps may be built after later ones the prefetch window already let start.
        xs = [next(loader)["x"].copy() for _ in range(80)]
        firsts = [R[int(loader.batch_indices(step)[0])] for step in range(60)]
    with DataLoader(streams, batch_size=BATCH, num_workers=workers, seed=4, worker_mode=mode,
                    prefetch_size=2, transform=helpers.KeepsEarlier()) as loader:
        wrong = []
        for step in range(60):
            batch = next(loader)
            np.testing.assert_array_equal(batch["x"], xs[step])
            if not np.array_equal(batch["mix"], batch["x"] + batch["prev"]):
                wrong.append(step)
            elif workers == 1 and step >= lag:  # one worker builds every step, in order
                if not (np.array_equal(batch["prev"], xs[step - lag])
                        and np.array_equal(batch["prev_r"], firsts[step - lag])):
                    wrong.append(step)
            elif batch["prev"].any() and not any(np.array_equal(batch["prev"], x) for x in xs):
                wrong.append(step)  # several workers: any step's input (a later too), unchanged
        assert wrong == []


def _indices(loader: DataLoader, step: int) -> np.ndarray:
    return loader.batch_indices(step).astype(np.int64)


# -- errors -------------------------------------------------------------------------------------


def test_transform_error_reaches_the_consumer_with_the_workers_traceback(root):
    loader = process(dense(root), transform=helpers.boom_at_step_3)
    delivered = []
    with pytest.raises(ValueError, match="^boom at step 3$") as info:
        for _ in range(10):
            next(loader)
            delivered.append(loader.step - 1)
    pids = loader.worker_pids
    assert delivered == [0, 1, 2]
    assert type(info.value) is ValueError
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "boom_at_step_3" in str(cause) and "boom at step 3" in str(cause)
    assert loader.closed
    with pytest.raises(LoaderClosedError):
        next(loader)
    assert_reaped(pids)


@pytest.mark.parametrize(("transform", "kind", "message"), [
    (helpers.unpicklable_at_step_2, "HoldsALock", "a lock inside at step 2"),
    (helpers.unloadable_at_step_2, "NeedsTwoArguments", "two arguments needed at 2"),
], ids=["does-not-pickle", "does-not-unpickle"])
def test_an_exception_that_does_not_travel_is_a_worker_error(root, transform, kind, message):
    loader = process(dense(root), transform=transform)
    with pytest.raises(WorkerError) as info:
        for _ in range(10):
            next(loader)
    assert isinstance(info.value, LoaderxError)
    assert kind in str(info.value) and message in str(info.value)
    assert loader.closed
    loader.close()


def test_stop_iteration_in_the_transform_is_a_runtime_error_as_in_threads(root):
    for workers, mode in ((1, "thread"), (1, "process")):
        with DataLoader(dense(root), batch_size=BATCH, num_workers=workers, worker_mode=mode,
                        transform=helpers.stop_at_step_1) as loader:
            next(loader)
            with pytest.raises(RuntimeError, match="StopIteration at step 1"):
                next(loader)
            assert loader.closed


def test_an_output_that_does_not_pickle_is_a_loaderx_error(root):
    loader = process(dense(root), transform=helpers.unpicklable_output)
    with pytest.raises(LoaderxError, match="lock"):
        next(loader)
    assert loader.closed
    loader.close()


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("bad", [12, 13])
def test_an_output_that_does_not_pickle_after_quick_batches(root, workers, bad):
    """Quick batches go two to a message when the next step is already waiting: a reply
    held back that way still arrives when the one after it cannot be sent (the failing step
    is, depending on timing, the first of a pair or the second: both are tried)."""
    transform = functools.partial(helpers.unpicklable_key_at, bad)
    kw = {"batch_size": BATCH, "seed": 5, "transform": transform}
    with DataLoader(dense(root), num_workers=0, **kw) as reference:
        want = [next(reference)["x"] for _ in range(bad)]
    with DataLoader(dense(root), num_workers=workers, worker_mode="process",
                    start_method="fork", **kw) as loader:
        # The steps before (their segments made by then: a reply with new ones is never held).
        got = [next(loader)["x"] for _ in range(bad)]
        with pytest.raises(LoaderxError, match=f"at step {bad} cannot be sent"):
            next(loader)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


CRASH = """
import json, os, re, signal, sys
import _process_helpers as h
from loaderx import DataLoader, DenseDataset
from loaderx.errors import LoaderxError
root, method, how = sys.argv[1:4]
streams = {"x": DenseDataset(os.path.join(root, "x")), "y": DenseDataset(os.path.join(root, "y"))}
transform = h.exit_at_step_2 if how == "exit" else h.bare_array
loader = DataLoader(streams, batch_size=6, num_workers=2, prefetch_size=2, seed=5,
                    worker_mode="process", start_method=method, transform=transform)
out = {"delivered": 0, "error": None}
pids = []
try:
    next(loader)
    out["delivered"] += 1
    out["pids"] = pids = loader.worker_pids
    if how == "kill":
        os.kill(pids[0], signal.SIGKILL)
    for _ in range(200):
        next(loader)
        out["delivered"] += 1
except Exception as e:
    out.update(error=type(e).__name__, message=str(e), loaderx=isinstance(e, LoaderxError))
    pids = pids or [int(p) for p in re.findall(r"pid (\\d+)", str(e))]
out["closed"] = loader.closed
try:
    next(loader)
    out["after"] = "a batch"
except Exception as e:
    out["after"] = type(e).__name__
for what, condition in (
        ("workers gone", lambda: all(h.state_of(p) is None for p in pids)),
        ("no zombies", lambda: not h.zombies_below(os.getpid()))):
    try:
        h.wait_until(condition, what)
        out[what] = True
    except AssertionError:
        out[what] = [(p, h.state_of(p)) for p in pids + h.zombies_below(os.getpid())]
print(json.dumps(out))
"""


@pytest.mark.parametrize(("method", "how"), [("fork", "kill"), ("forkserver", "kill"),
                                             ("forkserver", "exit")])
def test_a_dead_worker_is_a_worker_error_not_a_hang(root, method, how):
    out = run_child(CRASH, str(root), method, how)
    assert out["error"] == "WorkerError" and out["loaderx"], out
    message = out["message"]
    if how == "kill":
        assert str(out["pids"][0]) in message, message
        assert "SIGKILL" in message or "signal 9" in message, message
    else:
        assert "exited with code 7" in message and "step 2" in message, message
        assert out["delivered"] <= 2  # step 2 was never built
    assert out["closed"] and out["after"] == "LoaderClosedError", out
    assert out["workers gone"] is True and out["no zombies"] is True, out


DEATH_IN_ORDER = """
import json, os, sys
import _process_helpers as h
from loaderx import DataLoader, DenseDataset
streams = {"y": DenseDataset(os.path.join(sys.argv[1], "y"))}
loader = DataLoader(streams, batch_size=6, num_workers=2, prefetch_size=2, seed=5,
                    worker_mode="process", transform=h.exit_at_step_2)
delivered, error = [], None
try:
    next(loader)
    delivered.append(0)
    pids = loader.worker_pids
    h.wait_until(lambda: not all(h.alive(p) for p in pids), "the worker of step 2 dying")
    for _ in range(5):
        next(loader)
        delivered.append(loader.step - 1)
except Exception as e:
    error = f"{type(e).__name__}: {e}"
print(json.dumps({"delivered": delivered, "error": error}))
"""


def test_a_dead_worker_is_reported_at_its_step_after_the_steps_before_it(root):
    """Worker 0 builds step 0 and dies building step 2: steps 0 and 1 were built (step 1 by
    the other worker) and are delivered; the error comes at step 2, where a transform's
    exception would -- not at whatever step the consumer happened to wait for when the death
    was noticed."""
    out = run_child(DEATH_IN_ORDER, str(root))
    assert out["delivered"] == [0, 1], out
    assert out["error"].startswith("WorkerError") and "step 2" in out["error"], out


CONSUMER = """
import json, os, sys, time
import _process_helpers as h
from loaderx import DataLoader, DenseDataset
root, method = sys.argv[1:3]
streams = {"x": DenseDataset(os.path.join(root, "x")), "y": DenseDataset(os.path.join(root, "y"))}
loader = DataLoader(streams, batch_size=6, num_workers=2, prefetch_size=2,
                    worker_mode="process", start_method=method)
held = [next(loader) for _ in range(3)]
pids = loader.worker_pids
maps = {p: h.shm_mappings(p) for p in [os.getpid(), *pids]}
print(json.dumps({"pid": os.getpid(), "workers": pids, "shm": maps}), flush=True)
time.sleep(3600)
"""


def shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_workers_end_when_the_consumer_is_killed(root, method):
    before = shm_entries()
    child = subprocess.Popen([sys.executable, "-c", CONSUMER, str(root), method],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], HANG)
        assert ready, f"the consumer printed nothing in {HANG} s"
        line = child.stdout.readline()
        assert line, f"the consumer ended early: {child.stderr.read() if child.stderr else ''}"
        info = json.loads(line)
        below = helpers.descendants(child.pid)
        assert set(info["workers"]) <= below
        # Batch memory is anonymous: no process of the loader maps a named segment.
        assert all(m == [] for m in info["shm"].values()), info["shm"]
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for pipe in (child.stdout, child.stderr):
            if pipe is not None:
                pipe.close()
    helpers.wait_until(lambda: not any(helpers.alive(p) for p in below),
                       f"the dead consumer's processes {sorted(below)} ending")
    assert shm_entries() - before == set()


STUCK_CONSUMER = """
import json, os, sys, time
import _process_helpers as h
from loaderx import DataLoader, DenseDataset
root, method = sys.argv[1:3]
loader = DataLoader({"y": DenseDataset(os.path.join(root, "y"))}, batch_size=6, num_workers=2,
                    prefetch_size=1, worker_mode="process", start_method=method,
                    transform=h.gate_at_step_2)
next(loader), next(loader)
print(json.dumps({"workers": loader.worker_pids}), flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_workers_end_when_the_consumer_is_killed_during_a_transform(root, tmp_path, method):
    """The consumer dies while a worker is inside a transform that does not return (a hung
    read, a deadlock): the worker must not outlive it (it holds the batch's shared memory,
    and a GPU context if the transform made one)."""
    gate = tmp_path / "gate"  # never opened while the test watches
    child = subprocess.Popen([sys.executable, "-c", STUCK_CONSUMER, str(root), method],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**ENV, helpers.GATE_VARIABLE: str(gate)})
    below: set[int] = set()
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, "the consumer ended early"
        below = helpers.descendants(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        helpers.wait_until(lambda: not any(helpers.alive(p) for p in below),
                           f"the dead consumer's processes {sorted(below)} ending", timeout=20)
    finally:
        stop(child, below, gate)


# -- lifecycle ----------------------------------------------------------------------------------


def test_close_and_with_block_reap_the_workers(root):
    loader = process(dense(root))
    next(loader)
    pids = loader.worker_pids
    assert len(pids) == 2 and all(helpers.alive(p) for p in pids)
    loader.close()
    assert loader.closed
    assert_reaped(pids)
    loader.close()  # twice is harmless
    with process(dense(root), num_workers=3) as loader:
        next(loader)
        pids = loader.worker_pids
    assert len(pids) == 3
    assert_reaped(pids)


def test_dropped_loaders_and_passes_reap_their_workers(root):
    """No close(): dropping the loader, or a pass (exhausted or not), ends its workers."""
    me = os.getpid()

    def children() -> set[int]:
        return {p for p, parent in helpers.parents().items() if parent == me}

    before = children()
    loader = process(dense(root), start_method="fork")
    next(loader)
    pids = loader.worker_pids
    assert set(pids) <= children()
    started = loader.epoch()
    next(started)
    exhausted = loader.epoch()
    assert [frozen(b) for b in exhausted] == [frozen(b) for b in DataLoader(
        dense(root), batch_size=BATCH, num_workers=0).epoch()]
    assert len(children() - before) >= len(pids) + 2
    del loader, started, exhausted
    gc.collect()
    helpers.wait_until(lambda: children() <= before, "the dropped loaders' workers ending")
    assert_reaped(pids)


def test_a_pass_with_fewer_batches_than_workers(root):
    """A batch larger than the data: the endless cyclic loader refuses, the pass gives one
    short batch; three workers, one step."""
    with DataLoader(mixed(root), batch_size=64, num_workers=0) as threads:
        want = [frozen(b) for b in threads.epoch()]
        want_padded = [frozen(b) for b in threads.epoch(pad=True)]
    with DataLoader(mixed(root), batch_size=64, num_workers=3, worker_mode="process") as loader:
        assert [frozen(b) for b in loader.epoch()] == want
        assert [frozen(b) for b in loader.epoch(pad=True)] == want_padded
        with pytest.raises(LoaderxValueError, match="cyclic"):
            next(loader)


HELD = """
import gc, json, os, sys
import numpy as np
import _process_helpers as h
from loaderx import DataLoader, DenseDataset, RaggedDataset
root, how = sys.argv[1:3]
streams = {"x": DenseDataset(os.path.join(root, "x")), "r": RaggedDataset(os.path.join(root, "r"))}
transform = h.boom_at_step_3 if how == "error" else h.augment if how == "ctx" else None
loader = DataLoader(streams, batch_size=6, num_workers=2, worker_mode="process", seed=4,
                    **({"transform": transform} if transform else {}))
held = [next(loader) for _ in range(3)]
copies = [{"x": b["x"].copy(), "r": [a.copy() for a in b["r"]]} for b in held]
if how == "error":
    try:
        next(loader)
    except ValueError:
        pass
pids = loader.worker_pids
loader.close()
del loader
gc.collect()
h.wait_until(lambda: all(h.state_of(p) is None for p in pids), "workers reaped")
same = all(np.array_equal(b["x"], c["x"]) and all(np.array_equal(a, d) for a, d in
           zip(b["r"], c["r"])) for b, c in zip(held, copies))
print(json.dumps({"same": same}))
"""


@pytest.mark.parametrize("how", ["close", "error"])
def test_held_batches_outlive_the_loader_and_its_workers(root, how):
    """A batch the consumer keeps stays readable and unchanged after close() (or the error
    that closed the loader) and after its workers ended (a subprocess: an unmapped segment
    would be a segfault)."""
    assert run_child(HELD, str(root), how) == {"same": True}


def test_close_from_another_thread_ends_a_waiting_next_and_kills_a_stuck_worker(root):
    """The consumer waits for step 2, whose transform never returns: close() from another
    thread makes that next() raise LoaderClosedError, and the stuck worker is killed."""
    loader = process(dense(root), transform=helpers.hang_at_step_2)
    outcome: list[BaseException] = []

    def consume() -> None:
        try:
            for _ in range(5):
                next(loader)
        except BaseException as e:
            outcome.append(e)

    consumer = threading.Thread(target=consume)
    consumer.start()
    helpers.wait_until(lambda: loader.step == 2, "steps 0 and 1 arriving")
    pids = loader.worker_pids
    loader.close()
    consumer.join(helpers.DEADLINE)
    assert not consumer.is_alive(), "next() still waits after close()"
    assert len(outcome) == 1 and isinstance(outcome[0], LoaderClosedError), outcome
    assert_reaped(pids)


INTERRUPTS = """
import json, os, random, signal, sys
from loaderx import DataLoader, DenseDataset

def interrupt(signum, frame):
    # Ctrl-C as it lands inside the loader: raised only while loaderx code runs, so this
    # script's own bookkeeping is never interrupted.
    while frame is not None:
        if os.sep + "loaderx" + os.sep in frame.f_code.co_filename:
            raise KeyboardInterrupt
        frame = frame.f_back

root, mode, steps, longest = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
streams = {"y": DenseDataset(os.path.join(root, "y"))}
with DataLoader(streams, batch_size=6, num_workers=0, seed=3) as reference:
    want = [next(reference)["y"].tolist() for _ in range(steps)]
rng = random.Random(0)
got, interrupts = [], 0
signal.signal(signal.SIGALRM, interrupt)
with DataLoader(streams, batch_size=6, num_workers=2, seed=3, worker_mode=mode) as loader:
    got.append(next(loader)["y"].tolist())  # started: its sockets and pipe are open
    descriptors = len(os.listdir("/proc/self/fd"))
    while len(got) < steps:
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(1e-6, longest))
        try:
            y = next(loader)["y"].tolist()
            signal.setitimer(signal.ITIMER_REAL, 0)
        except KeyboardInterrupt:
            signal.setitimer(signal.ITIMER_REAL, 0)
            interrupts += 1
            y = next(loader)["y"].tolist()  # no interrupt this time: it must deliver
        got.append(y)
    step = loader.step
    pipe = loader._pipe
    # Process workers: segments the consumer maps, and loans it watches, per worker.
    workers = pipe.workers if mode == "process" else []
    segments = [len(w.maps) for w in workers]
    loans = [len(w.loans) for w in workers]
    grown = len(os.listdir("/proc/self/fd")) - descriptors
print(json.dumps({"same": got == want, "step": step, "interrupts": interrupts,
                  "segments": segments, "loans": loans, "grown": grown}))
"""


@pytest.mark.parametrize(("mode", "longest"), [("thread", 1.5e-3), ("process", 1.5e-3),
                                               ("thread", 2e-4), ("process", 2e-4)])
def test_an_interrupted_next_loses_no_step_and_does_not_hang(root, mode, longest):
    """KeyboardInterrupt raised at random points inside next() (as Ctrl-C in a notebook,
    after which the user goes on): the following next() delivers the step that was due --
    none lost, none skipped, no hang, and a KeyboardInterrupt, not another error in its place.
    With process workers the consumer reads the replies on its own thread, so interrupts as
    often as every 0.1 ms land inside that reading too: still nothing is lost, and no segment,
    loan or descriptor is left behind."""
    steps = 1000 if longest < 1e-3 else 600
    out = run_child(INTERRUPTS, str(root), mode, str(steps), str(longest), timeout=60)
    assert out["same"] and out["step"] == steps, out
    # That it was interrupted at all (how often depends on the machine's speed).
    assert out["interrupts"] >= (20 if longest < 1e-3 else 1), out
    # Each worker keeps a few segments (its share of the window, two spare): leaked ones
    # would pile up with the interrupts.
    assert all(n <= 8 for n in out["segments"]) and all(n <= 8 for n in out["loans"]), out
    # Descriptors: an interrupt landing between a handled frame's descriptor being popped and
    # closed leaks that one (the reader's chosen side: never close one twice), and a frame read
    # ahead holds its own; hundreds of interrupts must not pile them up.
    assert out["grown"] <= 2, out


CLOSED_BY_A_HANDLER = """
import json, os, random, signal, sys
from loaderx import DataLoader, DenseDataset
from loaderx.errors import LoaderClosedError

root, mode, trials = sys.argv[1], sys.argv[2], int(sys.argv[3])
streams = {"y": DenseDataset(os.path.join(root, "y"))}
rng = random.Random(0)
current = []
def close_it(signum, frame):  # a SIGTERM handler that cleans up, landing anywhere in next()
    if current:
        current[0].close()
signal.signal(signal.SIGALRM, close_it)
outcomes, base, pids = {}, None, []
for trial in range(trials):
    if trial == 1:  # after the first loader: the fork server's own pipes stay open
        base = len(os.listdir("/proc/self/fd"))
    loader = DataLoader(streams, batch_size=6, num_workers=2, seed=3, worker_mode=mode)
    current[:] = [loader]
    next(loader)
    pids += getattr(loader, "worker_pids", [])
    signal.setitimer(signal.ITIMER_REAL, rng.uniform(1e-6, 3e-3))
    try:
        for _ in range(300):
            next(loader)
        outcome = "ran"
    except LoaderClosedError:
        outcome = "closed"
    signal.setitimer(signal.ITIMER_REAL, 0)
    current[:] = []
    loader.close()
    try:
        next(loader)
        outcome += ", then a batch after close"
    except LoaderClosedError:
        pass
    outcomes[outcome] = outcomes.get(outcome, 0) + 1
print(json.dumps({"outcomes": outcomes, "grown": len(os.listdir("/proc/self/fd")) - base,
                  "pids": pids}))
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_close_from_a_signal_handler_inside_next(root, mode):
    """close() called by a signal handler (a SIGTERM handler that cleans up) at a random point
    inside next() -- while it waits, reads a reply, or hands out a step: next() raises
    LoaderClosedError (or had returned), never hangs or raises anything else, and nothing is
    left open or running."""
    # Threads start in no time: more trials for the rarer races there.
    out = run_child(CLOSED_BY_A_HANDLER, str(root), mode, "80" if mode == "thread" else "25",
                    timeout=90)
    assert set(out["outcomes"]) <= {"ran", "closed"} and out["outcomes"].get("closed"), out
    assert out["grown"] <= 0, out
    assert_reaped(out["pids"])


CLOSED_INSIDE_NOTIFY = """
import json, linecache, os, sys, threading, time
from loaderx import DataLoader, DenseDataset
from loaderx.errors import LoaderClosedError

root, mode = sys.argv[1:3]
streams = {"y": DenseDataset(os.path.join(root, "y"))}
loader = DataLoader(streams, batch_size=6, num_workers=2, seed=3, worker_mode=mode)
next(loader)
pids = list(getattr(loader, "worker_pids", []))
pipe = loader._pipe

done = []
def bystander():  # another thread waiting on the loader (a second consumer, say)
    with pipe.cond:
        while not pipe.closed and not done:
            pipe.cond.wait(0.05)

helper = threading.Thread(target=bystander)
helper.start()

# What a signal handler can do: run close() between Condition.notify's test for waiters and
# its taking the first (a trace function runs where a handler can).
fired = []
def local(frame, event, arg):
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    if event == "line" and not fired and line == "waiter = waiters[0]":
        fired.append(line)
        loader.close()
    return local
def tracer(frame, event, arg):
    return local if frame.f_code is threading.Condition.notify.__code__ else None
sys.settrace(tracer)
outcome = "batch"
try:
    # Until a notify under next() walks a waiter: the bystander's timed waits (and the
    # workers') leave moments with nobody waiting, when notify walks nothing (free-threaded
    # builds hit them often enough to hang this script when it tried only once).
    for _ in range(1000):
        while not pipe.cond._waiters:  # someone waits, so the next notify walks a waiter
            time.sleep(0.001)
        next(loader)
        if fired:
            break
except LoaderClosedError:
    outcome = "closed"
finally:
    sys.settrace(None)
    done.append(True)
try:
    next(loader)
    outcome += ", then a batch after close"
except LoaderClosedError:
    pass
helper.join()
while threading.active_count() > 1:  # the workers' threads end on their own
    time.sleep(0.01)
print(json.dumps({"outcome": outcome, "fired": bool(fired), "pids": pids}))
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_close_from_a_handler_inside_condition_notify(root, mode):
    """close() from a signal handler that lands inside ``Condition.notify`` under next() (the
    race behind a rare IndexError in the test above): next() returns the batch or raises
    LoaderClosedError, never anything else, and every thread and worker ends."""
    out = run_child(CLOSED_INSIDE_NOTIFY, str(root), mode, timeout=60)
    assert out["fired"], "the trace never reached Condition.notify's walk of the waiters"
    assert out["outcome"] in {"batch", "closed"}, out
    assert_reaped(out["pids"])


MANY_HELD = """
import json, os, resource, sys
from loaderx import DataLoader, DenseDataset
root, mode = sys.argv[1:3]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
streams = {"y": DenseDataset(os.path.join(root, "y"))}
with DataLoader(streams, batch_size=6, num_workers=0, seed=3) as reference:
    want = [next(reference)["y"].tolist() for _ in range(400)]
with DataLoader(streams, batch_size=6, num_workers=2, seed=3, worker_mode=mode) as loader:
    held = [next(loader) for _ in range(400)]
    print(json.dumps({"same": [b["y"].tolist() for b in held] == want}))
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_holding_more_batches_than_file_descriptors(root, mode):
    """A consumer that keeps every batch (``list(loader.epoch())`` of a validation set) under
    a low open-file limit (256 here; 1024 is the usual default): batches cost memory, not a
    file descriptor each."""
    assert run_child(MANY_HELD, str(root), mode) == {"same": True}


def test_interpreter_exit_with_a_live_loader_is_prompt(root):
    out = run_child("""
        import json, os, sys
        from loaderx import DataLoader, DenseDataset
        streams = {"x": DenseDataset(os.path.join(sys.argv[1], "x"))}
        loader = DataLoader(streams, batch_size=6, num_workers=2, worker_mode="process")
        kept = next(loader)
        print(json.dumps({"pids": loader.worker_pids}))
    """, str(root))
    helpers.wait_until(lambda: not any(helpers.alive(p) for p in out["pids"]),
                       "the workers of an exited interpreter ending")


def test_use_in_a_forked_child_is_loader_closed_error(root):
    want = reference(dense(root), 3, seed=9)
    loader = process(dense(root), seed=9)
    assert frozen(next(loader)) == want[0]
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 3
        try:
            next(loader)
            code = 4
        except LoaderClosedError:
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert take(loader, 2) == want[1:3]  # the parent's loader still works
    loader.close()


FORKED_CLOSE = """
import json, os, sys
import _process_helpers as h
from loaderx import DataLoader, DenseDataset
root, how = sys.argv[1:3]
loader = DataLoader({"y": DenseDataset(os.path.join(root, "y"))}, batch_size=6, num_workers=1,
                    prefetch_size=1, worker_mode="process", transform=h.gate_at_step_2)
next(loader), next(loader)
if how == "child closes":
    pid = os.fork()
    if pid == 0:  # a forked child (a checkpoint writer, say) that closes its copy and exits
        loader.close()
        os._exit(0)
    os.waitpid(pid, 0)
print("waiting", flush=True)
batch = next(loader)  # step 2: waits until the test opens the gate
print(json.dumps({"step": loader.step, "y": batch["y"].tolist()}), flush=True)
loader.close()
"""


@pytest.mark.parametrize("how", ["no child", "child closes"])
def test_a_forked_childs_close_leaves_the_parents_loader_alone(root, tmp_path, how):
    """close() in a forked child must not touch the parent's loader: the parent's next()
    still waits asleep (blocked in a system call, not spinning on a wake-up meant for the
    child) and then delivers its step."""
    gate = tmp_path / "gate"
    child = subprocess.Popen([sys.executable, "-c", FORKED_CLOSE, str(root), how],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**ENV, helpers.GATE_VARIABLE: str(gate)})
    below: set[int] = set()
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "waiting"
        below = helpers.descendants(child.pid)
        # A waiting consumer sleeps in poll(); one that spins is (almost) never seen there.
        # "waiting" is printed just before next(): on a loaded machine the consumer may need a
        # while to get into its wait, so the samples start once it has been seen there, and are
        # spread over time rather than taken in one burst.
        helpers.wait_until(lambda: helpers.blocked(child.pid), "the consumer's wait")
        samples = []
        for _ in range(300):
            samples.append(helpers.blocked(child.pid))
            time.sleep(0.001)
        gate.touch()
        out, err = child.communicate(timeout=HANG)
    finally:
        stop(child, below, gate)
    assert child.returncode == 0, err
    assert json.loads(out)["step"] == 3
    assert samples.count(True) >= 200, f"the consumer ran in {samples.count(False)} of 300 " \
        "samples while it had nothing to do but wait"


FORKED_EXIT = """
import json, os, sys
from loaderx import DataLoader, DenseDataset
from loaderx.errors import LoaderClosedError
root, how = sys.argv[1:3]
streams = {"y": DenseDataset(os.path.join(root, "y"))}
with DataLoader(streams, batch_size=6, num_workers=0, seed=2) as reference:
    want = [next(reference)["y"].tolist() for _ in range(6)]
loader = DataLoader(streams, batch_size=6, num_workers=2, worker_mode="process", seed=2)
got = [next(loader)["y"].tolist() for _ in range(3)]
pids = loader.worker_pids
pid = os.fork()
if pid == 0:
    # A forked child that ends normally: sys.exit runs the interpreter's exit hooks
    # (multiprocessing's among them), as a checkpoint writer's or a daemon's end does.
    if how == "touches the loader":
        try:
            next(loader)
        except LoaderClosedError:
            pass
    sys.exit(0)
_, status = os.waitpid(pid, 0)
alive = []
for p in pids:
    try:
        os.kill(p, 0)
        alive.append(True)
    except ProcessLookupError:
        alive.append(False)
got += [next(loader)["y"].tolist() for _ in range(3)]
loader.close()
print(json.dumps({"child": os.waitstatus_to_exitcode(status), "alive": alive,
                  "same": got == want}))
"""


@pytest.mark.parametrize("how", ["exits", "touches the loader"])
def test_a_forked_childs_normal_exit_leaves_the_parents_workers_alone(root, how):
    """A child made by os.fork() that exits normally (running multiprocessing's exit hook,
    which ends the daemonic children it knows of) must leave the parent's workers running."""
    out = run_child(FORKED_EXIT, str(root), how)
    assert out == {"child": 0, "alive": [True, True], "same": True}


def stop(child: subprocess.Popen, below: set[int], gate: pathlib.Path) -> None:
    """Ends a scenario's child however the test went: opens the gate (a worker waiting at
    it finishes), kills the child and what it started if they still run, closes the pipes."""
    gate.touch()
    if child.poll() is None:
        child.kill()
    child.wait()
    for pid in below:
        if helpers.alive(pid):
            os.kill(pid, signal.SIGKILL)
    for pipe in (child.stdout, child.stderr):
        if pipe is not None:
            pipe.close()


# -- start methods ------------------------------------------------------------------------------


PRELOAD_PROBE = """
import os
IMPORTED_BY = os.getpid()


def where(batch):
    return {"y": batch["y"], "preloaded": IMPORTED_BY != os.getpid()}
"""

PRELOADED = """
import json, os, sys
sys.path.insert(0, sys.argv[2])  # the transform's module lies beside the "script", not in cwd
import probe_transform
from loaderx import DataLoader, DenseDataset
from multiprocessing import forkserver
streams = {"y": DenseDataset(os.path.join(sys.argv[1], "y"))}
loader = DataLoader(streams, batch_size=6, num_workers=2, worker_mode="process",
                    start_method="forkserver", transform=probe_transform.where)
server_at_construction = forkserver._forkserver._forkserver_pid is not None
with loader:
    batches = [next(loader) for _ in range(4)]
print(json.dumps({"method": loader.start_method, "server": server_at_construction,
                  "preloaded": [bool(b["preloaded"]) for b in batches]}))
"""


def test_the_fork_server_imports_the_transforms_module_once(root, tmp_path):
    """forkserver workers start with the transform's module (and what it imports: torch,
    torchvision) imported by the server, started as the loader is made -- not imported again
    by every worker -- even when the module is found only through the consumer's sys.path."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "probe_transform.py").write_text(PRELOAD_PROBE)
    (tmp_path / "cwd").mkdir()
    r = subprocess.run([sys.executable, "-c", PRELOADED, str(root), str(tmp_path / "mods")],
                       capture_output=True, text=True, timeout=HANG, env=ENV,
                       cwd=tmp_path / "cwd")
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"method": "forkserver", "server": True, "preloaded": [True] * 4}


FORKSERVER_WITHOUT = """
import json, os, sys, types
from multiprocessing import forkserver
import _process_helpers as helpers
real = forkserver.ensure_running.__self__  # the server multiprocessing itself still uses
how = sys.argv[2]
if how == "no server object":
    del forkserver._forkserver
elif how == "a server object without its fields":
    forkserver._forkserver = types.SimpleNamespace()
else:
    del forkserver.ensure_running
from loaderx import DataLoader, DenseDataset
streams = {"x": DenseDataset(os.path.join(sys.argv[1], "x")),
           "y": DenseDataset(os.path.join(sys.argv[1], "y"))}
def steps(loader):
    return [{k: v.tobytes() for k, v in next(loader).items()} for _ in range(4)]
with DataLoader(streams, batch_size=6, num_workers=0, transform=helpers.augment,
                seed=8) as threads:
    want = steps(threads)
loader = DataLoader(streams, batch_size=6, num_workers=2, worker_mode="process",
                    start_method="forkserver", transform=helpers.augment, seed=8)
started_early = real._forkserver_pid is not None
with loader:
    same = steps(loader) == want
print(json.dumps({"method": loader.start_method, "same": same, "started_early": started_early,
                  "variable_left": "LOADERX_FORKSERVER_PRELOAD" in os.environ}))
"""


@pytest.mark.parametrize("how", ["no server object", "a server object without its fields",
                                 "no ensure_running"])
def test_a_forkserver_without_the_private_attributes_starts_workers_unpreloaded(root, how):
    """The fork server's preload reads multiprocessing's private server object: a Python whose
    ``multiprocessing.forkserver`` lacks it (or its fields, or ``ensure_running``) gets no
    preload -- the server is not started as the loader is made -- and forkserver workers that
    import the transform's module themselves, giving the thread loader's batches."""
    out = run_child(FORKSERVER_WITHOUT, str(root), how)
    assert out == {"method": "forkserver", "same": True, "started_early": False,
                   "variable_left": False}, out


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_each_start_method_gives_the_same_batches(root, method):
    want = reference(mixed(root), 5, transform=helpers.augment, seed=11)
    with process(mixed(root), transform=helpers.augment, seed=11,
                 start_method=method) as loader:
        assert take(loader, 5) == want
        assert loader.start_method == method


def test_auto_start_method_for_a_lambda(root):
    """A lambda does not pickle: auto forks in a single-threaded process, and refuses in a
    process with threads (where fork is not safe), naming the fix."""
    out = run_child("""
        import json, os, sys, threading
        from loaderx import DataLoader, DenseDataset
        from loaderx.errors import LoaderxTypeError
        streams = {"y": DenseDataset(os.path.join(sys.argv[1], "y"))}
        out = {}
        with DataLoader(streams, batch_size=6, num_workers=2, worker_mode="process", seed=1,
                        transform=lambda b: {"y": b["y"] + 1}) as loader:
            got = [next(loader)["y"].tolist() for _ in range(3)]
            out["method"] = loader.start_method
        with DataLoader(streams, batch_size=6, num_workers=0, seed=1) as threads:
            out["same"] = got == [(next(threads)["y"] + 1).tolist() for _ in range(3)]
        stop = threading.Event()
        other = threading.Thread(target=stop.wait)
        other.start()
        try:
            with DataLoader(streams, batch_size=6, num_workers=2, worker_mode="process",
                            transform=lambda b: b) as loader:
                next(loader)
            out["threaded"] = "no error"
        except LoaderxTypeError as e:
            out["threaded"] = str(e)
        finally:
            stop.set()
            other.join()
        print(json.dumps(out))
    """, str(root))
    assert out["method"] == "fork" and out["same"], out
    assert out["threaded"] != "no error" and "start_method" in out["threaded"], out


# -- workers kept between passes ----------------------------------------------------------------


def _pass_draws(loader: DataLoader, pass_id: int) -> tuple[list[Any], dict[int, Any]]:
    """A pass's labels in order, and each worker's first draw from np.random in it."""
    labels, first = [], {}
    for batch in loader.epoch(pass_id=pass_id):
        labels.append(batch["y"].tobytes())
        first.setdefault(batch["pid"], batch["np"])
    return labels, first


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_finished_pass_leaves_its_workers_to_the_next(root, method):
    """The next epoch() runs on the workers the last one finished with, reseeded as fresh
    workers of that pass would be (so the same pass_id draws the same first numbers), and
    gives the batches a fresh set gives."""
    with DataLoader(dense(root), batch_size=BATCH, num_workers=0) as threads:
        want = [b["y"].tobytes() for b in threads.epoch()]
    with process(dense(root), transform=helpers.numpy_draws, start_method=method) as loader:
        labels, first = _pass_draws(loader, 0)
        assert labels == want
        kept = loader._parking.parked_pids
        assert sorted(kept) == sorted(first), "the finished pass's workers are parked"
        again, first_again = _pass_draws(loader, 0)
        assert again == want
        assert sorted(first_again) == sorted(first), "the second pass ran on the same workers"
        assert first_again == first, "reseeded: each worker's stream starts over"
        other, first_other = _pass_draws(loader, 1)
        assert other == want and sorted(first_other) == sorted(first)
        assert not set(first_other.values()) & set(first.values()), "pass 1: other streams"
    assert_reaped(kept)


def test_an_abandoned_or_forked_pass_keeps_no_workers(root):
    """A pass left half way ends its workers (a step may be in flight); so does a forked
    one (its job was inherited, never pickled); the next pass starts fresh ones."""
    with process(dense(root), transform=helpers.numpy_draws, start_method="forkserver") as lx:
        half = lx.epoch()
        next(half)
        pids = {next(half)["pid"]} | set(half._pipe.worker_pids)
        half.close()
        assert lx._parking.parked_pids == []
        assert_reaped(sorted(pids))
        fresh = {b["pid"] for b in lx.epoch()}
        assert not fresh & pids
    with process(dense(root), start_method="fork") as forked:
        assert len(list(forked.epoch())) == 11
        assert forked._parking.parked_pids == []


def test_parked_workers_end_with_the_loader_and_a_dead_one_is_replaced(root):
    """Closing or dropping the loader reaps the parked workers; one killed while parked makes
    the next pass start a whole fresh set, with no error."""
    loader = process(dense(root), transform=helpers.numpy_draws, start_method="forkserver")
    assert len(list(loader.epoch())) == 11
    parked = loader._parking.parked_pids
    assert len(parked) == 2
    os.kill(parked[0], signal.SIGKILL)  # the next pass may find it still exiting
    pids = {b["pid"] for b in loader.epoch()}
    assert not pids & set(parked)
    assert_reaped(parked)
    now = loader._parking.parked_pids
    assert sorted(now) == sorted(pids)
    loader.close()
    assert_reaped(now)
    dropped = process(dense(root), transform=helpers.numpy_draws, start_method="forkserver")
    assert len(list(dropped.epoch())) == 11
    gone = dropped._parking.parked_pids
    del dropped
    gc.collect()
    assert_reaped(gone)


def test_batches_held_from_a_finished_pass_stay_intact_in_the_next(root):
    """A reused worker keeps the segments of batches the consumer still holds out of reach:
    the first pass's arrays read the same after the second pass ran on the same workers."""
    with process(dense(root), transform=helpers.numpy_draws, start_method="forkserver") as lx:
        held = list(lx.epoch())
        before = [frozen(b) for b in held]
        assert len(list(lx.epoch())) == 11
        assert [frozen(b) for b in held] == before


def test_the_endless_stream_takes_over_a_finished_pass_s_workers(root):
    """After a finished epoch() the loader's own stream runs on the parked workers, with the
    batches a fresh loader gives, each worker's generator seeded as a fresh one's."""
    def run(loader: DataLoader) -> tuple[list[bytes], list[float], set[int]]:
        labels, first = [], {}
        for b in itertools.islice(loader, 8):
            labels.append(b["y"].tobytes())
            first.setdefault(b["pid"], b["np"])
        return labels, sorted(first.values()), set(first)

    with process(dense(root), transform=helpers.numpy_draws, start_method="spawn") as fresh:
        want_labels, want_first, _ = run(fresh)
    with process(dense(root), transform=helpers.numpy_draws, start_method="spawn") as loader:
        assert len(list(loader.epoch())) == 11
        parked = loader._parking.parked_pids
        labels, first, pids = run(loader)
        assert pids == set(parked) and loader._parking.parked_pids == []
        assert labels == want_labels and first == want_first


START_CHOICE = """
import json, os, sys, threading, warnings
warnings.simplefilter("error", DeprecationWarning)  # the user never sees fork's warning
import _process_helpers as helpers
from loaderx import DataLoader, DenseDataset
case = sys.argv[2]
if case == "torch":
    import torch
    model = torch.nn.Linear(8, 8)  # a model on the CPU: no CUDA context
    model(torch.zeros(1, 8))
stop = threading.Event()
if case == "thread":
    threading.Thread(target=stop.wait, daemon=True).start()
streams = {"x": DenseDataset(os.path.join(sys.argv[1], "x")),
           "y": DenseDataset(os.path.join(sys.argv[1], "y"))}
with DataLoader(streams, batch_size=6, num_workers=0, transform=helpers.augment,
                seed=3) as reference:
    want = [next(reference)["y"].tolist() for _ in range(3)]
with DataLoader(streams, batch_size=6, num_workers=2, worker_mode="process",
                transform=helpers.augment, seed=3) as loader:
    got = [next(loader)["y"].tolist() for _ in range(3)]
    method, reported = loader.start_method, loader.stats().start_method
stop.set()
print(json.dumps({"method": method, "reported": reported, "same": got == want}))
"""


@pytest.mark.parametrize(("case", "method"), [("plain", "fork"), ("thread", "forkserver"),
                                              ("torch", "fork")])
def test_auto_forks_where_it_is_safe_and_says_so(root, case, method):
    """Issue 48, section 3: fork when no other Python thread runs and no CUDA context exists
    (torch imported and a model built on the CPU is safe), forkserver otherwise; the choice is
    loader.start_method and in stats(); no DeprecationWarning reaches the user."""
    if case == "torch":
        pytest.importorskip("torch")
    out = run_child(START_CHOICE, str(root), case)
    assert out == {"method": method, "reported": method, "same": True}, out
