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
import threading
import time
import zlib
from collections.abc import Callable

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


def stepper(outcome: dict[str, str]) -> Callable[[str, Callable[[], object]], None]:
    """``step(name, fn)`` for child scripts: runs ``fn`` and files ``"ok"`` or the exception's
    type and message under ``name`` in ``outcome``."""
    def step(name: str, fn: Callable[[], object]) -> None:
        try:
            fn()
            outcome[name] = "ok"
        except Exception as e:
            outcome[name] = f"{type(e).__name__}: {e}"
    return step


def read_records(z, idx: np.ndarray) -> list[bytes]:
    lens = z.lengths(idx).astype(np.uint64)
    offsets = np.zeros(len(idx), dtype=np.uint64)
    np.cumsum(lens[:-1], out=offsets[1:])
    dst = np.empty(int(lens.sum()), dtype=np.uint8)
    z.gather(idx, dst, offsets)
    return [dst[int(o):int(o) + int(n)].tobytes() for o, n in zip(offsets, lens, strict=True)]


def verify_store(z) -> list[str]:
    """Problems found reading every record of ``z`` (empty: all intact)."""
    n = len(z)
    problems = []
    for start in range(0, n, 4096):
        idx = np.arange(start, min(n, start + 4096), dtype=np.uint64)
        for i, rec in zip(idx, read_records(z, idx), strict=True):
            p = check_record(int(i), rec)
            if p:
                problems.append(p)
    return problems


class Shared:
    """A few int64 counters in anonymous shared memory, written by a forked child and read by
    the parent after it killed the child: [committed records, in-native flag, batches]. The flag
    is 0 outside native calls, :data:`IN_CALL` inside an append (or a conversion, or a
    compaction) and :data:`IN_SYNC` inside a ``sync()``."""

    def __init__(self) -> None:
        self.mem = mmap.mmap(-1, 64)

    def get(self, i: int) -> int:
        return struct.unpack_from("<q", self.mem, i * 8)[0]

    def set(self, i: int, v: int) -> None:
        struct.pack_into("<q", self.mem, i * 8, v)


COMMITTED, IN_NATIVE, BATCHES = 0, 1, 2
IN_CALL, IN_SYNC = 1, 2  # values of the in-native flag

#: Seconds to wait for something that only a broken mechanism never does (a child that never
#: enters the call it is to be killed in, a race that makes no progress) -- not a slow machine.
HANG_SECONDS = 120.0


def stop_inside(pid: int, shared: Shared, flag: int, *, min_batches: int = 0,
                done: Callable[[], bool] | None = None) -> bool:
    """Stops the child ``pid`` (SIGSTOP) at a moment when its in-native flag is ``flag`` and it
    has completed ``min_batches`` batches, so that a SIGKILL sent next is sure to land inside
    that native call however loaded the machine is: the flag is read again once the child is
    stopped, and the child let go and caught again until it holds. Returns True then, or False
    when ``done()`` says the child has left the call for good (it may then be stopped or not);
    raises AssertionError when the child exits or never gets there."""
    deadline = time.monotonic() + HANG_SECONDS
    while True:
        while shared.get(IN_NATIVE) != flag or shared.get(BATCHES) < min_batches:
            if done is not None and done():
                return False
            if time.monotonic() > deadline:
                raise AssertionError(f"the child never entered the native call (flag {flag}) "
                                     f"in {HANG_SECONDS:.0f} s")
            # WNOWAIT: a dead child is left for the caller to reap, as for a live one.
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                raise AssertionError("the child exited before it could be killed")
            time.sleep(0.0002)
        os.kill(pid, signal.SIGSTOP)
        info = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
        if info.si_code != os.CLD_STOPPED:
            raise AssertionError(f"the child ended (si_code {info.si_code}, status "
                                 f"{info.si_status}) instead of stopping")
        os.waitid(os.P_PID, pid, os.WSTOPPED)  # consumes the stop, so the next one is seen
        if shared.get(IN_NATIVE) == flag:
            return True
        if done is not None and done():
            return False
        os.kill(pid, signal.SIGCONT)  # it left the call before the stop took hold: again


def kill_and_reap(pid: int) -> bool:
    """SIGKILLs the child ``pid`` and reaps it; True when the SIGKILL is what ended it, False
    when it had ended by itself before (the children run until killed, so that is a failure of
    the child: an exception in it exits with status 1)."""
    os.kill(pid, signal.SIGKILL)  # a child that already exited is a zombie until reaped
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


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
            shared.set(IN_NATIVE, IN_CALL)
            n = from_iterator(path, recs, codec=rng.choice(["raw", "zstd"]),
                              chunk_bytes=rng.choice([2000, 1 << 20]), progress=False,
                              append=True)
            shared.set(IN_NATIVE, 0)
            shared.set(COMMITTED, n)
            shared.set(BATCHES, shared.get(BATCHES) + 1)
    z = Zrecord(path)
    n = len(z)
    while True:
        k = rng.randrange(1, 80)
        src, offsets = pack([make_record(n + j) for j in range(k)])
        shared.set(IN_NATIVE, IN_CALL)
        z.append(src, offsets, codec=rng.choice(["raw", "zstd"]))
        shared.set(IN_NATIVE, 0)
        n += k
        if rng.random() < 0.3:
            shared.set(IN_NATIVE, IN_SYNC)
            z.sync()
            shared.set(IN_NATIVE, 0)
            shared.set(COMMITTED, n)
        shared.set(BATCHES, shared.get(BATCHES) + 1)


