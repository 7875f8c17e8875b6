"""Store directories from elsewhere: every store file (meta.zr, the N.zr chunks, dict.zr,
sums.zr, gen.zr) must be a regular file, opened without following links. A symlink, a FIFO, a
device or an oversized file is a CorruptStoreError, promptly; planted temporary-file links are
never written through; no byte of any file outside the store ever changes.

Each hostile store is used from a subprocess with a timeout: a FIFO opened the blocking way, or
a bad length read through a map, would otherwise hang or kill the test run instead of failing
one test. "Read-only" runs open the store without write access (as another user when the tests
run as root, since root ignores file modes).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

import reliability as rel
from loaderx import _native, errors
from loaderx.zrecord import MAX_RECORDS, Zrecord

TESTS = pathlib.Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)}
#: Seconds after which a child is hung: a FIFO was waited on.
HANG = 60.0
NOBODY = 65534
N = 10

# Opens the store and tries every kind of use, each step on its own (a failed read must not
# keep the test from trying the writes); prints {step: "ok" | "ExceptionClass: message"}.
USE = """
import json, os, sys
import reliability as rel
from loaderx.zrecord import Zrecord

path, mode = sys.argv[1], sys.argv[2]
if mode == "ro" and os.geteuid() == 0:
    os.setgid(65534)
    os.setuid(65534)  # root writes anything; another user reads only
outcome = {}
if mode == "ro" and os.access(os.path.join(path, "meta.zr"), os.W_OK):
    outcome["not read-only"] = "AssertionError: meta.zr is writable"

step = rel.stepper(outcome)

z = None
def open_():
    global z
    z = Zrecord(path, codec="zstd_dict", verify_reads=True)
step("open", open_)
if z is not None and mode != "open":
    step("read", lambda: rel.verify_store(z) or rel.read_records(z, [0]))
    step("verify", z.verify)
    step("stats", z.stats)
    step("refresh", z.refresh)
    if mode == "rw":
        step("append", lambda: z.append(*rel.pack([rel.make_record(i) for i in range(10, 13)])))
        step("sync", z.sync)
        step("delete", lambda: z.delete([0]))
        step("compact", z.compact)
        step("enable_checksums", z.enable_checksums)
    step("close", z.close)
