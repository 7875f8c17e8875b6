"""Reliability under abuse: processes killed mid-append, readers racing appenders, and many
stores opened and closed. The heavy versions run from ``scripts/stress.py``."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

import reliability as rel
from loaderx.zrecord import Zrecord

# The kill loops check the store after every kill (and raise AssertionError on any damage).
# Every other kill is aimed: the child is stopped inside the native call and killed there, so
# the counts of kills inside native calls below hold on any machine, however loaded, unless the
# children no longer make those calls. What makes them counts of kills rather than of rounds:
# a kill counts only when the child's wait status says the SIGKILL ended it (a child that died
# of an error of its own, in a native call or not, exits with status 1), and the in-native
# flag it counts by is the one the child itself left in shared memory when it died.


def test_sigkill_during_store_appends(tmp_path):
    stats = rel.kill_loop(str(tmp_path / "s"), kills=40, seed=1, use_converter=False)
    # Every child was still appending when the SIGKILL came: none ended by itself.
    assert stats["sigkilled"] == stats["kills"] == 40, f"children that were not killed: {stats}"
    assert stats["in_native"] - stats["in_sync"] >= 10, f"kills inside append(): {stats}"
    assert stats["in_sync"] >= 10, f"kills inside sync(): {stats}"


def test_sigkill_during_conversions(tmp_path):
    stats = rel.kill_loop(str(tmp_path / "c"), kills=15, seed=2, use_converter=True)
    assert stats["sigkilled"] == stats["kills"] == 15, f"children that were not killed: {stats}"
    assert stats["in_native"] >= 7, f"kills inside a conversion: {stats}"
    # Aimed kills come after a conversion returned, so a dataset was made and checked.
    assert stats["max_records"] > 0, stats
    # Staging directories of killed conversions are cleaned up by the next conversion.
    assert len(os.listdir(tmp_path)) <= 2


def test_sigkill_during_compaction(tmp_path):
    stats = rel.compact_kill_loop(str(tmp_path / "k"), kills=20, seed=3)
    # Every child was still compacting, or waiting after its compaction, when the SIGKILL came.
    assert stats["sigkilled"] == stats["kills"], f"children that were not killed: {stats}"
    assert stats["in_native"] >= 10, f"kills inside compact(): {stats}"


def test_readers_verify_every_byte_while_two_threads_append(tmp_path):
    # The race runs on until these counts are reached: on a loaded machine it takes longer.
    counts = rel.race(str(tmp_path / "s"), seconds=2.0, readers=6, appenders=2,
                      min_gathers=50, min_appends=10, min_fresh=100)
    assert counts["problems"] == []
    assert counts["gathers"] >= 50 and counts["appends"] >= 10, counts
    assert counts["fresh"] >= 100, f"readers read records appended during the race: {counts}"


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