def kill_loop(path: str, kills: int, seed: int, use_converter: bool) -> dict[str, int]:
    """Forks a child that appends to ``path`` and SIGKILLs it, ``kills`` times; after each kill
    the store must open with every committed record and every record below its length intact,
    and must accept appends.

    Every other kill is aimed: the child is stopped (see :func:`stop_inside`) inside a native
    append or ``sync()``, in turn (with the converters: inside a conversion), after it completed
    a batch, and killed there -- so those kills land inside native calls by construction, not by
    luck, however slow the machine. The others come at seeded random moments, which also hit
    the child's start and the Python code between calls. Returns counts for the report:
    ``sigkilled`` counts the children that the SIGKILL ended (each should be: one that ended
    by itself failed); ``in_native``/``in_sync`` count those of them, aimed or not, that the
    SIGKILL caught inside such calls."""
    from loaderx.zrecord import Zrecord

    rng = random.Random(seed)
    stats = {"kills": 0, "sigkilled": 0, "aimed": 0, "in_native": 0, "in_sync": 0,
             "max_records": 0, "batches": 0}
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
        try:
            if k % 2:
                flag = IN_SYNC if k % 4 == 3 and not use_converter else IN_CALL
                stop_inside(pid, shared, flag, min_batches=1)
                stats["aimed"] += 1
            else:
                # Conversions sync (several fsyncs) on every call, so they get longer to run.
                time.sleep(rng.uniform(0.002, 0.25 if use_converter else 0.06))
        finally:
            sigkilled = kill_and_reap(pid)
        stats["kills"] += 1
        stats["sigkilled"] += sigkilled
        flag = shared.get(IN_NATIVE) if sigkilled else 0
        stats["in_native"] += flag != 0
        stats["in_sync"] += flag == IN_SYNC
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

            from_iterator(path, [make_record(n)], progress=False, append=True)
    return stats


def fragmented_store(path: str, seed: int) -> list[bytes]:
    """A fresh store at ``path`` with a third of its records deleted (so compaction has work);
    returns its live records in index order."""
    import shutil

    from loaderx.zrecord import Zrecord

    shutil.rmtree(path, ignore_errors=True)
    rng = random.Random(seed)
    with Zrecord(path, codec="zstd") as z:
        for start in range(0, 3000, 500):
            z.append(*pack([make_record(start + j) for j in range(500)]),
                     codec=rng.choice(["raw", "zstd"]))
        z.delete(rng.sample(range(3000), 1000))
        return [bytes(r) for r in read_records(z, np.arange(len(z), dtype=np.uint64))]


def compact_kill_loop(path: str, kills: int, seed: int) -> dict[str, int]:
    """Forks a child that compacts a fragmented store and SIGKILLs it, ``kills`` times. After
    each kill the store must hold exactly the records it had, and running ``compact()`` again
    must finish the job.

    Every other kill is aimed: the child is stopped inside ``compact()`` and killed there (when
    the compaction ends before the stop takes hold, that round is an ordinary kill and the next
    one aims again). The others come at a seeded random moment over the time a compaction
    takes. Returns counts for the report; ``sigkilled`` counts the children that the SIGKILL
    ended (each should be: one that ended by itself failed), ``in_native`` those of them that
    it caught inside ``compact()``."""
    from loaderx.zrecord import Zrecord

    rng = random.Random(seed)
    stats = {"kills": 0, "sigkilled": 0, "aimed": 0, "in_native": 0}
    shared = Shared()
    # How long one compaction takes here, to spread the timed kills over it.
    fragmented_store(path, seed)
    with Zrecord(path) as z:
        t0 = time.perf_counter()
        z.compact()
        took = time.perf_counter() - t0
    aims = kills // 2
    k = 0
    while stats["kills"] < kills or stats["aimed"] < aims:
        if k > kills + 20 * max(aims, 1):
            raise AssertionError(f"only {stats['aimed']} of {aims} kills caught the child "
                                 f"inside compact() in {k} rounds: {stats}")
        aim = stats["aimed"] < aims and (k % 2 or stats["kills"] >= kills)
        expected = fragmented_store(path, seed * 1000 + k)
        shared.set(IN_NATIVE, 0)
        shared.set(BATCHES, 0)
        pid = os.fork()
        if pid == 0:
            try:
                z = Zrecord(path)
                shared.set(BATCHES, 1)  # started
                shared.set(IN_NATIVE, IN_CALL)
                z.compact()
                shared.set(IN_NATIVE, 0)
                shared.set(BATCHES, 2)  # done
                time.sleep(600)
            finally:
                os._exit(1)
        try:
            if aim:
                stats["aimed"] += stop_inside(pid, shared, IN_CALL,
                                              done=lambda: shared.get(BATCHES) == 2)
            else:
                deadline = time.monotonic() + HANG_SECONDS
                while shared.get(BATCHES) == 0:
                    if time.monotonic() > deadline:
                        raise AssertionError("the child never started its compaction")
                    time.sleep(0.0002)
                time.sleep(rng.uniform(0, 1.2 * took))
        finally:
            sigkilled = kill_and_reap(pid)
        stats["kills"] += 1
        stats["sigkilled"] += sigkilled
        stats["in_native"] += sigkilled and shared.get(IN_NATIVE) != 0
        with Zrecord(path) as z:
            got = read_records(z, np.arange(len(z), dtype=np.uint64))
            if got != expected:
                raise AssertionError(f"kill {k}: the records changed ({len(got)} vs "
                                     f"{len(expected)})")
            z.compact()
            if read_records(z, np.arange(len(z), dtype=np.uint64)) != expected:
                raise AssertionError(f"kill {k}: the records changed when compaction finished")
            if z.compact()["moved"]:
                raise AssertionError(f"kill {k}: a third compaction still moved records")
            st = z.stats()
            if st["reclaimable"] != 0:
                raise AssertionError(f"kill {k}: {st['reclaimable']} bytes left reclaimable")
        k += 1
    return stats