print(json.dumps(outcome))
"""


def use(path: pathlib.Path, mode: str) -> dict[str, str]:
    """Runs :data:`USE` on the store at ``path``; a hang or a signal fails the test."""
    try:
        r = subprocess.run([sys.executable, "-c", USE, str(path), mode], capture_output=True,
                           text=True, timeout=HANG, env=ENV)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"using the store ({mode}) hung: a FIFO was waited on?") from None
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stderr[-3000:]}"
    return json.loads(r.stdout.splitlines()[-1])


def assert_refused_as_corrupt(path: pathlib.Path, mode: str, outside) -> None:
    """Using the store ``path`` fails first with CorruptStoreError, every later step fails
    cleanly, and nothing outside the store changes."""
    outside.snapshot()
    outcome = use(path, mode)
    assert first_error(outcome) == "CorruptStoreError", outcome
    assert_only_clean_errors(outcome)
    outside.assert_unchanged()


def first_error(outcome: dict[str, str]) -> str:
    """The class name of the first failed step ("" if none failed)."""
    return next((v.split(":")[0] for v in outcome.values() if v != "ok"), "")


def assert_only_clean_errors(outcome: dict[str, str]) -> None:
    """Every step worked or raised a loaderx error or an OSError: nothing else."""
    ok = {"ok"} | {c.__name__ for c in vars(errors).values()
                   if isinstance(c, type) and issubclass(c, Exception)}
    ok |= {"OSError", "PermissionError", "FileNotFoundError", "IsADirectoryError"}
    assert all(v.split(":")[0] in ok for v in outcome.values()), outcome


class Outside:
    """Files outside the store (some of them copies of store files, as valid as the real
    ones) that symlinks point at: hashed before and after, with their sizes."""

    def __init__(self, root: pathlib.Path) -> None:
        self.dir = root / "outside"
        self.dir.mkdir()
        self.dir.chmod(0o755)
        (self.dir / "precious").write_bytes(np.random.default_rng(1).bytes(10_000))

    def file(self, name: str, data: bytes | None = None) -> pathlib.Path:
        p = self.dir / name
        if data is not None:
            p.write_bytes(data)
        return p

    def digest(self) -> dict[str, tuple[int, str]]:
        return {p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
                for p in sorted(self.dir.iterdir()) if p.is_file()}

    def snapshot(self) -> None:
        self.before = self.digest()

    def assert_unchanged(self) -> None:
        assert self.digest() == self.before, "a file outside the store changed"


@pytest.fixture
def root():
    """A directory other users may enter (pytest's tmp_path is private to its owner), for
    the read-only runs as another user."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="loaderx-hostile-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def outside(root) -> Outside:
    return Outside(root)


def make_store(path: pathlib.Path) -> None:
    """A store with every kind of file: meta.zr, 0.zr, dict.zr, sums.zr and gen.zr, holding
    records 0..N compressed against the dictionary."""
    samples = [rel.make_record(i) for i in range(1000, 1200)]
    with Zrecord(path, codec="zstd_dict") as z:
        z.train_dict(rel.pack(samples)[0],
                     np.array([len(s) for s in samples], dtype=np.uint64), 4096)
        z.append(*rel.pack([rel.make_record(i) for i in range(N)]))
        z.enable_checksums()
        assert z.stats()["compressed_records"] == N
    for name in ("meta.zr", "0.zr", "dict.zr", "sums.zr", "gen.zr"):
        assert (path / name).is_file(), name
    path.chmod(0o755)


def read_only_for_non_root(path: pathlib.Path) -> None:
    """Without root, read-only means files without write permission."""
    if os.geteuid() != 0:
        for p in path.iterdir():
            if p.is_file():
                p.chmod(0o444)


STORE_FILES = ["meta.zr", "0.zr", "dict.zr", "sums.zr", "gen.zr"]


@pytest.mark.parametrize("mode", ["rw", "ro"])
@pytest.mark.parametrize("name", STORE_FILES)
@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_store_file_replaced_by_a_link_or_a_fifo(root, outside, name, mode, kind):
    """A symlink points at a faithful copy of the file it replaces, so only the link itself can
    be the reason to refuse it; a FIFO would hang a blocking open. Whatever is tried, the first
    error is CorruptStoreError and the outside copy keeps every byte."""
    path = root / "s"
    make_store(path)
    if kind == "symlink":
        target = outside.file(name, (path / name).read_bytes())
        (path / name).unlink()
        (path / name).symlink_to(target)
    else:
        (path / name).unlink()
        os.mkfifo(path / name, 0o666)
    read_only_for_non_root(path)
    assert_refused_as_corrupt(path, mode, outside)


@pytest.mark.parametrize("mode", ["rw", "ro"])
def test_dict_symlinked_to_dev_zero(root, outside, mode):
    path = root / "s"
    make_store(path)
    (path / "dict.zr").unlink()
    (path / "dict.zr").symlink_to("/dev/zero")
    read_only_for_non_root(path)
    assert_refused_as_corrupt(path, mode, outside)


def test_dict_over_32_mib(root, outside):
    path = root / "s"
    make_store(path)
    with open(path / "dict.zr", "r+b") as f:
        f.truncate(33 << 20)  # sparse: the size is the point, not the bytes
    assert_refused_as_corrupt(path, "rw", outside)
    assert (path / "dict.zr").stat().st_size == 33 << 20


@pytest.mark.parametrize("length", [5_000_000, MAX_RECORDS, MAX_RECORDS + 1, 2**32 - 1])
def test_header_length_past_the_records_ever_written(root, outside, length):
    path = root / "s"
    make_store(path)
    with open(path / "meta.zr", "r+b") as f:  # bytes 12..16: the little-endian u32 length
        f.seek(12)
        assert int.from_bytes(f.read(4), "little") == N
        f.seek(12)
        f.write(length.to_bytes(4, "little"))
    outside.snapshot()
    outcome = use(path, "open")
    assert outcome["open"].split(":")[0] == "CorruptStoreError", outcome
    outside.assert_unchanged()


PLANT = """
# Plants every temporary name this process could use in the store directory as a link to an
# outside file (and one dangling link), then creates and writes the store.
import json, os, sys
import numpy as np
import reliability as rel
from loaderx.zrecord import Zrecord

path, out = sys.argv[1], sys.argv[2]
pid = os.getpid()
os.makedirs(path)
names = [f".meta.zr.{pid}.tmp", f".gen.zr.{pid}.tmp", f"sums.zr.tmp.{pid}", f"sums.tmp.{pid}",
         f"dict.zr.tmp.{pid}", f"dict.tmp.{pid}", f"meta.zr.tmp.{pid}", f"gen.zr.tmp.{pid}"]
for k, name in enumerate(names):
    os.symlink(os.path.join(out, f"victim{k}"), os.path.join(path, name))
os.symlink(os.path.join(out, "never-created"), os.path.join(path, f".meta.zr.{pid}.tmp.x"))
outcome = {}
z = None

step = rel.stepper(outcome)

def open_():
    global z
    z = Zrecord(path, codec="zstd_dict")
step("create", open_)
samples = [rel.make_record(i) for i in range(1000, 1100)]
step("train_dict", lambda: z.train_dict(rel.pack(samples)[0],
                                        np.array([len(s) for s in samples], np.uint64), 2048))
step("append", lambda: z.append(*rel.pack([rel.make_record(i) for i in range(20)])))
step("enable_checksums", z.enable_checksums)
step("sync", z.sync)
step("delete", lambda: z.delete([19]))
step("compact", z.compact)
step("close", z.close)
print(json.dumps(outcome))
"""


@pytest.mark.parametrize("victims", ["existing", "dangling"])
def test_planted_temporary_file_links_are_never_written_through(root, outside, victims):
    """Links to existing files must not be written through; dangling ones must not create
    their targets."""
    if victims == "existing":
        for k in range(8):
            outside.file(f"victim{k}", f"victim {k}\n".encode() * 100)
    outside.snapshot()
    path = root / "s"
    r = subprocess.run([sys.executable, "-c", PLANT, str(path), str(outside.dir)],
                       capture_output=True, text=True, timeout=HANG, env=ENV)
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stderr[-3000:]}"
    outcome = json.loads(r.stdout.splitlines()[-1])
    assert_only_clean_errors(outcome)
    outside.assert_unchanged()
    assert not (outside.dir / "never-created").exists()
    if all(v == "ok" for v in outcome.values()):  # and the store is what was written
        with Zrecord(path) as z:
            assert len(z) == 19 and rel.verify_store(z) == [] and z.has_checksums()


