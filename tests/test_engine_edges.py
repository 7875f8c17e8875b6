"""The engine's edges that issue 19's review found open: a forked child exiting while a parent
thread was inside a native call, a delete that could not be announced (no gen.zr), an
interrupted delete on a store nobody can write, verification that grew with the damage or
decoded duplicate entries again and again, closed handles that kept their maps and files, and
stores of many chunks against the open-file limit.

Every scenario runs in its own subprocess (hang guard, exit status checked).
"""

from __future__ import annotations

import os
import pathlib
import struct
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

import reliability as rel
from loaderx.zrecord import Zrecord

TESTS = pathlib.Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)}
HANG = 120.0
EPOCH_CHANGE = 1 << 32


def run(script: str, *args: str, timeout: float = HANG) -> str:
    """Runs ``script`` in a fresh interpreter; it must end (within the hang guard) with exit
    status 0. Returns its stdout."""
    try:
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args],
                           capture_output=True, text=True, timeout=timeout, env=ENV)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the child hung ({timeout:.0f} s)\n{e.stderr!r}") from None
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def set_change_count(path: pathlib.Path, odd: bool) -> None:
    """Leaves gen.zr as a delete killed half-way would: the change count odd."""
    gen = path / "gen.zr"
    data = bytearray(gen.read_bytes())
    (epoch,) = struct.unpack_from("<Q", data, 8)
    if bool(epoch & EPOCH_CHANGE) != odd:
        epoch += EPOCH_CHANGE
    struct.pack_into("<Q", data, 8, epoch)
    gen.write_bytes(bytes(data))


# -- fork and exit -------------------------------------------------------------------------------

FORK_AT_EXIT = """
import os, sys, threading, time
import numpy as np
import reliability as rel
from loaderx.zrecord import Zrecord

z = Zrecord(sys.argv[1], codec="zstd")
want = int(sys.argv[2]) if len(sys.argv) > 2 else 3   # forks to catch inside a native call
state = {"inside": False}
stop = threading.Event()

def appender():
    n = 0
    while not stop.is_set():
        batch = rel.pack([rel.make_record(i) for i in range(n, n + 200)])
        state["inside"] = True   # the child's copy of memory says whether the fork caught it
        z.append(*batch)
        state["inside"] = False
        n += 200

threading.Thread(target=appender, daemon=True).start()
caught = forks = 0
while caught < want:
    assert forks < 70 * want, f"only {caught} of {forks} forks caught the append in flight"
    while not state["inside"]:
        time.sleep(0.0002)
    pid = os.fork()
    if pid == 0:
        # A normal exit: atexit runs loaderx's exit hook, which waits for native calls in
        # flight -- in this process, not the parent's thread that the fork left behind.
        code = 0 if state["inside"] else 10
        sys.exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise SystemExit("a forked child hung at exit")
        time.sleep(0.005)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 10), f"forked child: exit status {code}"
    forks += 1
    caught += code == 0
stop.set()
print("caught", caught, "of", forks)
"""


def test_child_forked_during_a_native_call_exits(tmp_path):
    """Before the fix the child inherited the parent's count of calls in flight and its exit
    hook waited for them forever (40 of 40 forks hung)."""
    out = run(FORK_AT_EXIT, str(tmp_path / "s"))
    assert out.startswith("caught 3"), out


# -- deletes that cannot be announced ------------------------------------------------------------

UNANNOUNCED_DELETE = """
import os, sys
import numpy as np
import reliability as rel
from loaderx import errors
from loaderx.zrecord import Zrecord

path = sys.argv[1]
# gen.zr cannot be made in this process: a directory sits at its temporary name (as a full
# disk would refuse it).
os.mkdir(os.path.join(path, f".gen.zr.{os.getpid()}.tmp"))
reader = Zrecord(path)
writer = Zrecord(path)
assert not os.path.exists(os.path.join(path, "gen.zr"))
before = [bytes(r) for r in rel.read_records(reader, range(10))]
try:
    writer.delete([0])
except OSError:
    pass
else:
    raise SystemExit("the delete went ahead with no gen.zr to tell other handles")
assert len(writer) == 10 and len(reader) == 10
assert [bytes(r) for r in rel.read_records(reader, range(10))] == before
writer.close()
reader.close()
print("refused")
"""


def test_delete_without_a_change_counter_is_refused(tmp_path):
    """A store from 0.9.11 has no gen.zr; when it cannot be made (a full disk), a delete by one
    handle used to go ahead unannounced, and other handles silently read other records at the
    same indices."""
    path = tmp_path / "s"
    with Zrecord(path) as z:
        z.append(*rel.pack([rel.make_record(i) for i in range(10)]))
    (path / "gen.zr").unlink()
    assert run(UNANNOUNCED_DELETE, str(path)).strip() == "refused"


# -- an interrupted delete on a store nobody can write -------------------------------------------

