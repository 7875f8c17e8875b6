"""Shared pieces of the reliability tests and ``scripts/stress.py``: self-checking records, a
store reader that verifies them, and the crash-by-SIGKILL loop.

A record carries its own identity: 8 bytes of index, 4 of payload length, a payload derived from
the index, and a CRC-32 of everything before it. A torn, misplaced or stale record fails the check.
"""

from __future__ import annotations

import mmap
import os
import random
import signal
import struct
import time
import zlib

import numpy as np

from ref_peer import pack  # records -> (buffer, offsets), as Zrecord.append takes them

HEAD = struct.Struct("<QI")


def make_record(index: int, size_seed: int | None = None) -> bytes:
    rng = random.Random(index if size_seed is None else size_seed)
    n = rng.randrange(0, 3000)
    payload = bytes((index * 7 + i // 3) & 0xFF for i in range(n))
    body = HEAD.pack(index, n) + payload
    return body + struct.pack("<I", zlib.crc32(body))


def check_record(index: int, rec: bytes) -> str | None:
    """None when ``rec`` is record ``index`` intact, else what is wrong."""
    if len(rec) < HEAD.size + 4:
        return f"record {index}: {len(rec)} bytes, too short"
    body, crc = rec[:-4], struct.unpack("<I", rec[-4:])[0]
    if zlib.crc32(body) != crc:
        return f"record {index}: checksum mismatch"
    got, n = HEAD.unpack_from(body)
    if got != index or n != len(body) - HEAD.size:
        return f"record {index}: holds record {got}"
    return None


def read_records(z, idx: np.ndarray) -> list[bytes]:
    lens = z.lengths(idx).astype(np.uint64)
    offsets = np.zeros(len(idx), dtype=np.uint64)
    np.cumsum(lens[:-1], out=offsets[1:])
    dst = np.empty(int(lens.sum()), dtype=np.uint8)
    z.gather(idx, dst, offsets)
    return [dst[int(o):int(o) + int(n)].tobytes() for o, n in zip(offsets, lens)]


def verify_store(z) -> list[str]:
    """Problems found reading every record of ``z`` (empty: all intact)."""
    n = len(z)
    problems = []
    for start in range(0, n, 4096):
        idx = np.arange(start, min(n, start + 4096), dtype=np.uint64)
        for i, rec in zip(idx, read_records(z, idx)):
            p = check_record(int(i), rec)
            if p:
                problems.append(p)
    return problems


class Shared:
    """A few int64 counters in anonymous shared memory, written by a forked child and read by
    the parent after it killed the child: [committed records, in-native flag, batches]."""

    def __init__(self) -> None:
        self.mem = mmap.mmap(-1, 64)

    def get(self, i: int) -> int:
        return struct.unpack_from("<q", self.mem, i * 8)[0]

    def set(self, i: int, v: int) -> None:
        struct.pack_into("<q", self.mem, i * 8, v)


COMMITTED, IN_NATIVE, BATCHES = 0, 1, 2


def child_appends(path: str, shared: Shared, seed: int, use_converter: bool) -> None:
    """Appends self-checking records until killed; some batches are followed by sync().
    Publishes the count of committed (synced or converter-returned) records."""
    from loaderx.zrecord import Zrecord

    rng = random.Random(seed)
    if use_converter:
        from loaderx.converter import from_iterator

        n = shared.get(COMMITTED)
        while True:
            k = rng.randrange(1, 60)
            recs = [make_record(n + j) for j in range(k)]
            shared.set(IN_NATIVE, 1)
            n = from_iterator(path, recs, codec=rng.choice(["raw", "zstd"]),
                              chunk_bytes=rng.choice([2000, 1 << 20]), progress=False)
            shared.set(IN_NATIVE, 0)
            shared.set(COMMITTED, n)
            shared.set(BATCHES, shared.get(BATCHES) + 1)
    z = Zrecord(path)
    n = len(z)
    while True:
        k = rng.randrange(1, 80)
        src, offsets = pack([make_record(n + j) for j in range(k)])
        shared.set(IN_NATIVE, 1)
        z.append(src, offsets, codec=rng.choice(["raw", "zstd"]))
        shared.set(IN_NATIVE, 0)
        n += k
        if rng.random() < 0.3:
            shared.set(IN_NATIVE, 1)
            z.sync()
            shared.set(IN_NATIVE, 0)
            shared.set(COMMITTED, n)
        shared.set(BATCHES, shared.get(BATCHES) + 1)


def kill_loop(path: str, kills: int, seed: int, use_converter: bool) -> dict[str, int]:
    """Forks a child that appends to ``path`` and SIGKILLs it at seeded random moments,
    ``kills`` times; after each kill the store must open with every committed record and every
    record below its length intact, and must accept appends. Returns counts for the report."""
    from loaderx.zrecord import Zrecord

    rng = random.Random(seed)
    stats = {"kills": 0, "in_native": 0, "max_records": 0, "batches": 0}
    shared = Shared()
    for k in range(kills):
        if use_converter and not os.path.exists(os.path.join(path, "schema.msgpack")):
            shared.set(COMMITTED, 0)  # the converter creates the dataset
        else:
            with Zrecord(path) as z:  # creates the store on the first round
                shared.set(COMMITTED, len(z))
        shared.set(IN_NATIVE, 0)
        shared.set(BATCHES, 0)
        pid = os.fork()
        if pid == 0:
            try:
                child_appends(path, shared, seed * 1000 + k, use_converter)
            finally:
                os._exit(1)
        # Conversions sync (several fsyncs) on every call, so they get longer to run.
        time.sleep(rng.uniform(0.002, 0.25 if use_converter else 0.06))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        stats["kills"] += 1
        stats["in_native"] += shared.get(IN_NATIVE)
        stats["batches"] += shared.get(BATCHES)
        committed = shared.get(COMMITTED)
        if use_converter and not os.path.exists(os.path.join(path, "schema.msgpack")):
            # Killed before the first conversion returned: no half-made dataset at `path`.
            if os.path.exists(path):
                raise AssertionError(f"kill {k}: {path} exists without a schema")
            continue
        with Zrecord(path) as z:
            n = len(z)
            if n < committed:
                raise AssertionError(f"kill {k}: {n} records after reopening, {committed} were "
                                     "committed")
            problems = verify_store(z)
            if problems:
                raise AssertionError(f"kill {k}: {problems[:5]}")
            stats["max_records"] = max(stats["max_records"], n)
            if not use_converter:  # and it takes appends again
                src, offsets = pack([make_record(n)])
                z.append(src, offsets)
        if use_converter:
            from loaderx.converter import from_iterator

            from_iterator(path, [make_record(n)], progress=False)
    return stats
