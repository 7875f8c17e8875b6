"""One store, many processes: the writer lock across handles, threads, processes and ``fork``;
readers that follow another process's appends, deletes and compactions; the converter and the
CLI against a store someone else writes; daemon threads inside native calls at exit.

Every scenario that could kill or hang a process runs in a child process (a subprocess or a
``fork``), so that a signal or a deadlock shows as a failed assertion on an exit status instead
of taking the test run down. Processes synchronize through pipes and wait on conditions, never on
sleeps: the machine may be loaded far past its cores, and no assertion depends on timing.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import random
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import reliability as rel
from loaderx import errors
from loaderx.converter import from_numpy
from loaderx.dataset import DenseDataset
from loaderx.zrecord import Zrecord

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

TESTS = pathlib.Path(__file__).resolve().parent
#: Seconds after which a child that has not answered is hung, not slow.
HANG = 120.0
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)}

# What every child process starts with.
PRELUDE = """\
import json, os, select, sys, threading
import numpy as np
import reliability as rel
from loaderx import errors
from loaderx.zrecord import Zrecord
"""


# -- helpers ---------------------------------------------------------------------------------

def run_py(code: str, *args: object, timeout: float = HANG) -> subprocess.CompletedProcess:
    """Runs ``code`` (after :data:`PRELUDE`) in a fresh interpreter; a hang fails the test."""
    try:
        return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code),
                               *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, env=ENV)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the child process hung ({timeout:.0f} s): {e.stderr!r}") from None


def assert_clean_exit(code: int, what: str = "the child", stderr: str = "") -> None:
    why = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    assert code == 0, f"{what}: {why}\n{stderr[-4000:]}"


def wait_child(pid: int, timeout: float = HANG) -> int:
    """The exit code of forked child ``pid`` (negative: its signal); one that has not ended
    after ``timeout`` is deadlocked: it is killed and the test fails."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the forked child did not end in {timeout:.0f} s (deadlock?)")
        time.sleep(0.01)


def fork_child(body) -> int:
    """Runs ``body()`` in a forked child and returns the child's exit code: ``body``'s return
    value, 70 on an exception. The child never returns into pytest."""
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            code = body()
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    return wait_child(pid)


def records(start: int, n: int) -> tuple:
    """Records ``start .. start+n`` packed for ``append``."""
    return rel.pack([rel.make_record(i) for i in range(start, start + n)])


def check_store(path, model: list[int]) -> None:
    """The store at ``path`` holds exactly the records ``model`` names, in that order."""
    with Zrecord(path) as z:
        assert len(z) == len(model)
        idx = np.arange(len(model), dtype=np.uint64)
        bad = [p for i, rec in zip(model, rel.read_records(z, idx), strict=True)
               if (p := rel.check_record(i, rec))]
        assert bad == [], bad[:5]


def model_after_deletes(model: list[int], targets) -> list[int]:
    """``model`` after a swap-tail delete of ``targets`` (as the store does it)."""
    model = list(model)
    for i in sorted(set(int(t) for t in targets), reverse=True):
        model[i] = model[-1]
        model.pop()
    return model


class Outside:
    """Files beside the store that no store operation may touch: hashed before and after."""

    def __init__(self, root: pathlib.Path) -> None:
        self.dir = root / "outside"
        self.dir.mkdir()
        rng = np.random.default_rng(5)
        for k in range(3):
            (self.dir / f"file{k}").write_bytes(rng.bytes(4096 * (k + 1)))
        self.before = self.digest()

    def digest(self) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(self.dir.iterdir())}

    def assert_unchanged(self) -> None:
        assert self.digest() == self.before, "a file outside the store changed"


@pytest.fixture
def outside(tmp_path) -> Outside:
    return Outside(tmp_path)


PEER = PRELUDE + """
# Runs one line of Python per line of stdin (an expression's value, or None for a statement)
# and answers one JSON line: {"ok": value} or {"error": exception class, "message": text}.
ns = {"np": np, "rel": rel, "errors": errors, "Zrecord": Zrecord, "os": os}
for line in sys.stdin:
    code = json.loads(line)
    try:
        try:
            value = eval(code, ns)
        except SyntaxError:
            exec(code, ns)
            value = None
        reply = {"ok": value}
    except Exception as e:
        reply = {"error": type(e).__name__, "message": str(e)}
    print(json.dumps(reply, default=lambda o: o.item() if hasattr(o, "item") else repr(o)),
          flush=True)
"""


