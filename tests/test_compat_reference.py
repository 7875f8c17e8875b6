"""Byte compatibility with the reference implementation, in both directions: stores we write
are read by loaderx==0.9.11, and stores it writes are read by us. The reference is installed
from PyPI into its own virtual environment (``.cache/loaderx-0.9.11-venv``, reused across runs),
the way redb tests against a pinned old release; the test is skipped only when the registry
cannot be reached."""

from __future__ import annotations

import os
import pathlib
import subprocess
import venv

import numpy as np
import pytest

import ref_peer
from loaderx.zrecord import Zrecord

ROOT = pathlib.Path(__file__).resolve().parent.parent
PEER = pathlib.Path(__file__).resolve().parent / "ref_peer.py"
VENV = pathlib.Path(os.environ.get("LOADERX_REF_VENV", ROOT / ".cache" / "loaderx-0.9.11-venv"))


def reference_python() -> pathlib.Path:
    py = VENV / "bin" / "python"
    marker = VENV / ".installed"
    if marker.exists():
        return py
    if not py.exists():
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    try:
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "loaderx==0.9.11", "numpy", "msgpack"],
            check=True, capture_output=True, timeout=600,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        out = getattr(e, "stderr", b"") or b""
        pytest.skip(f"cannot install loaderx==0.9.11 from the registry: {out.decode()[-300:]}")
    marker.write_text("loaderx==0.9.11\n")
    return py


@pytest.fixture(scope="module")
def peer():
    py = reference_python()

    def run(*args: str) -> None:
        # An empty working directory and no PYTHONPATH: the peer sees only the reference.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        subprocess.run([str(py), str(PEER), *args], check=True, env=env, cwd=VENV, timeout=300)

    return run


def load(npz: pathlib.Path) -> list[bytes]:
    with np.load(npz) as z:
        return [z[f"arr_{i}"].tobytes() for i in range(len(z.files))]


def test_reference_reads_what_we_write(peer, tmp_path):
    store = tmp_path / "ours"
    model: list[bytes] = []
    with Zrecord(store, codec="zstd") as z:
        z.train_dict(*ref_peer.dict_samples(5), 4096)
        for codec, recs in ref_peer.make_batches(5):
            z.append(*ref_peer.pack(recs), codec=codec)
            model += recs
        z.delete(ref_peer.DELETES)
        ref_peer.apply_deletes(model, ref_peer.DELETES)
        z.compact()
        stats = z.stats()
    assert 0 < stats["compressed_records"] < len(model)
    peer("read", str(store), str(tmp_path / "read.npz"))
    assert load(tmp_path / "read.npz") == model


def test_we_read_what_the_reference_writes(peer, tmp_path):
    store = tmp_path / "theirs"
    peer("write", str(store), str(tmp_path / "expected.npz"))
    expected = load(tmp_path / "expected.npz")
    with Zrecord(store) as z:
        assert z.has_dict()
        assert ref_peer.read_store(z) == expected
        # And we can go on writing it, then hand it back.
        extra = [b"appended by the rust engine" * 10, b""]
        z.append(*ref_peer.pack(extra), codec="zstd_dict")
    peer("read", str(store), str(tmp_path / "back.npz"))
    assert load(tmp_path / "back.npz") == expected + extra
