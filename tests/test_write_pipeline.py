"""The write pipeline as converters use it: appends one chunk behind the reading
(``loaderx._appends_behind``), failures in the source or in an append, and stores that come
out byte for byte the same whatever the thread count."""

from __future__ import annotations

import os
import pathlib
import shutil
import threading

import numpy as np
import pytest

import loaderx
from loaderx import converter
from loaderx._appends_behind import AppendsBehind
from loaderx.dataset import DenseDataset, RaggedDataset
from loaderx.zrecord import Zrecord


class SourceBroke(Exception):
    """Raised by a test's source part-way through."""


class _Store:
    """Stands in for a Zrecord: records its appends, fails the ``fail_at``-th, and lets a
    test hold an append until it says so."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.appended: list[int] = []
        self.fail_at = fail_at
        self.release = threading.Event()
        self.release.set()

    def append(self, src: object, offsets: object) -> None:
        self.release.wait()
        if len(self.appended) == self.fail_at:
            raise SourceBroke(f"append {self.fail_at}")
        self.appended.append(int(src))  # type: ignore[call-overload]


def test_an_append_error_is_raised_with_its_type_and_stops_later_appends() -> None:
    store = _Store(fail_at=1)
    behind = AppendsBehind(store)
    behind.submit(0, None)
    behind.submit(1, None)  # fails in the background
    with pytest.raises(SourceBroke, match="append 1") as first:
        behind.submit(2, None)
    with pytest.raises(SourceBroke) as again:
        behind.wait()
    assert again.value is first.value  # the very exception, not a copy or a wrapper
    behind.close()
    assert store.appended == [0]  # nothing after the failed append was appended


def test_submit_waits_for_the_append_under_way() -> None:
    store = _Store()
    store.release.clear()
    behind = AppendsBehind(store)
    behind.submit(0, None)
    handed = threading.Event()

    def second() -> None:
        behind.submit(1, None)
        handed.set()

    t = threading.Thread(target=second)
    t.start()
    assert not handed.wait(0.2)  # at most one chunk in flight besides the one being read
    store.release.set()
    t.join()
    behind.wait()
    behind.close()
    assert store.appended == [0, 1]


def _leftovers(parent: pathlib.Path, keep: set[str]) -> list[str]:
    return sorted(set(os.listdir(parent)) - keep)


def test_a_source_failing_mid_way_commits_nothing_and_leaves_no_staging(
        tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(0)
    records = [rng.integers(0, 50, size=int(n), dtype=np.uint8) for n in
               rng.integers(1000, 30_000, size=200)]

    def source(fail_after: int):
        for i, r in enumerate(records):
            if i == fail_after:
                raise SourceBroke(f"record {i}")
            yield r

    new = tmp_path / "new"
    with pytest.raises(SourceBroke):
        converter.from_iterator(new, source(150), chunk_bytes=64 << 10)
    assert not new.exists()
    assert _leftovers(tmp_path, set()) == []  # no staging directory either

    # Appending to a dataset that exists: it keeps exactly what it had.
    old = tmp_path / "old"
    converter.from_iterator(old, records[:40], chunk_bytes=64 << 10)
    with pytest.raises(SourceBroke):
        converter.from_iterator(old, source(150), chunk_bytes=64 << 10, append=True)
    ds = RaggedDataset(old)
    assert len(ds) == 40
    assert all(np.array_equal(ds[i], records[i]) for i in range(40))
    assert _leftovers(tmp_path, {"old"}) == []
    with Zrecord(old) as z:
        assert len(z) == 40


def test_an_append_failing_in_the_background_undoes_the_conversion(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arr = np.arange(400 * 1024, dtype=np.uint8).reshape(400, 1024)
    base = tmp_path / "base"
    converter.from_numpy(base, arr[:100])
    calls = []
    real = Zrecord.append

    def flaky(self: Zrecord, *args: object, **kw: object) -> object:
        calls.append(threading.current_thread().name)
        if len(calls) == 3:
            raise SourceBroke("the disk went away")
        return real(self, *args, **kw)

    monkeypatch.setattr(Zrecord, "append", flaky)
    with pytest.raises(SourceBroke, match="went away"):
        converter.from_numpy(base, arr, chunk_bytes=32 << 10, append=True)
    monkeypatch.undo()
    assert calls and set(calls) == {"loaderx-append"}  # the appends ran behind the reading
    ds = DenseDataset(base)
    assert len(ds) == 100 and np.array_equal(ds[np.arange(100)], arr[:100])
    assert _leftovers(tmp_path, {"base"}) == []


def _store_bytes(path: pathlib.Path) -> dict[str, bytes]:
    with Zrecord(path) as z:
        used = 16 + 16 * len(z)
    out = {}
    for name in sorted(os.listdir(path)):
        with open(path / name, "rb") as f:
            out[name] = f.read(used) if name in ("meta.zr", "sums.zr") else f.read()
    return out


@pytest.mark.parametrize("codec", ["zstd", "zstd_dict"])
def test_the_same_bytes_on_every_thread_count(tmp_path: pathlib.Path, codec: str) -> None:
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 256, size=(3000, 2048), dtype=np.uint8)
    arr[:, 1024:] = arr[:, :1]  # half of every record compresses, some records shrink
    arr[::7] = rng.integers(0, 256, size=arr[::7].shape, dtype=np.uint8)  # these do not
    # The dictionary is trained once (training on several threads may pick other
    # parameters): every run appends to a copy of the same store.
    base = tmp_path / "base"
    converter.from_numpy(base, arr[:500], codec=codec, checksums=True)
    got = []
    try:
        for threads in (1, 2, 5):
            loaderx.set_num_threads(threads)
            out = tmp_path / f"t{threads}"
            shutil.copytree(base, out)
            converter.from_numpy(out, arr[500:], codec=codec, chunk_bytes=1 << 20, append=True)
            got.append(_store_bytes(out))
            assert np.array_equal(DenseDataset(out)[np.arange(500, len(arr))], arr[500:])
    finally:
        loaderx.set_num_threads(0)
    assert got[0].keys() == got[1].keys() == got[2].keys()
    assert "sums.zr" in got[0]
    for name in got[0]:
        assert got[0][name] == got[1][name] == got[2][name], name