class PeerError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class Peer:
    """Another process with handles of its own, driven one line of Python at a time: each
    call returns once the peer has finished it (or raised), so the test knows exactly what the
    other process has done, whatever the machine's load."""

    #: Peers not closed yet (see :func:`_reap_peers`).
    live: set[Peer] = set()

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", PEER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=ENV)
        Peer.live.add(self)

    def __call__(self, code: str):
        self.proc.stdin.write(json.dumps(code) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(read_line(self.proc, "the peer"))
        if "error" in reply:
            raise PeerError(reply["error"], reply["message"])
        return reply["ok"]

    def error(self, code: str) -> str:
        """The class name of the exception ``code`` raised in the peer (fails if none)."""
        try:
            value = self(code)
        except PeerError as e:
            return e.kind
        raise AssertionError(f"{code!r} did not raise in the peer (returned {value!r})")

    def close(self) -> None:
        Peer.live.discard(self)
        try:
            self.proc.stdin.close()
            try:
                self.proc.wait(HANG)
            except subprocess.TimeoutExpired:
                raise AssertionError("the peer did not exit") from None
        finally:
            reap(self.proc)
        assert_clean_exit(self.proc.returncode, "the peer")


@pytest.fixture(autouse=True)
def _reap_peers():
    """Kills the peers a failed test left open (and closes their pipes)."""
    yield
    while Peer.live:
        reap(Peer.live.pop().proc)


def reap(proc: subprocess.Popen) -> None:
    """Kills ``proc`` unless it has ended, waits for it and closes its pipes: a test that fails
    half-way leaves no process running and no pipe for the garbage collector to find open."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            try:
                pipe.close()
            except BrokenPipeError:  # unsent input to a dead process: closed all the same
                pass


def read_line(proc: subprocess.Popen, what: str, timeout: float = HANG) -> str:
    """The next line ``proc`` prints; its death or silence past ``timeout`` fails the test.
    (Every protocol here has at most one unread line in flight, so the pipe's buffer never
    holds a line that select() cannot see.)"""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else None
    if not line:
        if line is None:
            proc.kill()
        code = proc.wait(HANG)
        raise AssertionError(f"{what} " + ("hung" if line is None else "ended") +
                             f" (exit status {code})")
    return line


def send(proc: subprocess.Popen, line: str) -> None:
    try:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
    except BrokenPipeError:
        raise AssertionError(f"the child ended (exit status {proc.wait(HANG)})") from None


def finish(proc: subprocess.Popen, what: str) -> None:
    try:
        proc.wait(HANG)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{what} did not exit") from None
    assert_clean_exit(proc.returncode, what)


# -- one writer at a time ----------------------------------------------------------------------

def test_one_writer_across_handles_threads_and_processes(tmp_path, outside):
    path = tmp_path / "s"
    a = Zrecord(path)
    assert a.append(*records(0, 50)) == 0  # the first write takes the writer lock
    a.sync()
    assert a.is_writer

    # Another handle, in another thread of this process: refused at once.
    refused: list[str] = []

    def other_thread() -> None:
        with Zrecord(path) as b:
            for write in (lambda: b.append(*records(50, 1)), b.lock_for_writing,
                          lambda: b.delete([0]), b.compact):
                try:
                    write()
                except errors.StoreBusyError:
                    refused.append("busy")
            refused.append(f"writer={b.is_writer}")

    t = threading.Thread(target=other_thread)
    t.start()
    t.join(HANG)
    assert not t.is_alive(), "a refused write waited for the lock"
    assert refused == ["busy"] * 4 + ["writer=False"]

    # Another process: every kind of write refused, reads fine.
    peer = Peer()
    peer(f"z = Zrecord({str(path)!r})")
    for write in ("z.append(*rel.pack([rel.make_record(50)]))", "z.lock_for_writing()",
                  "z.delete([0])", "z.compact()", "z.enable_checksums()"):
        assert peer.error(write) == "StoreBusyError", write
    assert peer("z.is_writer") is False
    assert peer("len(z)") == 50
    assert peer("rel.verify_store(z)") == []

    # The lock goes with close(): the other process takes it, and this one is refused.
    a.close()
    peer("z.lock_for_writing()")
    assert peer("z.is_writer") is True
    with Zrecord(path) as c:
        with pytest.raises(errors.StoreBusyError):
            c.append(*records(50, 1))
        assert not c.is_writer
    assert peer("z.append(*rel.pack([rel.make_record(i) for i in range(50, 80)]))") == 50
    peer("z.close()")
    peer.close()
    check_store(path, list(range(80)))
    outside.assert_unchanged()


def test_writer_state_is_read_when_the_lock_is_taken(tmp_path, outside):
    """Handles opened before another process appended, synced and closed append after its
    records (nothing lost, nothing overwritten), whether they start with an append or with
    lock_for_writing()."""
    path = tmp_path / "s"
    with Zrecord(path) as z:
        z.append(*records(0, 100))
    early = Zrecord(path)
    early_locking = Zrecord(path)
    assert len(early) == len(early_locking) == 100

    r = run_py("""
        with Zrecord(sys.argv[1]) as z:
            assert z.append(*rel.pack([rel.make_record(i) for i in range(100, 160)])) == 100
            z.sync()
        """, path)
    assert_clean_exit(r.returncode, "the other writer", r.stderr)

    assert early.append(*records(160, 40)) == 160
    early.close()
    r = run_py("""
        with Zrecord(sys.argv[1]) as z:
            assert z.append(*rel.pack([rel.make_record(i) for i in range(200, 230)])) == 200
        """, path)  # close() syncs
    assert_clean_exit(r.returncode, "the third writer", r.stderr)
    early_locking.lock_for_writing()
    assert len(early_locking) == 230
    assert early_locking.append(*records(230, 20)) == 230
    early_locking.close()
    check_store(path, list(range(250)))
    outside.assert_unchanged()


# -- readers -----------------------------------------------------------------------------------

def test_reader_length_follows_another_processes_syncs(tmp_path, outside):
    path = tmp_path / "s"
    with Zrecord(path) as z:
        z.append(*records(0, 20))
    reader = Zrecord(path)
    peer = Peer()
    peer(f"z = Zrecord({str(path)!r})")
    n = 20
    for k in (1, 37, 200):
        assert peer(f"z.append(*rel.pack([rel.make_record(i) for i in range({n}, {n + k})]))") \
            == n
        peer("z.sync()")
        n += k
        assert len(reader) == n  # live, no refresh
        fresh = np.arange(n - k, n, dtype=np.uint64)
        assert [p for i, rec in zip(fresh, rel.read_records(reader, fresh), strict=True)
                if (p := rel.check_record(int(i), rec))] == []
    assert rel.verify_store(reader) == []
    assert not reader.is_writer
    peer("z.close()")
    peer.close()
    reader.close()
    outside.assert_unchanged()


def test_deletes_by_another_process_need_a_refresh(tmp_path, outside):
    path = tmp_path / "s"
    with Zrecord(path) as z:
        z.append(*records(0, 300))
    reader = Zrecord(path)
    assert rel.verify_store(reader) == []
    peer = Peer()
    peer(f"z = Zrecord({str(path)!r})")
    model = list(range(300))
    for targets in ([0, 5, 299], list(range(10, 60, 3))):
        peer(f"z.delete({targets})")  # durable on return
        model = model_after_deletes(model, targets)
        assert len(reader) == len(model)  # len stays live
        with pytest.raises(errors.StoreChangedError):
            reader.gather([0], np.empty(8000, dtype=np.uint8), [0])
        with pytest.raises(errors.StoreChangedError):
            reader.lengths([1, 2])
        with pytest.raises(errors.StoreChangedError):
            rel.read_records(reader, np.arange(3, dtype=np.uint64))
        reader.refresh()
        idx = np.arange(len(model), dtype=np.uint64)
        assert [p for i, rec in zip(model, rel.read_records(reader, idx), strict=True)
                if (p := rel.check_record(i, rec))] == []
    peer("z.close()")
    peer.close()
    reader.close()
    check_store(path, model)
    outside.assert_unchanged()


REFRESHER = """
# Reads the whole store (8-byte records holding their ids) again and again while another
# process deletes, refreshing as soon as a read is refused, as a reader should. A read that
# succeeds must see the store as it was before the delete or as it is after it, never half of
# it; once the delete has returned, reads are refused or right. Rounds: "round" (the models
# are in the file; answers "armed"), then "done" once the delete returned (answers the counts).
path, model_file = sys.argv[1], sys.argv[2]
z = Zrecord(path)
counts = {"reads": 0, "refreshes": 0, "problems": []}

def read_all():
    n = len(z)
    ids = np.empty(n, dtype=np.uint64)
    z.gather(np.arange(n, dtype=np.uint64), ids, np.arange(n, dtype=np.uint64) * 8)
    return ids

print("ready", flush=True)
for line in sys.stdin:
    models = json.load(open(model_file))
    old, new = (np.array(models[k], dtype=np.uint64) for k in ("old", "new"))
    print("armed", flush=True)
    while not select.select([sys.stdin], [], [], 0)[0]:
        try:
            ids = read_all()
        except errors.StoreChangedError:
            z.refresh()
            counts["refreshes"] += 1
            continue
        except errors.ZrecordError as e:
            counts["problems"].append(f"{type(e).__name__}: {e}")
            continue
        counts["reads"] += 1
        if not (np.array_equal(ids, old) or np.array_equal(ids, new)):
            dup = len(ids) - len(np.unique(ids))
            counts["problems"].append(f"a read saw a half-done delete: {len(ids)} records "
                                      f"({len(old)} before, {len(new)} after), {dup} duplicated")
    assert sys.stdin.readline().strip() == "done"
    try:
        ids = read_all()
    except errors.StoreChangedError:
        z.refresh()
        ids = read_all()
    if not np.array_equal(ids, new):
        counts["problems"].append(f"after the delete returned: {len(ids)} records, not the "
                                  f"{len(new)} expected")
    print(json.dumps(counts), flush=True)
"""


def test_refresh_during_another_processes_delete_never_sees_half_of_it(tmp_path, outside):
    """A reader that refreshes as soon as it is refused (as the loader's users do) may do so
    while another process's delete is still moving records. Every read it completes must show
    the store before or after the delete, not a table with some holes filled and the old
    length; and a read after the delete returned is refused or right (a loader built on the
    half-done length would otherwise ask for indices past the end: ZrecordIndexError)."""
    path = tmp_path / "s"
    n = 20000
    with Zrecord(path, codec="raw") as z:  # small records, so many can move in one delete
        z.append(np.arange(n, dtype=np.uint64), np.arange(n, dtype=np.uint64) * 8)
    model_file = tmp_path / "models.json"
    reader = subprocess.Popen([sys.executable, "-c", PRELUDE + REFRESHER, str(path),
                               str(model_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=ENV)
    writer = Peer()
    model = list(range(n))
    problems, reads, refreshes = [], 0, 0
    try:
        assert read_line(reader, "the reader").strip() == "ready"
        writer(f"z = Zrecord({str(path)!r})")
        for _ in range(3):
            targets = list(range(0, len(model), 2))
            new = model_after_deletes(model, targets)
            model_file.write_text(json.dumps({"old": model, "new": new}))
            send(reader, "round")
            assert read_line(reader, "the reader").strip() == "armed"
            writer(f"z.delete(list(range(0, {len(model)}, 2)))")
            model = new
            send(reader, "done")
            counts = json.loads(read_line(reader, "the reader"))
            problems, reads, refreshes = counts["problems"], counts["reads"], counts["refreshes"]
        reader.stdin.close()
        finish(reader, "the reader")
    finally:
        reap(reader)
    writer("z.close()")
    writer.close()
    assert problems == [], f"{len(problems)} problems in {reads} reads and {refreshes} " \
                           f"refreshes, first: {problems[:3]}"
    with Zrecord(path) as z:
        ids = np.empty(len(z), dtype=np.uint64)
        z.gather(np.arange(len(z), dtype=np.uint64), ids, np.arange(len(z), dtype=np.uint64) * 8)
    assert ids.tolist() == model
    outside.assert_unchanged()


READER = """
# Verifies random batches against the model (record ids by index) until told "done", then a
# few more batches and the whole store. Control lines on stdin: "pause" (answers "paused" and
# waits for "deleted": every read must then refuse until refresh(), after which the model is
# reloaded and the store verified: answers "refreshed") and "done".
path, model_file = sys.argv[1], sys.argv[2]
z = Zrecord(path)
model = json.load(open(model_file))
rng = np.random.default_rng(int(sys.argv[3]))
counts = {"gathers": 0, "records": 0, "refused": 0, "problems": []}

def check(idx):
    for i, rec in zip(idx, rel.read_records(z, idx)):
        p = rel.check_record(model[int(i)], rec)
        if p:
            counts["problems"].append(f"index {i}: {p}")
    counts["gathers"] += 1
    counts["records"] += len(idx)

def control():
    ready, _, _ = select.select([sys.stdin], [], [], 0)
    return sys.stdin.readline().strip() if ready else None

print("ready", flush=True)
left = None
while left != 0:
    cmd = control()
    if cmd == "pause":
        print("paused", flush=True)
        assert sys.stdin.readline().strip() == "deleted"
        for read in (lambda: z.gather([0], np.empty(8000, np.uint8), [0]),
                     lambda: z.lengths([0])):
            try:
                read()
                counts["problems"].append("a read after another process's delete succeeded")
            except errors.StoreChangedError:
                counts["refused"] += 1
        z.refresh()
        model = json.load(open(model_file))
        if len(z) != len(model):
            counts["problems"].append(f"{len(z)} records after refresh, {len(model)} expected")
        check(np.arange(len(model), dtype=np.uint64))
        print("refreshed", flush=True)
    elif cmd == "done":
        left = 5
    idx = rng.integers(0, len(model), size=64, dtype=np.uint64)
    try:
        check(idx)
    except errors.StoreChangedError as e:  # a compaction by others needs no refresh
        counts["problems"].append(f"StoreChangedError during a compaction: {e}")
    if left:
        left -= 1
check(np.arange(len(model), dtype=np.uint64))
z.close()
print(json.dumps(counts), flush=True)
"""


def test_reader_process_reads_correctly_through_deletes_and_compactions(tmp_path, outside):
    """A reader process gathers and checks every record while another process deletes (the
    reader refreshes) and compacts the store twice (the reader does nothing: its reads are
    retried inside when bytes move, and it never gets SIGBUS). Exit status 0, no mismatch."""
    path = tmp_path / "s"
    n = 3000
    with Zrecord(path, codec="zstd") as z:
        for start in range(0, n, 500):
            z.append(*records(start, 500), codec="raw" if start % 1000 else "zstd")
    model = list(range(n))
    model_file = tmp_path / "model.json"
    model_file.write_text(json.dumps(model))
    reader = subprocess.Popen([sys.executable, "-c", PRELUDE + READER, str(path),
                               str(model_file), "1"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=ENV)
    writer = Peer()
    try:
        assert read_line(reader, "the reader").strip() == "ready"
        writer(f"z = Zrecord({str(path)!r})")
        rng = random.Random(2)
        for _ in range(2):
            send(reader, "pause")
            assert read_line(reader, "the reader").strip() == "paused"
            targets = rng.sample(range(len(model)), len(model) // 3)
            model = model_after_deletes(model, targets)
            tmp = tmp_path / "model.tmp"
            tmp.write_text(json.dumps(model))
            os.replace(tmp, model_file)
            writer(f"z.delete({targets})")
            send(reader, "deleted")
            assert read_line(reader, "the reader").strip() == "refreshed"
            done = writer("z.compact()")  # the reader gathers all along
            assert done["moved"] > 0
        send(reader, "done")
        counts = json.loads(read_line(reader, "the reader"))
        finish(reader, "the reader")
    finally:
        reap(reader)
    writer("z.close()")
    writer.close()
    assert counts["problems"] == []
    assert counts["refused"] == 4
    check_store(path, model)
    outside.assert_unchanged()


# -- fork --------------------------------------------------------------------------------------

def test_inherited_handle_reads_but_never_writes_in_a_forked_child(tmp_path, outside):
    path = tmp_path / "s"
    z = Zrecord(path)
    z.append(*records(0, 300))
    z.sync()
    assert z.is_writer

    def child() -> int:
        problems = rel.verify_store(z)
        refused = 0
        for write in (lambda: z.append(*records(300, 1)), z.lock_for_writing,
                      lambda: z.delete([0]), z.compact, z.enable_checksums):
            try:
                write()
            except errors.StoreBusyError:
                refused += 1
        # A handle the child opens itself is a normal one: the parent holds the lock.
        with Zrecord(path) as own:
            try:
                own.append(*records(300, 1))
            except errors.StoreBusyError:
                refused += 1
            problems += rel.verify_store(own)
        z.stats()
        z.sync()
        z.close()
        print(problems, refused, file=sys.stderr)
        return 0 if not problems and refused == 6 else 2

    assert_clean_exit(fork_child(child))
    assert z.is_writer
    assert z.append(*records(300, 100)) == 300  # the parent goes on writing
    z.close()
    check_store(path, list(range(400)))
    outside.assert_unchanged()


def test_forked_child_reopening_the_store_writes_like_another_process(tmp_path, outside):
    """A handle opened before the fork (not writing) is refused writes in the child, while a
    handle the child opens itself writes; the parent's old handle then appends after the
    child's records."""
    path = tmp_path / "s"
    with Zrecord(path) as w:
        w.append(*records(0, 100))
    z = Zrecord(path)
    assert rel.verify_store(z) == []

    def child() -> int:
        try:
            z.append(*records(100, 1))
            return 2
        except errors.StoreBusyError:
            pass
        with Zrecord(path) as own:
            if own.append(*records(100, 50)) != 100:
                return 3
            own.sync()
        return 0

    assert_clean_exit(fork_child(child))
    assert len(z) == 150
    assert z.append(*records(150, 10)) == 150
    z.close()
    check_store(path, list(range(160)))
    outside.assert_unchanged()


def test_fork_while_a_parent_thread_is_inside_append(tmp_path, outside):
    """Children forked while another thread of the parent is inside a native append (level-19
    dictionary compression: most of each batch's time) sync, stat, read and close through the
    inherited handle without deadlocking; the parent's appends go on and all survive."""
    path = tmp_path / "s"
    z = Zrecord(path, codec="zstd_dict")
    recs = [rel.make_record(i) for i in range(300)]
    z.train_dict(rel.pack(recs)[0], np.array([len(r) for r in recs], dtype=np.uint64), 16384)
    z.append(*rel.pack(recs))
    z.sync()
    state = {"inside": False, "next": 300, "error": None}
    stop = threading.Event()

    def appender() -> None:
        try:
            while not stop.is_set():
                n = state["next"]
                batch = records(n, 400)
                state["inside"] = True  # read in the child's copy of memory: the truth at fork
                assert z.append(*batch) == n
                state["inside"] = False
                state["next"] = n + 400
                if n % 1200 == 0:
                    z.sync()
        except BaseException as e:
            state["error"] = e
            state["inside"] = False
            raise

    t = threading.Thread(target=appender, daemon=True)
    t.start()
    caught = forks = 0
    try:
        while caught < 3:
            assert forks < 60, f"only {caught} of {forks} forks caught the append in flight"
            deadline = time.monotonic() + HANG
            while not state["inside"]:
                assert state["error"] is None, state["error"]
                assert time.monotonic() < deadline, "the appender never entered append"
                time.sleep(0.0005)

            def child() -> int:
                inside = state["inside"]
                z.stats()
                try:
                    z.sync()
                except errors.StoreBusyError:
                    pass  # writes are refused in the child; not hanging is the point
                len(z)
                problems = rel.verify_store(z)
                z.stats()
                z.close()
                if problems:
                    print(problems[:5], file=sys.stderr)
                    return 2
                return 0 if inside else 10

            code = fork_child(child)
            forks += 1
            assert code in (0, 10), f"the forked child: exit status {code}"
            caught += code == 0
    finally:
        stop.set()
        t.join(HANG)
    assert state["error"] is None, state["error"]
    assert z.append(*records(state["next"], 10)) == state["next"]
    z.close()
    check_store(path, list(range(state["next"] + 10)))
    outside.assert_unchanged()


# -- the converter, the loader and the CLI against another process ----------------------------

def test_overwrite_of_a_dataset_another_process_writes_is_refused(tmp_path, outside):
    # The converter's side of this (overwrite=True takes the old store's writer lock first) was
    # written in parallel with this test; without it, the new dataset replaces the old one.
    path = tmp_path / "ds"
    rows = np.arange(100 * 8, dtype=np.int64).reshape(100, 8)
    from_numpy(path, rows)
    inode = os.stat(path / "meta.zr").st_ino
    listing = sorted(os.listdir(tmp_path))
    peer = Peer()
    peer(f"z = Zrecord({str(path)!r})")
    peer("z.lock_for_writing()")
    r = run_py("""
        from loaderx.converter import from_numpy
        try:
            from_numpy(sys.argv[1], np.zeros((7, 8), dtype=np.int64), overwrite=True)
            print("replaced")
        except Exception as e:
            print(type(e).__name__, e)
        """, path)
    assert_clean_exit(r.returncode, "the converter", r.stderr)
    assert r.stdout.split()[0] == "StoreBusyError", r.stdout
    assert os.stat(path / "meta.zr").st_ino == inode
    assert sorted(os.listdir(tmp_path)) == listing
    more = np.arange(800, 800 + 10 * 8, dtype=np.int64).reshape(10, 8)
    assert peer("z.append(np.arange(800, 880, dtype=np.int64), [i * 64 for i in range(10)])") \
        == 100
    peer("z.close()")
    peer.close()
    with DenseDataset(path) as ds:
        np.testing.assert_array_equal(ds[:], np.concatenate([rows, more]))
    outside.assert_unchanged()


def test_cli_compact_of_a_store_another_process_writes_is_refused(tmp_path, outside):
    path = tmp_path / "ds"
    from_numpy(path, np.arange(400, dtype=np.int32).reshape(100, 4))
    peer = Peer()
    peer(f"z = Zrecord({str(path)!r})")
    peer("z.delete([0, 1, 2])")  # the peer now holds the writer lock
    r = subprocess.run([sys.executable, "-m", "loaderx", "compact", str(path)],
                       capture_output=True, text=True, timeout=HANG, env=ENV)
    assert r.returncode == 4, (r.returncode, r.stderr)  # loaderx.cli.EXIT_BUSY
    assert "StoreBusyError" in r.stderr or "writer lock" in r.stderr, r.stderr
    assert peer("len(z)") == 97
    peer("z.close()")
    peer.close()
    r = subprocess.run([sys.executable, "-m", "loaderx", "compact", str(path)],
                       capture_output=True, text=True, timeout=HANG, env=ENV)
    assert_clean_exit(r.returncode, "compact", r.stderr)
    outside.assert_unchanged()


ROW = 64  # int64 values per row


def rows_of(ids: np.ndarray) -> np.ndarray:
    """Self-checking rows: row ``r`` is ``r, r + 1*M, r + 2*M, ...`` (M = 1_000_003)."""
    return ids[:, None].astype(np.int64) + np.arange(ROW, dtype=np.int64) * 1_000_003


LOADER_READER = """
# Reads batches through a DataLoader and checks every row is whole (an intact row of the
# original data, whatever index it moved to); on StoreChangedError, refreshes and starts a new
# loader. Runs until "done" on stdin, then a few more batches.
from loaderx.dataloader import DataLoader
from loaderx.dataset import DenseDataset
n, ROW = int(sys.argv[2]), 64
ds = DenseDataset(sys.argv[1])
counts = {"batches": 0, "rows": 0, "changed": 0, "problems": []}
new = lambda: DataLoader({"x": ds}, batch_size=64, num_workers=2, seed=counts["changed"])
loader = new()
left = None
while left != 0:
    ready, _, _ = select.select([sys.stdin], [], [], 0)
    if ready and sys.stdin.readline().strip() == "done":
        left = 5
    try:
        x = next(loader)["x"]
    except errors.ZrecordError as e:
        if not isinstance(e, errors.StoreChangedError):  # reported, then handled alike
            counts["problems"].append(f"{type(e).__name__}: {e}")
        counts["changed"] += 1
        loader.close()
        ds.store.refresh()
        loader = new()
        continue
    ids = x[:, 0]
    want = ids[:, None] + np.arange(ROW, dtype=np.int64) * 1_000_003
    bad = ~(x == want).all(axis=1) | (ids < 0) | (ids >= n)
    if bad.any():
        counts["problems"].append(f"{int(bad.sum())} torn rows, first {x[bad][0][:4]}")
    counts["batches"] += 1
    counts["rows"] += len(x)
    if counts["batches"] == 1:
        print("ready", flush=True)
    if left:
        left -= 1
loader.close()
print(json.dumps(counts), flush=True)
"""


def test_dataloader_reader_survives_delete_and_compact_by_another_process(tmp_path, outside):
    """A process reading through DenseDataset + DataLoader never dies of a signal while
    another process deletes records and the CLI compacts the store (twice): it gets
    StoreChangedError through next(), refreshes, and every row it ever sees is whole."""
    path = tmp_path / "ds"
    n = 6000
    from_numpy(path, rows_of(np.arange(n)), codec="zstd")
    reader = subprocess.Popen([sys.executable, "-c", PRELUDE + LOADER_READER, str(path),
                               str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=ENV)
    model = list(range(n))
    rng = random.Random(3)
    try:
        assert read_line(reader, "the reader").strip() == "ready"
        for _ in range(2):
            peer = Peer()
            peer(f"z = Zrecord({str(path)!r})")
            for _ in range(3):
                targets = rng.sample(range(len(model)), len(model) // 8)
                peer(f"z.delete({targets})")
                model = model_after_deletes(model, targets)
            peer("z.close()")
            peer.close()
            r = subprocess.run([sys.executable, "-m", "loaderx", "compact", str(path)],
                               capture_output=True, text=True, timeout=HANG, env=ENV)
            assert_clean_exit(r.returncode, "compact", r.stderr)
        send(reader, "done")
        counts = json.loads(read_line(reader, "the reader"))
        finish(reader, "the reader")
    finally:
        reap(reader)
    assert counts["problems"] == [], (f"{len(counts['problems'])} problems in "
                                      f"{counts['batches']} batches, first: "
                                      f"{counts['problems'][:3]}")
    assert counts["changed"] >= 1
    with DenseDataset(path) as ds:
        np.testing.assert_array_equal(ds[:], rows_of(np.array(model)))
    outside.assert_unchanged()


# -- interpreter exit --------------------------------------------------------------------------

EXIT_WITH_THREADS = """
# Daemon threads loop on large native calls; the main thread returns once every one of them is
# inside its second call, so the interpreter finalizes while they are in (or around) one.
path, which = sys.argv[1], sys.argv[2].split(",")
z = Zrecord(path)
n = len(z)
inside = {w: threading.Event() for w in which}
calls = {w: 0 for w in which}
everything = np.arange(n, dtype=np.uint64)
lens = z.lengths(everything).astype(np.uint64)
offsets = np.zeros(n, dtype=np.uint64)
np.cumsum(lens[:-1], out=offsets[1:])
dst = np.empty(int(lens.sum()), dtype=np.uint8)
# The same batch again and again: record j >= n is record n + (j - n) % 2000.
batch = rel.pack([rel.make_record(n + i) for i in range(2000)])

def loop(w):
    while True:
        if calls[w] == 1:
            inside[w].set()
        calls[w] += 1
        if w == "gather":
            z.gather(everything, dst, offsets)
        else:
            z.append(*batch)

for w in which:
    threading.Thread(target=loop, args=(w,), daemon=True).start()
for w in which:
    inside[w].wait()
"""


@pytest.mark.parametrize("which", ["gather", "append", "gather,append"])
def test_exit_while_daemon_threads_are_inside_native_calls(tmp_path, which):
    path = tmp_path / "s"
    with Zrecord(path, codec="zstd") as z:
        for start in range(0, 4000, 1000):
            z.append(*records(start, 1000))
    r = run_py(EXIT_WITH_THREADS, path, which)
    assert_clean_exit(r.returncode, "the exiting interpreter", r.stderr)
    assert "FATAL" not in r.stderr, r.stderr
    with Zrecord(path) as z:  # whatever the appends left is intact
        model = [j if j < 4000 else 4000 + (j - 4000) % 2000 for j in range(len(z))]
    check_store(path, model)