def race(path: str, seconds: float, readers: int, appenders: int, *, min_gathers: int = 0,
         min_appends: int = 0, min_fresh: int = 0) -> dict:
    """``readers`` threads gather random batches and verify every byte while ``appenders``
    threads append, for ``seconds`` and then on until there were ``min_gathers`` gathers,
    ``min_appends`` appends and ``min_fresh`` reads of records appended during the race (so a
    loaded machine makes the race longer, not thinner; it gives up after another
    :data:`HANG_SECONDS`). Then the whole store is verified. Returns the operation counts and
    every problem seen (``problems`` must be empty)."""
    from loaderx.zrecord import Zrecord

    z = Zrecord(path, codec="zstd")
    z.append(*pack([make_record(i) for i in range(500)]))
    lock = threading.Lock()  # appenders take turns choosing indices, not writing
    next_index = [500]
    stop = threading.Event()
    problems: list[str] = []
    counts = {"gathers": 0, "records_read": 0, "appends": 0, "fresh": 0}
    died: list[tuple[str, BaseException]] = []  # threads ended by an exception

    def reporting(fn: Callable[[int], None]) -> Callable[[int], None]:
        """``fn`` on a thread: an exception ends the race and is raised again after the join
        (a reader or appender that died would otherwise leave the race short of a thread and
        the caller none the wiser)."""
        def run(seed: int) -> None:
            try:
                fn(seed)
            except BaseException as e:  # raised again in the caller's thread
                died.append((f"{fn.__name__}({seed})", e))
                stop.set()
        return run

    @reporting
    def appender(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            k = rng.randrange(1, 50)
            # Records embed their index, which the store assigns: build them under a lock that
            # also covers the append, and check the index the store returned.
            with lock:
                first = next_index[0]
                recs = [make_record(first + j) for j in range(k)]
                got = z.append(*pack(recs), codec=rng.choice(["raw", "zstd"]))
                next_index[0] += k
            if got != first:
                problems.append(f"append returned {got}, expected {first}")
            counts["appends"] += 1

    @reporting
    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            idx = rng.integers(0, len(z), size=64).astype(np.uint64)
            for i, rec in zip(idx, read_records(z, idx), strict=True):
                p = check_record(int(i), rec)
                if p:
                    problems.append(p)
            counts["gathers"] += 1
            counts["records_read"] += len(idx)
            counts["fresh"] += int((idx >= 500).sum())  # appended during the race

    threads = [threading.Thread(target=appender, args=(s,)) for s in range(appenders)]
    threads += [threading.Thread(target=reader, args=(100 + s,)) for s in range(readers)]
    for t in threads:
        t.start()
    stop.wait(seconds)  # returns early when a thread died
    deadline = time.monotonic() + HANG_SECONDS
    while (counts["gathers"] < min_gathers or counts["appends"] < min_appends
           or counts["fresh"] < min_fresh) and time.monotonic() < deadline:
        if stop.wait(0.01):
            break
    stop.set()
    for t in threads:
        t.join()
    if died:
        z.close()
        names = ", ".join(name for name, _ in died)
        raise AssertionError(f"{len(died)} race thread(s) died: {names}") from died[0][1]
    problems += verify_store(z)
    counts["records"] = len(z)
    z.close()
    return {**counts, "problems": problems}
