"""Reliability under abuse: processes killed mid-append, readers racing appenders, and many
stores opened and closed. The heavy versions run from ``scripts/stress.py``."""

from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess
import sys
import threading
import time

import numpy as np

import reliability as rel
from loaderx.zrecord import Zrecord


def test_sigkill_during_store_appends(tmp_path):
    stats = rel.kill_loop(str(tmp_path / "s"), kills=40, seed=1, use_converter=False)
    assert stats["kills"] == 40
    assert stats["batches"] > 40, "the children got to append before being killed"
    assert stats["in_native"] > 0, "some kills landed inside a native append or sync"


def test_sigkill_during_conversions(tmp_path):
    stats = rel.kill_loop(str(tmp_path / "c"), kills=15, seed=2, use_converter=True)
    assert stats["kills"] == 15 and stats["max_records"] > 0
    # Staging directories of killed conversions are cleaned up by the next conversion.
    assert len(os.listdir(tmp_path)) <= 2


def test_readers_verify_every_byte_while_two_threads_append(tmp_path):
    z = Zrecord(tmp_path / "s", codec="zstd")
    src, offsets = rel.pack([rel.make_record(i) for i in range(500)])
    z.append(src, offsets)
    lock = threading.Lock()  # appenders take turns choosing indices, not writing
    next_index = [500]
    stop = threading.Event()
    problems: list[str] = []
    counts = {"gathers": 0, "records": 0, "appends": 0}

    def appender(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            k = rng.randrange(1, 50)
            # Indices are assigned by the store; records embed theirs, so build them under a
            # lock that also covers the append, and check the index the store returned.
            with lock:
                first = next_index[0]
                recs = [rel.make_record(first + j) for j in range(k)]
                got = z.append(*rel.pack(recs), codec=rng.choice(["raw", "zstd"]))
                next_index[0] += k
            if got != first:
                problems.append(f"append returned {got}, expected {first}")
            counts["appends"] += 1

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            n = len(z)
            idx = rng.integers(0, n, size=64).astype(np.uint64)
            for i, rec in zip(idx, rel.read_records(z, idx)):
                p = rel.check_record(int(i), rec)
                if p:
                    problems.append(p)
            counts["gathers"] += 1
            counts["records"] += len(idx)

    threads = [threading.Thread(target=appender, args=(s,)) for s in (1, 2)]
    threads += [threading.Thread(target=reader, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join()
    assert problems == []
    assert counts["gathers"] > 50 and counts["appends"] > 10
    assert rel.verify_store(z) == []
    z.close()


def test_opening_and_closing_many_stores_leaks_nothing(tmp_path):
    for i in range(3):
        with Zrecord(tmp_path / f"s{i}") as z:
            z.append(*rel.pack([rel.make_record(j) for j in range(20)]))

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def maps() -> int:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    # Warm up (the pool, allocator arenas), then count.
    for i in range(20):
        with Zrecord(tmp_path / f"s{i % 3}") as z:
            rel.read_records(z, np.arange(5, dtype=np.uint64))
    before = (fds(), maps())
    for i in range(1000):
        with Zrecord(tmp_path / f"s{i % 3}") as z:
            rel.read_records(z, np.arange(5, dtype=np.uint64))
    after = (fds(), maps())
    assert after[0] <= before[0], f"file descriptors: {before[0]} -> {after[0]}"
    assert after[1] <= before[1] + 8, f"mappings: {before[1]} -> {after[1]}"


def test_fuzzed_stores_give_data_or_a_clear_error():
    """2000 seeded mutations of a dataset's header, table, chunk bytes, dict.zr and
    schema.msgpack (scripts/fuzz_store.py; the stress run does 100,000): every read ends in data
    or a ZrecordError/OSError, never a panic, crash or hang. Runs in a subprocess so that a crash
    fails this test instead of killing the suite."""
    script = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "fuzz_store.py"
    r = subprocess.run([sys.executable, str(script), "--cases", "2000", "--seed", "7",
                        "--hang-seconds", "30"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["cases"] == 2000 and summary["unclear"] == 0
    assert summary["data"] > 0 and summary["error"] > 0
