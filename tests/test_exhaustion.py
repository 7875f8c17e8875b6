"""Exhaustion and permissions: a disk that fills up, a read-only store, a missing chunk file,
running out of file descriptors. Each must be a clear exception that names the problem; the
store stays readable and nothing committed is lost.

The full disk and the read-only filesystem are real: a small tmpfs mounted in a private mount
namespace (``unshare -Urm``, no root needed where user namespaces are allowed), so the engine
meets the kernel's own ``ENOSPC`` and ``EROFS``. Where namespaces are not allowed those two tests
skip; the engine's injected-``ENOSPC`` test (``crates/zrecord/tests/power_loss.rs``) always runs.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import reliability as rel
from loaderx.dataset import DenseDataset
from loaderx.errors import CorruptStoreError
from loaderx.zrecord import Zrecord

TESTS = pathlib.Path(__file__).parent


def namespaces_work() -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    return subprocess.run(["unshare", "-Urm", "true"], capture_output=True).returncode == 0


needs_namespaces = pytest.mark.skipif(not namespaces_work(),
                                      reason="unshare -Urm (user + mount namespaces) not allowed")


def run_on_tmpfs(tmp_path: pathlib.Path, size: str, script: str) -> str:
    """Runs ``script`` in a fresh Python whose ``FS`` global is a tmpfs of ``size`` mounted in a
    private mount namespace; returns its stdout, failing the test with its output otherwise."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    prologue = f"FS = {str(mnt)!r}\n"
    shell = 'mount -t tmpfs -o size="$SIZE" tmpfs "$FS" && exec "$PY" -c "$SCRIPT"'
    env = dict(os.environ, FS=str(mnt), SIZE=size, PY=sys.executable,
               SCRIPT=prologue + textwrap.dedent(script),
               PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(["unshare", "-Urm", "sh", "-c", shell], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


@needs_namespaces
def test_disk_full_during_append_is_enospc_and_loses_nothing(tmp_path):
    out = run_on_tmpfs(tmp_path, "4m", """
        import errno, os
        import numpy as np
        import reliability as rel
        from loaderx.zrecord import Zrecord

        path = os.path.join(FS, "s")
        filler = os.path.join(FS, "filler")
        with open(filler, "wb") as f:
            f.write(b"x" * (1 << 20))
        z = Zrecord(path, codec="raw")
        n, error = 0, None
        while error is None:
            src, offsets = rel.pack([rel.make_record(n + j, size_seed=7) for j in range(40)])
            try:
                z.append(src, offsets)
                z.sync()
                n += 40
            except OSError as e:
                error = e
        assert error.errno == errno.ENOSPC, repr(error)
        assert isinstance(error.filename, str) and error.filename.startswith(path), error.filename
        assert len(z) >= n and rel.verify_store(z) == [], "the handle lost records"
        z.close()
        with Zrecord(path) as again:
            assert len(again) >= n and rel.verify_store(again) == []
            kept = len(again)
        # Space comes back: the store takes appends again and keeps all of it.
        os.remove(filler)
        with Zrecord(path, codec="zstd") as z:
            src, offsets = rel.pack([rel.make_record(kept + j) for j in range(40)])
            z.append(src, offsets)
        with Zrecord(path) as z:
            assert len(z) == kept + 40 and rel.verify_store(z) == []
        print("committed", n, "after refill", kept + 40)
    """)
    committed = int(out.split()[1])
    assert committed > 0, out


@needs_namespaces
def test_disk_full_during_a_conversion_rolls_it_back(tmp_path):
    run_on_tmpfs(tmp_path, "3m", """
        import errno, os
        import numpy as np
        from loaderx.converter import from_numpy
        from loaderx.dataset import DenseDataset

        path = os.path.join(FS, "ds")
        rng = np.random.default_rng(0)
        first = rng.integers(0, 255, (64, 1024), dtype=np.uint8)
        from_numpy(path, first, codec="raw")
        big = rng.integers(0, 255, (4096, 1024), dtype=np.uint8)  # 4 MiB on a 3 MiB disk
        try:
            from_numpy(path, big, codec="raw", chunk_bytes=256 << 10)
        except OSError as e:
            assert e.errno == errno.ENOSPC, repr(e)
        else:
            raise AssertionError("a 4 MiB conversion fitted on a 3 MiB filesystem")
        with DenseDataset(path) as ds:
            assert len(ds) == 64 and np.array_equal(ds[:], first)
        print("ok")
    """)


@needs_namespaces
def test_read_only_filesystem_reads_and_refuses_writes_clearly(tmp_path):
    run_on_tmpfs(tmp_path, "16m", """
        import errno, os, subprocess
        import numpy as np
        from loaderx.converter import from_numpy
        from loaderx.dataloader import DataLoader
        from loaderx.dataset import DenseDataset
        from loaderx.zrecord import Zrecord

        path = os.path.join(FS, "ds")
        data = np.arange(200 * 16, dtype=np.float32).reshape(200, 16)
        from_numpy(path, data, codec="zstd")
        subprocess.run(["mount", "-o", "remount,ro", FS], check=True)

        with Zrecord(path) as z:
            assert len(z) == 200
            for call in (lambda: z.append(b"abc", [0]), lambda: z.delete([0]), z.compact):
                try:
                    call()
                except OSError as e:
                    assert e.errno == errno.EROFS, repr(e)
                    assert e.filename == os.path.join(path, "meta.zr"), repr(e)
                else:
                    raise AssertionError("a write to a read-only store succeeded")
        try:
            from_numpy(path, data[:3])
        except OSError as e:
            assert e.errno in (errno.EROFS, errno.EACCES, errno.EPERM), repr(e)
        else:
            raise AssertionError("a conversion into a read-only store succeeded")
        with DenseDataset(path) as ds:
            assert np.array_equal(ds[:], data)
            loader = DataLoader({"x": ds}, batch_size=50, num_workers=2, mode="sequential")
            batch = next(loader)["x"]
            loader.close()
            assert np.array_equal(batch, data[:50])
        print("ok")
    """)


def test_missing_chunk_file_is_a_clear_error(tmp_path):
    path = tmp_path / "s"
    records = [rel.make_record(i) for i in range(50)]
    with Zrecord(path, codec="zstd") as z:
        z.append(*rel.pack(records))
    (path / "0.zr").rename(tmp_path / "0.zr.away")
    with Zrecord(path) as z:
        assert len(z) == 50  # opening is O(1): the table is intact
        with pytest.raises(CorruptStoreError, match=r"0\.zr.*missing"):
            rel.read_records(z, np.arange(3, dtype=np.uint64))
        with pytest.raises(CorruptStoreError, match=r"0\.zr"):
            z.append(*rel.pack([rel.make_record(50)]))
        with pytest.raises(CorruptStoreError):
            z.compact()
        assert len(z) == 50
    assert not (path / "0.zr").exists(), "a failed call recreated the missing chunk"
    # Put the file back: everything is there.
    (tmp_path / "0.zr.away").rename(path / "0.zr")
    with Zrecord(path) as z:
        assert rel.verify_store(z) == []


def test_running_out_of_file_descriptors(tmp_path):
    script = textwrap.dedent(f"""
        import errno, os, resource
        import numpy as np
        import reliability as rel
        from loaderx.zrecord import Zrecord

        root = {str(tmp_path)!r}
        for i in range(3):
            with Zrecord(os.path.join(root, str(i)), codec="raw") as z:
                z.append(*rel.pack([rel.make_record(j) for j in range(20)]))
        # The hard limit too: below it, the engine raises the soft limit itself when it runs
        # out (test_engine_edges.py), and here nothing may be left to raise.
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        late = Zrecord(os.path.join(root, "2"))  # chunk files open on first read
        spare = []
        error = None
        while error is None:
            try:
                spare.append(open(os.devnull))
            except OSError as e:
                error = e
        assert error.errno == errno.EMFILE
        # A store needing a descriptor says so, and names the file.
        for attempt in (lambda: Zrecord(os.path.join(root, "0")),
                        lambda: rel.read_records(late, np.arange(3, dtype=np.uint64))):
            try:
                attempt()
            except OSError as e:
                assert e.errno == errno.EMFILE, repr(e)
                assert e.filename and e.filename.startswith(root), e.filename
            else:
                raise AssertionError("no error without file descriptors")
        for f in spare[:10]:
            f.close()
        # Descriptors are back: the same handle reads, and new handles open.
        assert rel.verify_store(late) == []
        with Zrecord(os.path.join(root, "0")) as z:
            assert len(z) == 20 and rel.verify_store(z) == []
        print("ok")
    """)
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dataset_over_a_missing_chunk_names_it(tmp_path):
    from loaderx.converter import from_numpy

    data = np.arange(100, dtype=np.int64).reshape(25, 4)
    from_numpy(tmp_path / "d", data, codec="raw")
    os.remove(tmp_path / "d" / "0.zr")
    with DenseDataset(tmp_path / "d") as ds:
        assert len(ds) == 25
        with pytest.raises(CorruptStoreError, match=r"0\.zr"):
            ds[3]
