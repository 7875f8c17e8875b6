"""A hostile or broken ``schema.msgpack``: symbolic links (to the file itself, or planted where
the writer puts its temporary file), a FIFO, a socket, a device, a directory, and schemas over
the 1 MiB limit on disk or asked for with ``schema=``. Reading refuses each one with a clear
CorruptStoreError -- promptly, without following the link or waiting on the FIFO -- and writing
never writes through a link or leaves a half-made store."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap

import msgpack
import numpy as np
import pytest

from loaderx._store import schema as _schema
from loaderx.converter import from_iterator, from_numpy
from loaderx.dataset import DenseDataset
from loaderx.errors import CorruptStoreError, DatasetError

#: Seconds a subprocess gets before a hang is declared: far more than it needs on any machine.
DEADLINE = 120

DATA = np.arange(24, dtype=np.int32).reshape(12, 2)


@pytest.fixture
def store(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "d"
    from_numpy(path, DATA)
    return path


def schema_body(**extra) -> dict:
    """A valid schema map for :data:`DATA`, plus ``extra`` keys."""
    return {"kind": "dense", "dtype": DATA.dtype.str, "item_shape": [2],
            "format": "loaderx-zrecord", "version": 1, "codec": "zstd", **extra}


def outside_file(tmp_path: pathlib.Path, name: str = "outside.msgpack") -> pathlib.Path:
    """A file outside the store holding a valid schema: were it followed, it would be used."""
    f = tmp_path / name
    f.write_bytes(msgpack.packb(schema_body(planted=True)))
    return f


def test_a_symlinked_schema_is_refused_and_not_followed(tmp_path, store):
    outside = outside_file(tmp_path)
    before = outside.read_bytes()
    (store / "schema.msgpack").unlink()
    (store / "schema.msgpack").symlink_to(outside)
    with pytest.raises(CorruptStoreError, match="schema.msgpack is a symbolic link"):
        DenseDataset(store)
    # A conversion appending to the store reads the schema first, so refuses too.
    with pytest.raises(CorruptStoreError, match="symbolic link"):
        from_numpy(store, DATA)
    assert outside.read_bytes() == before
    assert (store / "schema.msgpack").is_symlink()


def test_a_dangling_symlink_is_refused_not_taken_for_a_missing_schema(tmp_path, store):
    (store / "schema.msgpack").unlink()
    (store / "schema.msgpack").symlink_to(tmp_path / "nowhere")
    with pytest.raises(CorruptStoreError, match="symbolic link"):
        DenseDataset(store)


def test_a_fifo_schema_is_refused_promptly(tmp_path, store):
    """Opening a FIFO for reading waits for a writer, reading it waits for data: both would
    hang. Run in a subprocess, so that a regression fails this test instead of hanging the
    suite."""
    (store / "schema.msgpack").unlink()
    os.mkfifo(store / "schema.msgpack")
    code = textwrap.dedent(f"""
        import numpy as np
        from loaderx.converter import from_numpy
        from loaderx.dataset import DenseDataset
        from loaderx.errors import CorruptStoreError
        for attempt in (lambda: DenseDataset({str(store)!r}),
                        lambda: from_numpy({str(store)!r}, np.zeros((1, 2), np.int32))):
            try:
                attempt()
            except CorruptStoreError as e:
                print("refused:", e)
            else:
                print("accepted")
    """)
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        pytest.fail(f"opening a dataset whose schema.msgpack is a FIFO hung ({DEADLINE} s)")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("refused:") and "a FIFO" in line
                                   for line in lines), r.stdout
    assert stat.S_ISFIFO(os.lstat(store / "schema.msgpack").st_mode)


def test_a_directory_schema_is_refused(store):
    (store / "schema.msgpack").unlink()
    (store / "schema.msgpack").mkdir()
    with pytest.raises(CorruptStoreError, match="schema.msgpack is a directory"):
        DenseDataset(store)


def test_a_socket_schema_is_refused():
    # A short path of its own: a socket's name is limited to about 100 bytes.
    root = pathlib.Path(tempfile.mkdtemp(prefix="lx")) / "d"
    try:
        from_numpy(root, DATA)
        (root / "schema.msgpack").unlink()
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(root / "schema.msgpack"))
            with pytest.raises(CorruptStoreError, match="schema.msgpack is a socket"):
                DenseDataset(root)
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


def test_a_device_schema_is_never_opened(store):
    (store / "schema.msgpack").unlink()
    try:  # the same device as /dev/zero, which would read endless zeros
        os.mknod(store / "schema.msgpack", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("creating a device node needs privileges this run lacks")
    with pytest.raises(CorruptStoreError, match="schema.msgpack is a character device"):
        DenseDataset(store)


def sized_schema(size: int) -> bytes:
    """A valid schema map encoded to exactly ``size`` bytes (padded with an extra key)."""
    probe = len(msgpack.packb(schema_body(pad="x" * 70_000))) - 70_000
    raw = msgpack.packb(schema_body(pad="x" * (size - probe)))
    assert len(raw) == size
    return raw


def test_a_schema_over_the_limit_on_disk_is_refused(store):
    limit = _schema.MAX_SCHEMA_BYTES
    assert limit == 1 << 20
    (store / "schema.msgpack").write_bytes(sized_schema(limit))
    with DenseDataset(store) as ds:  # at the limit: read
        assert len(ds.schema["pad"]) > limit - 200
    (store / "schema.msgpack").write_bytes(sized_schema(limit + 1))
    with pytest.raises(CorruptStoreError, match=f"{limit + 1} bytes, over the {limit}-byte"):
        DenseDataset(store)
    with open(store / "schema.msgpack", "wb") as f:  # 64 MiB (sparse): refused unread
        f.write(b"\x80")
        f.truncate(64 << 20)
    with pytest.raises(CorruptStoreError, match=f"{64 << 20} bytes, over the"):
        DenseDataset(store)


def test_a_huge_schema_argument_is_refused_before_any_store_exists(tmp_path):
    big = {"big": "x" * (2 << 20)}
    with pytest.raises(DatasetError, match=r"encodes to \d+ bytes of msgpack, over the "
                                           f"{_schema.MAX_SCHEMA_BYTES}-byte limit"):
        from_numpy(tmp_path / "d", DATA, schema=big)
    with pytest.raises(DatasetError, match="over the"):
        from_iterator(tmp_path / "r", [np.arange(3)], schema=big)
    assert os.listdir(tmp_path) == [], "nothing at the path, no staging directory"


def test_a_huge_or_unencodable_schema_argument_leaves_an_existing_store_unchanged(store):
    before = {f.name: f.read_bytes() for f in store.iterdir() if f.name != "meta.zr"}
    meta = (store / "meta.zr").stat().st_mtime_ns
    with pytest.raises(DatasetError, match="over the"):
        from_numpy(store, DATA, schema={"big": "x" * (2 << 20)})
    with pytest.raises(DatasetError, match="cannot be written as msgpack"):
        from_numpy(store, DATA, schema={"when": object()})
    after = {f.name: f.read_bytes() for f in store.iterdir() if f.name != "meta.zr"}
    assert after == before
    assert (store / "meta.zr").stat().st_mtime_ns == meta
    with DenseDataset(store) as ds:
        assert len(ds) == len(DATA)


def test_the_writer_never_writes_through_a_planted_temporary_file(tmp_path, store):
    """Links planted under the old fixed temporary name and under this process's one, before an
    appending conversion rewrites the schema: the files they point at keep their bytes."""
    targets = {}
    for name in ("schema.msgpack.tmp", os.path.basename(_schema.tmp_name(str(store)))):
        target = tmp_path / f"victim-{len(targets)}"
        target.write_bytes(b"precious bytes, not a schema")
        (store / name).symlink_to(target)
        targets[name] = target
    assert from_numpy(store, DATA, schema={"note": "second"}, append=True) == 2 * len(DATA)
    for target in targets.values():
        assert target.read_bytes() == b"precious bytes, not a schema"
    # The schema was replaced by a regular file with the new content; this process's
    # temporary name holds nothing any more.
    mode = os.lstat(store / "schema.msgpack").st_mode
    assert stat.S_ISREG(mode)
    assert msgpack.unpackb((store / "schema.msgpack").read_bytes())["note"] == "second"
    assert not os.path.lexists(_schema.tmp_name(str(store)))
    with DenseDataset(store) as ds:
        np.testing.assert_array_equal(ds[len(DATA):], DATA)


def test_write_refuses_an_oversized_schema_before_writing(tmp_path):
    big = _schema.Schema("dense", np.dtype("<i4"), (2,), "zstd", {"big": "x" * (2 << 20)})
    with pytest.raises(DatasetError, match="over the"):
        _schema.write(str(tmp_path), big)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(("key", "value", "why"), [
    # 2^32 * 2^32: the int64 product wraps to 0, and 4-byte records passed verify while every
    # read failed.
    ("item_shape", [2**31 - 1, 2**31 - 1, 2**31 - 1], "over the"),
    ("item_shape", [65536, 65536, 65536, 65536], "over the"),
    ("item_shape", [1] * 40, "at most 32"),
    # Strings NumPy's dtype parser answers with SyntaxError or ValueError, not TypeError.
    ("dtype", "f4,,", "not a NumPy dtype"),
    ("dtype", "i4,(2,", "not a NumPy dtype"),
    ("dtype", "[('a', 'f4')", "not a NumPy dtype"),
])
@pytest.mark.parametrize("kind", ["dense", "ragged"])
def test_schema_values_that_used_to_pass_parse(store, key, value, why, kind):
    """Values that parse() accepted before: a shape whose size overflows 64 bits, a dtype string
    that makes NumPy raise SyntaxError (a traceback from DenseDataset and `loaderx info`)."""
    body = schema_body(kind=kind, **{key: value})
    with pytest.raises(DatasetError, match=why):
        _schema.parse(body, "schema.msgpack")
    (store / "schema.msgpack").write_bytes(msgpack.packb(body))
    with pytest.raises(DatasetError, match=why):
        DenseDataset(store)
    r = subprocess.run([sys.executable, "-m", "loaderx", "info", str(store)],
                       capture_output=True, text=True, timeout=DEADLINE)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