READ_ONLY_INTERRUPTED = """
import os, sys
import reliability as rel
from loaderx.zrecord import Zrecord

path = sys.argv[1]
if os.geteuid() == 0:
    os.setgid(65534)
    os.setuid(65534)      # root writes anything; another user can only read
assert not os.access(os.path.join(path, "meta.zr"), os.W_OK)
z = Zrecord(path)
assert rel.verify_store(z) == []
z.refresh()
assert len(z) == 10
z.close()
print("read")
"""


@pytest.mark.parametrize("writable", [False, True])
def test_interrupted_delete_on_a_store_nobody_can_settle(writable):
    """An odd change count (a delete killed half-way) with no live deleter: a handle that can
    write settles it, one that cannot (read-only media, a copied store) used to wait 30 s per
    open and then fail every read. Now both read the store as the delete left it."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="loaderx-edges-"))
    try:
        root.chmod(0o755)
        path = root / "s"
        with Zrecord(path) as z:
            z.append(*rel.pack([rel.make_record(i) for i in range(10)]))
        set_change_count(path, odd=True)
        path.chmod(0o755)
        if writable:
            script = READ_ONLY_INTERRUPTED.replace("if os.geteuid() == 0:", "if False:")
            script = script.replace("assert not os.access", "assert os.access")
        else:
            for p in path.iterdir():
                p.chmod(0o444)
            script = READ_ONLY_INTERRUPTED
        # The hang guard is shorter than the old 30 s wait for each of the open and refresh.
        assert run(script, str(path), timeout=50).strip() == "read"
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


# -- verification bounded by what the chunk files hold --------------------------------------------

def write_entries(path: pathlib.Path, entries: list[tuple[int, int, int, int, int]],
                  first: int) -> None:
    """Writes table entries (offset, phys, logic, chunk, codec) from index ``first`` and sets
    the header length to their end, as a hostile store would."""
    with open(path / "meta.zr", "r+b") as f:
        f.seek(16 + 16 * first)
        f.write(b"".join(struct.pack("<IIIHBB", o, p, lg, c, k, 0) for o, p, lg, c, k in entries))
        f.seek(12)
        f.write(struct.pack("<I", first + len(entries)))


def entry(path: pathlib.Path, index: int) -> tuple[int, int, int, int, int]:
    with open(path / "meta.zr", "rb") as f:
        f.seek(16 + 16 * index)
        o, p, lg, c, k, _ = struct.unpack("<IIIHBB", f.read(16))
    return o, p, lg, c, k


VERIFY_DUPLICATES = """
import resource, sys
from loaderx.zrecord import Zrecord
# Far more than one decode of each distinct record needs, far less than decoding every entry.
resource.setrlimit(resource.RLIMIT_CPU, (60, 60))
with Zrecord(sys.argv[1]) as z:
    r = z.verify()
print(r["records"], r["failed"], r["unchecked"])
"""


def test_verify_decodes_entries_naming_the_same_bytes_once(tmp_path):
    """2^20 table entries naming one zstd record of 1 MiB of zeros: 1 TiB to decode before
    (an 800-byte archive could carry such a table); now one decode."""
    path = tmp_path / "s"
    with Zrecord(path, codec="zstd") as z:
        z.append(np.zeros(1 << 20, np.uint8), np.zeros(1, np.uint64))
    first = entry(path, 0)
    n = 1 << 20
    write_entries(path, [first] * (n - 1), 1)
    out = run(VERIFY_DUPLICATES, str(path)).split()
    assert out == [str(n), "0", str(n)]


def test_verify_refuses_overlapping_entries_without_decoding_them(tmp_path):
    """Entries whose bytes overlap another record's without being the same bytes are damage,
    reported without decoding."""
    path = tmp_path / "s"
    recs = [rel.make_record(i) for i in range(4)]
    with Zrecord(path, codec="raw") as z:
        z.append(*rel.pack(recs))
    o, p, lg, c, k = entry(path, 1)
    write_entries(path, [(o + 1, p, lg, c, k)], 4)   # record 4: record 1's bytes shifted by one
    with Zrecord(path) as z:
        r = z.verify()
    assert r["failed"] == 1
    assert [i for i, _ in r["failures"]] == [4]
    assert "overlap" in r["failures"][0][1]


def test_verify_lists_a_bounded_number_of_failures(tmp_path):
    """Every damaged record is counted; only ``max_listed`` of them (the lowest indices) are
    kept with their messages, so memory does not grow with the damage."""
    path = tmp_path / "s"
    n = 3000
    with Zrecord(path, codec="zstd") as z:          # compressible: every record a zstd frame
        z.append(*rel.pack([bytes([i % 251]) * 300 for i in range(n)]))
        assert z.stats()["compressed_records"] == n
    chunk = path / "0.zr"
    data = bytearray(chunk.read_bytes())
    for i in range(0, n, 2):          # break the zstd magic of every other record
        o = entry(path, i)[0]
        data[o] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with Zrecord(path) as z:
        small = z.verify(max_listed=10)
        none = z.verify(max_listed=0)
        full = z.verify(max_listed=n)
    assert small["failed"] == none["failed"] == full["failed"] == n // 2
    assert [i for i, _ in small["failures"]] == list(range(0, 20, 2))
    assert none["failures"] == []
    assert [i for i, _ in full["failures"]] == list(range(0, n, 2))


# -- closed handles and many chunks ---------------------------------------------------------------

CLOSE_RELEASES = """
import gc, os, sys
import numpy as np
from loaderx import DenseDataset

