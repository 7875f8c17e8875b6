"""Many threads mixing loaders over shared datasets (issue 32): the Python layers' shared state
-- the loader's window and its buffer pools, the packed view's caches, the concatenated and
subset views, the prefetchers a loader counts, ``close()`` racing ``next()`` -- checked without
a GIL. Written for a free-threaded interpreter (scripts/test_freethreaded.sh runs the suite
under 3.13t), where Python code of several threads really runs at once; under the GIL it runs
too and checks the same things with coarser interleaving.

Every thread does a fixed amount of work (no loop runs "for N seconds": a loaded machine makes
the test longer, not thinner), waits on events rather than sleeps, and every batch and every
gather is compared with the answer computed on one thread before the threads start. Running
at once, on the same dataset objects:

* loaders of five configurations (dense and ragged streams, a concatenation, a subset, packed
  token rows; 0, 1 and 2 worker threads), each thread with loaders of its own, taking batches,
  ``seek``-ing, checkpointing (``state_dict`` checked, a new loader resumed from it), opening a
  finite pass, and creating and closing prefetchers while another thread asks ``state_dict()``;
* one loader shared by three consumer threads: together they get each step exactly once;
* ``close()`` from one thread while another is inside ``next()``: the consumer gets right
  batches, then ``LoaderClosedError``, nothing else;
* gathers of every view (dense, ragged, concatenated, subset, packed rows and their segment
  ids);
* on another store, appends, deletes and compactions by one thread while others read it: every
  record read is intact, and at the end the store holds exactly the records appended and not
  deleted.
"""

from __future__ import annotations

import dis
import itertools
import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import reliability as rel
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
from loaderx._loader.window import Window
from loaderx.errors import LoaderClosedError, StoreBusyError
from loaderx.prefetch import Prefetcher
from loaderx.zrecord import Zrecord

N = 1200
X = (np.arange(N * 8, dtype=np.int64).reshape(N, 8) * 7919) % 100003
RAGGED = [np.arange(i % 13, dtype=np.int16) + i for i in range(N)]
DOCS = [np.arange(1, 2 + i % 29, dtype=np.int32) + i for i in range(N)]
BATCH = 16
#: Steps every configuration's reference covers; loaders stay below it.
STEPS = 48
SEQ_LEN = 32


def per_sample(batch: dict[str, Any]) -> dict[str, Any]:
    """A Python loop over the batch's rows (what holds the GIL on a GIL build)."""
    out = dict(batch)
    out["sums"] = np.array([int(row.sum()) for row in batch["x"]], dtype=np.int64)
    return out