def run_code(code: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                              capture_output=True, text=True, timeout=HANG, env=ENV)
    except subprocess.TimeoutExpired:
        raise AssertionError("the child hung") from None


@pytest.mark.parametrize("target", [2**40, 2**62])
def test_huge_dictionary_target_is_a_clear_error(tmp_path, target):
    r = run_code(f"""
        import numpy as np
        import reliability as rel
        from loaderx.errors import ZrecordValueError
        from loaderx.zrecord import Zrecord
        z = Zrecord({str(tmp_path / 's')!r}, codec="zstd_dict")
        samples = [rel.make_record(i) for i in range(200)]
        try:
            z.train_dict(rel.pack(samples)[0], np.array([len(s) for s in samples], np.uint64),
                         {target})
            print("trained")
        except ZrecordValueError as e:
            print("ZrecordValueError", e)
        print(z.has_dict())
        """)
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stderr[-3000:]}"
    first, has_dict = r.stdout.strip().splitlines()
    assert first.startswith("ZrecordValueError") and "target" in first, first
    assert has_dict == "False"


@pytest.mark.skipif(not hasattr(_native, "copy_records"),
                    reason="the benchmark ceilings are built only with the cargo feature 'bench'")
@pytest.mark.parametrize("dst", ["buf", "buf[100:]", "buf[:-100]"])
def test_copy_records_refuses_aliased_buffers(dst):
    r = run_code(f"""
        import numpy as np
        from loaderx import _native
        buf = np.arange(4000, dtype=np.uint8)
        before = buf.copy()
        try:
            _native.copy_records(buf, 16, np.arange(10, dtype=np.uint64) * 3, {dst})
            print("copied")
        except ValueError as e:
            print("ValueError", e)
        print(np.array_equal(buf, before))
        """)
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stderr[-3000:]}"
    first, untouched = r.stdout.strip().splitlines()
    assert first.startswith("ValueError"), first
    assert untouched == "True"