def fds():
    return len(os.listdir("/proc/self/fd"))

def maps():
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if sys.argv[1] in line)

base_fds, base_maps = fds(), maps()
opened = [DenseDataset(sys.argv[1]) for _ in range(20)]
for d in opened:
    d[[0, 1]]
assert fds() >= base_fds + 20 and maps() >= 20, (fds(), maps())  # a meta.zr each
for d in opened:
    d.close()
# The closed objects are still alive: their files and maps must be gone all the same.
print(fds() - base_fds, maps() - base_maps, len(opened))
"""


def test_close_releases_files_and_maps(tmp_path):
    from loaderx import from_numpy
    path = tmp_path / "ds"
    from_numpy(path, np.arange(100, dtype=np.int64))
    out = run(CLOSE_RELEASES, str(path)).split()
    assert out == ["0", "0", "20"], out


MANY_CHUNKS = """
import resource, sys
import numpy as np
from loaderx import _native

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
assert hard == resource.RLIM_INFINITY or hard > 400, hard
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
# 4 KiB chunks, one record each: 200 chunk files, each with its own descriptor.
z = _native.Zrecord(sys.argv[1], "raw", 4096)
recs = np.arange(200 * 1024, dtype=np.uint32).view(np.uint8)
z.append(recs, np.arange(200, dtype=np.uint64) * 4096)
out = np.zeros(200 * 4096, np.uint8)
z.gather(np.arange(200, dtype=np.uint64), out, np.arange(200, dtype=np.uint64) * 4096)
assert (out == recs).all()
z.close()
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0] > 64)
"""


def test_store_of_more_chunks_than_the_soft_file_limit(tmp_path):
    """One descriptor per chunk file: past the soft limit (1024 by default) opens failed with
    EMFILE. The engine raises the soft limit to the hard one when it runs out."""
    assert run(MANY_CHUNKS, str(tmp_path / "s")).strip() == "True"


SHARED_MAPS = """
import sys
import numpy as np
from loaderx import _native

def chunk_maps():
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if sys.argv[1] in line and line.rstrip().endswith(".zr")
                   and not line.rstrip().endswith(("meta.zr", "gen.zr")))

w = _native.Zrecord(sys.argv[1], "raw", 4096)
w.append(np.zeros(50 * 4096, np.uint8), np.arange(50, dtype=np.uint64) * 4096)
w.close()
handles = [_native.Zrecord(sys.argv[1], "raw", 4096) for _ in range(40)]
out = np.empty(50 * 4096, np.uint8)
for h in handles:
    h.gather(np.arange(50, dtype=np.uint64), out, np.arange(50, dtype=np.uint64) * 4096)
print(chunk_maps())
for h in handles:
    h.close()
print(chunk_maps())
"""


def test_handles_of_one_store_share_chunk_maps(tmp_path):
    """40 handles of a 50-chunk store map each chunk once, not 40 times (each map is 4 GiB of
    address space and one of vm.max_map_count's 65,530 entries: a few full-size handles
    exhausted it); closing the last handle unmaps them."""
    out = run(SHARED_MAPS, str(tmp_path / "s")).split()
    assert out == ["50", "0"], out


@pytest.fixture
def small_disk():
    """A 6 MiB tmpfs: a disk the store can fill (needs root, as the CI runs)."""
    mnt = pathlib.Path(tempfile.mkdtemp(prefix="loaderx-small-disk-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        mnt.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        mnt.rmdir()


def test_compaction_on_a_full_disk_says_what_it_needs(small_disk):
    """Compaction stages what it moves before it frees anything: on a disk the store filled it
    failed half-way with a bare ENOSPC. Now it refuses before it starts, saying how much it
    needs, and works once there is room."""
    import errno
    path = small_disk / "s"
    recs = [np.random.default_rng(i).bytes(64 << 10) for i in range(48)]   # 3 MiB, incompressible
    with Zrecord(path, codec="raw") as z:
        z.append(*rel.pack(recs))
        z.delete(list(range(24)))          # the last 24 records move into the holes
        filler = small_disk / "filler"
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        filler.write_bytes(b"\0" * max(0, free - (256 << 10)))
        with pytest.raises(OSError) as caught:
            z.compact()
        assert caught.value.errno == errno.ENOSPC
        assert "compaction" in str(caught.value) and "MiB free" in str(caught.value)
        before = rel.read_records(z, range(len(z)))
        filler.unlink()
        z.compact()
        assert rel.read_records(z, range(len(z))) == before
        assert z.verify()["failed"] == 0