def frozen(value: Any) -> Any:
    """A batch as nested tuples of dtypes, shapes and bytes, for comparing."""
    if isinstance(value, dict):
        return tuple((k, frozen(v)) for k, v in sorted(value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    return value


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ft_stress")
    from_numpy(root / "x", X, codec="zstd", checksums=True)
    from_numpy(root / "x_raw", X, codec="raw")
    from_numpy(root / "x_lo", X[: N // 3], codec="zstd")
    from_numpy(root / "x_hi", X[N // 3:], codec="raw")
    from_iterator(root / "r", RAGGED, codec="zstd")
    from_iterator(root / "docs", DOCS, codec="zstd")
    x = DenseDataset(root / "x", verify_reads=True)
    r = RaggedDataset(root / "r")
    concat = ConcatDataset([root / "x_lo", root / "x_hi"])
    picks = np.random.default_rng(5).permutation(N)[: N // 2]
    sub_x = Subset(DenseDataset(root / "x_raw"), picks)
    sub_r = Subset(r, picks)
    packed = pack(RaggedDataset(root / "docs"), SEQ_LEN, seed=3, eos_id=0)
    out = {"root": root, "x": x, "r": r, "concat": concat, "sub_x": sub_x, "sub_r": sub_r,
           "picks": picks, "packed": packed}
    yield out
    for name in ("x", "r", "concat", "sub_x", "packed"):
        out[name].close()


def configurations(d: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """name -> (streams, loader keywords); every loader of a name shares the dataset objects."""
    return {
        "dense+ragged": ({"x": d["x"], "r": d["r"]}, {"num_workers": 2, "seed": 1}),
        "concat": ({"x": d["concat"]}, {"num_workers": 1, "seed": 2, "transform": per_sample}),
        "subset": ({"x": d["sub_x"], "r": d["sub_r"]}, {"num_workers": 0, "seed": 3}),
        "packed": ({"t": d["packed"]}, {"num_workers": 2, "seed": 4, "mode": "iid"}),
        "python": ({"x": d["x"]}, {"num_workers": 2, "seed": 5, "transform": per_sample,
                                   "prefetch_size": 1}),
    }


def references(d: dict[str, Any]) -> dict[str, list[Any]]:
    """Each configuration's steps 0..STEPS-1 and its first pass batches, on this thread."""
    refs: dict[str, list[Any]] = {}
    for name, (streams, kw) in configurations(d).items():
        with DataLoader(streams, batch_size=BATCH, **{**kw, "num_workers": 0}) as loader:
            refs[name] = [frozen(next(loader)) for _ in range(STEPS)]
            refs[name + ":pass"] = [frozen(b) for b in itertools.islice(loader.epoch(), 3)]
    return refs


class Runner:
    """Threads that each run a fixed piece of work; the first failure of any is kept."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.problems: list[str] = []
        self.lock = threading.Lock()

    def add(self, name: str, fn: Callable[..., None], *args: Any) -> None:
        def run() -> None:
            try:
                fn(*args)
            except BaseException as e:  # reported by join
                with self.lock:
                    self.problems.append(f"{name}: {type(e).__name__}: {e}")
        self.threads.append(threading.Thread(target=run, name=name))

    def run(self) -> None:
        for t in self.threads:
            t.start()
        for t in self.threads:
            t.join(rel.HANG_SECONDS)
        hung = [t.name for t in self.threads if t.is_alive()]
        assert not hung, f"threads still running after {rel.HANG_SECONDS:.0f} s: {hung}"
        assert self.problems == [], self.problems[:5]


def churn_prefetchers(runner: Runner, loader: DataLoader, *, rounds: int, asks: int,
                      names: tuple[str, str], seek_every: int = 0) -> None:
    """Adds to ``runner`` two threads (``<names[0]>-0``, ``-1``) each making and closing eight
    prefetchers over ``loader``, ``rounds`` times, and a third (``names[1]``) asking
    ``state_dict()`` (which counts the prefetchers' batches) while they come and go: at least
    ``asks`` times and until both are done, with a ``seek(0)`` (which tells every prefetcher
    it moved) every ``seek_every`` asks when that is not 0. The step stays 0 throughout."""
    made = threading.Event()
    churned = [threading.Event(), threading.Event()]

    def churn(k: int) -> None:
        try:
            for _ in range(rounds):
                held = [Prefetcher(loader, lambda b: b) for _ in range(8)]
                made.set()
                for p in held:
                    p.close()
        finally:
            made.set()
            churned[k].set()

    def ask() -> None:
        made.wait(rel.HANG_SECONDS)
        asked = 0
        while asked < asks or not all(e.is_set() for e in churned):
            assert loader.state_dict()["step"] == 0
            if seek_every and asked % seek_every == 0:
                loader.seek(0)
            asked += 1

    runner.add(f"{names[0]}-0", churn, 0)
    runner.add(f"{names[0]}-1", churn, 1)
    runner.add(names[1], ask)


def test_threads_mixing_loaders_gathers_and_writes(data, tmp_path):
    refs = references(data)
    configs = configurations(data)
    runner = Runner()

    # -- loaders of their own: next, seek, state_dict and resume, passes, prefetchers --------
    def own_loaders(name: str, seed: int) -> None:
        streams, kw = configs[name]
        rng = np.random.default_rng(seed)
        ref = refs[name]
        loader = DataLoader(streams, batch_size=BATCH, **kw)
        try:
            for _ in range(60):
                action = rng.integers(0, 10)
                if loader.step >= STEPS - 1 or action == 0:
                    loader.seek(int(rng.integers(0, STEPS - 1)))
                elif action == 1:
                    state = loader.state_dict()
                    assert state["step"] == loader.step, (state, loader.step)
                    loader.close()
                    loader = DataLoader(streams, batch_size=BATCH, **kw)
                    loader.load_state_dict(state)
                    assert loader.step == state["step"]
                elif action == 2:
                    with loader.epoch() as passing:
                        got = [frozen(b) for b in itertools.islice(passing, 3)]
                    assert got == refs[name + ":pass"], f"{name}: a pass's batches differ"
                else:
                    step = loader.step
                    got = frozen(next(loader))
                    assert got == ref[step], f"{name}: step {step} differs from its reference"
        finally:
            loader.close()

    for i, name in enumerate(configs):
        for k in range(2):
            runner.add(f"own-{name}-{k}", own_loaders, name, 100 + 10 * i + k)

    # -- one loader, three consumers: every step once -----------------------------------------
    shared_streams, shared_kw = configs["dense+ragged"]
    shared = DataLoader(shared_streams, batch_size=BATCH, **shared_kw)
    taken: list[list[Any]] = [[] for _ in range(3)]

    def shared_consumer(k: int) -> None:
        for _ in range(STEPS // 3):
            taken[k].append(frozen(next(shared)))

    for k in range(3):
        runner.add(f"shared-{k}", shared_consumer, k)

    # -- prefetchers made and closed beside state_dict() on one loader ---------------------------
    counted = DataLoader({"x": data["x"]}, batch_size=BATCH, num_workers=0, seed=9)
    churn_prefetchers(runner, counted, rounds=300, asks=1000,
                      names=("prefetchers", "checkpoints"))

    # -- close() racing next() ------------------------------------------------------------------
    def close_racer(seed: int) -> None:
        """A consumer takes batches (seeking back before it runs out of references) until the
        loader is closed under it, some batches in: right batches, then LoaderClosedError."""
        rng = np.random.default_rng(seed)
        streams, kw = configs["python"]
        for _ in range(6):
            workers = int(rng.integers(0, 3))
            loader = DataLoader(streams, batch_size=BATCH, **{**kw, "num_workers": workers})
            took_enough = threading.Event()
            outcome: list[str] = []

            def consume(loader: DataLoader = loader, want: int = int(rng.integers(1, 4)),
                        took_enough: threading.Event = took_enough,
                        outcome: list[str] = outcome) -> None:
                got = 0
                try:
                    while True:
                        if loader.step >= STEPS - 1:
                            loader.seek(0)
                        step = loader.step
                        if frozen(next(loader)) != refs["python"][step]:
                            outcome.append(f"step {step} differs from its reference")
                            return
                        got += 1
                        if got >= want:
                            took_enough.set()
                except LoaderClosedError:
                    outcome.append("closed")
                except BaseException as e:
                    outcome.append(f"{type(e).__name__}: {e}")
                finally:
                    took_enough.set()

            consumer = threading.Thread(target=consume)
            consumer.start()
            took_enough.wait(rel.HANG_SECONDS)
            loader.close()
            consumer.join(rel.HANG_SECONDS)
            assert not consumer.is_alive(), "next() did not return after close()"
            assert outcome == ["closed"], outcome

    runner.add("close-0", close_racer, 7)
    runner.add("close-1", close_racer, 8)

    # -- gathers of every view ------------------------------------------------------------------
    packed_rows = data["packed"][np.arange(len(data["packed"]))]
    packed_seg, packed_pos = data["packed"].segments(np.arange(len(data["packed"])))
    picks = data["picks"]

    def gatherer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(150):
            idx = rng.integers(0, N, 24)
            np.testing.assert_array_equal(data["x"][idx], X[idx])
            np.testing.assert_array_equal(data["concat"].gather(idx.astype(np.uint64)), X[idx])
            for got, want in zip(data["r"][idx], idx, strict=True):
                np.testing.assert_array_equal(got, RAGGED[want])
            sub = rng.integers(0, len(picks), 24)
            np.testing.assert_array_equal(data["sub_x"][sub], X[picks[sub]])
            for got, want in zip(data["sub_r"][sub], picks[sub], strict=True):
                np.testing.assert_array_equal(got, RAGGED[want])
            rows = rng.integers(0, len(packed_rows), 8)
            np.testing.assert_array_equal(data["packed"][rows], packed_rows[rows])
            seg, pos = data["packed"].segments(rows)
            np.testing.assert_array_equal(seg, packed_seg[rows])
            np.testing.assert_array_equal(pos, packed_pos[rows])

    for k in range(3):
        runner.add(f"gather-{k}", gatherer, 200 + k)

    # -- appends, deletes and compaction on another store, read meanwhile ------------------------
    # A delete moves the last records into the holes, so a reader's two calls (lengths, then
    # gather) must not straddle one: deletes wait for the readers in flight (`reading`), appends
    # and compactions do not (a compaction beside reads is refused cleanly, StoreBusyError).
    store = Zrecord(tmp_path / "w", codec="zstd")
    appended: set[int] = set()
    deleted: set[int] = set()
    writing = threading.Event()
    reading = threading.Condition()
    readers_in = [0]

    def record(ident: int) -> bytes:
        body = struct.pack("<Q", ident) + bytes((ident * 31 + j) & 0xFF for j in range(ident % 200))
        return body + struct.pack("<I", zlib.crc32(body))

    def ident_of(rec: bytes) -> int:
        body, crc = rec[:-4], struct.unpack("<I", rec[-4:])[0]
        assert zlib.crc32(body) == crc, "a record read back is damaged"
        ident = struct.unpack("<Q", body[:8])[0]
        assert rec == record(ident), f"record {ident} holds other bytes"
        return ident

    def writer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        next_id = 0
        for round_ in range(40):
            recs = [record(next_id + j) for j in range(int(rng.integers(1, 30)))]
            appended.update(range(next_id, next_id + len(recs)))  # before: readers may see them
            store.append(*rel.pack(recs))
            next_id += len(recs)
            writing.set()
            if len(store) > 10 and rng.random() < 0.5:
                idx = np.unique(rng.integers(0, len(store), int(rng.integers(1, 6))))
                idx = idx.astype(np.uint64)
                with reading:
                    reading.wait_for(lambda: readers_in[0] == 0)
                    deleted.update(ident_of(r) for r in rel.read_records(store, idx))
                    store.delete(idx)
            if round_ % 10 == 9:
                try:
                    store.compact()
                except StoreBusyError:  # readers in flight: refused cleanly
                    pass

    def store_reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        writing.wait(rel.HANG_SECONDS)
        for _ in range(300):
            with reading:
                readers_in[0] += 1
            try:
                idx = rng.integers(0, len(store), 12).astype(np.uint64)
                recs = rel.read_records(store, idx)
            except StoreBusyError:
                continue  # a compaction in flight
            finally:
                with reading:
                    readers_in[0] -= 1
                    reading.notify_all()
            for rec in recs:
                assert ident_of(rec) in appended, "a record that was never appended"

    runner.add("writer", writer, 300)
    for k in range(2):
        runner.add(f"store-reader-{k}", store_reader, 310 + k)

    runner.run()
    shared.close()
    counted.close()

    # The shared loader's consumers together got each of its first steps exactly once.
    together = sorted(b for part in taken for b in part)
    assert together == sorted(refs["dense+ragged"][: len(together)])
    assert len(together) == 3 * (STEPS // 3)
    # The store holds exactly what was appended and not deleted, intact.
    everything = np.arange(len(store), dtype=np.uint64)
    idents = [ident_of(r) for r in rel.read_records(store, everything)]
    assert sorted(idents) == sorted(appended - deleted)
    store.close()


def test_state_dict_while_prefetchers_come_and_go(data):
    """A loader counts the prefetchers reading it ahead: two threads making and closing
    prefetchers over it while a third asks ``state_dict()`` (which walks them) and ``seek()``s.
    (A ``weakref.WeakSet`` of them raised "Set changed size during iteration", with the GIL
    too.)"""
    loader = DataLoader({"x": data["x"]}, batch_size=BATCH, num_workers=0, seed=9)
    runner = Runner()
    churn_prefetchers(runner, loader, rounds=1500, asks=2000, names=("churn", "ask"),
                      seek_every=100)
    runner.run()
    loader.close()


def test_no_call_between_taking_a_step_and_recording_it():
    """Window.take consumes a step (``item = ready[step]``, ``del ready[step]``) and records it
    (``taken = True``) with no call in between: a signal handler runs after a call returns, and
    one that closes the loader there empties ``ready`` under it (a KeyError seen under 3.13t
    when an ``isinstance`` stood there; tests/test_process_workers.py closes loaders from a
    handler at random points). Checked on the bytecode, where the race is too rare to hit."""
    ins = list(dis.get_instructions(Window.take))
    start = next(i for i, x in enumerate(ins) if x.opname == "STORE_FAST" and x.argval == "item")
    end = next(i for i, x in enumerate(ins)
               if i > start and x.opname == "STORE_FAST" and x.argval == "taken")
    assert [x.opname for x in ins[start:end] if "CALL" in x.opname] == []
