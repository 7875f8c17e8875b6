"""Converters: what from_numpy and from_iterator write, how they append, and that a refused or
failed conversion leaves the dataset exactly as it was."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaderx.converter import from_iterator, from_numpy
from loaderx.dataset import DenseDataset, RaggedDataset
from loaderx.errors import DatasetError, LimitExceededError, ZrecordValueError
from loaderx.zrecord import Zrecord


def schema_of(path: pathlib.Path) -> dict:
    return msgpack.unpackb((path / "schema.msgpack").read_bytes())


def snapshot(path: pathlib.Path) -> dict[str, bytes]:
    """Every byte of a store directory (the 256 MiB meta.zr by its non-zero pages)."""
    out = {}
    for f in sorted(path.iterdir()):
        data = f.read_bytes() if f.name != "meta.zr" else _meta_digest(f)
        out[f.name] = data
    return out


def _meta_digest(f: pathlib.Path) -> bytes:
    with open(f, "rb") as fh:
        head = fh.read(16 + 16 * 4096)
    return head


DTYPES = ["<f4", "|u1", "<i8", "<f2", "|b1", "<i4", ">f8", "<c8", "<M8[ns]"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_from_numpy_round_trips_every_dtype(tmp_path, dtype, codec):
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 50, size=(37, 3, 2)).astype(dtype)
    n = from_numpy(tmp_path / "d", arr, codec=codec, chunk_bytes=100)
    assert n == 37
    s = schema_of(tmp_path / "d")
    assert s == {"kind": "dense", "dtype": np.dtype(dtype).str, "item_shape": [3, 2],
                 "format": "loaderx-zrecord", "version": 1, "codec": codec}
    with DenseDataset(tmp_path / "d") as ds:
        got = ds[:]
        assert got.dtype == np.dtype(dtype) and got.shape == arr.shape
        np.testing.assert_array_equal(got, arr)


def test_one_dimensional_array_is_a_dataset_of_scalars(tmp_path):
    labels = np.arange(1000, dtype=np.int64) * 7
    from_numpy(tmp_path / "y", labels)
    assert schema_of(tmp_path / "y")["item_shape"] == []
    with DenseDataset(tmp_path / "y") as ds:
        assert ds[3] == 21 and isinstance(ds[3], np.int64)
        np.testing.assert_array_equal(ds[[999, 0]], [6993, 0])


def test_zstd_dict_trains_before_writing_and_compresses_better(tmp_path):
    # Small, similar records: a dictionary captures what per-record zstd cannot see.
    rng = np.random.default_rng(2)
    base = rng.integers(0, 255, size=256, dtype=np.uint8)
    arr = np.stack([np.roll(base, int(k)) ^ (rng.random(256) < 0.03).astype(np.uint8)
                    for k in rng.integers(0, 8, size=4000)])
    from_numpy(tmp_path / "plain", arr, codec="zstd")
    from_numpy(tmp_path / "dict", arr, codec="zstd_dict")
    with Zrecord(tmp_path / "plain") as a, Zrecord(tmp_path / "dict") as b:
        assert b.has_dict() and not a.has_dict()
        assert b.stats()["live_bytes"] * 2 < a.stats()["live_bytes"]
        assert b.stats()["dict_bytes"] <= 112_640
    with DenseDataset(tmp_path / "dict") as ds:
        np.testing.assert_array_equal(ds[:], arr)
    # dict_size caps the dictionary.
    from_numpy(tmp_path / "capped", arr, codec="zstd_dict", dict_size=2048)
    with Zrecord(tmp_path / "capped") as c:
        assert 0 < c.stats()["dict_bytes"] <= 2048


def test_zstd_dict_on_too_little_data_is_a_clear_error(tmp_path):
    with pytest.raises(ZrecordValueError, match="dictionary"):
        from_numpy(tmp_path / "tiny", np.arange(4, dtype=np.uint8).reshape(2, 2),
                   codec="zstd_dict")
    assert not (tmp_path / "tiny").exists()


def test_appending_to_an_existing_dataset(tmp_path):
    a = np.arange(30, dtype=np.float32).reshape(10, 3)
    b = -np.arange(6, dtype=np.float32).reshape(2, 3)
    assert from_numpy(tmp_path / "d", a, codec="raw") == 10
    assert from_numpy(tmp_path / "d", b, codec="zstd", append=True) == 12  # codec may change
    assert schema_of(tmp_path / "d")["codec"] == "zstd"
    with DenseDataset(tmp_path / "d") as ds:
        np.testing.assert_array_equal(ds[:], np.concatenate([a, b]))
    # overwrite=True starts afresh.
    assert from_numpy(tmp_path / "d", b, overwrite=True) == 2
    with DenseDataset(tmp_path / "d") as ds:
        np.testing.assert_array_equal(ds[:], b)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


@pytest.mark.parametrize("other", [
    np.zeros((2, 3), dtype=np.float64),     # dtype
    np.zeros((2, 4), dtype=np.float32),     # item shape
    np.zeros((2, 3, 1), dtype=np.float32),  # rank
])
def test_mismatched_append_is_refused_before_writing(tmp_path, other):
    from_numpy(tmp_path / "d", np.ones((5, 3), dtype=np.float32))
    before = snapshot(tmp_path / "d")
    with pytest.raises(DatasetError, match="cannot append"):
        from_numpy(tmp_path / "d", other)
    assert snapshot(tmp_path / "d") == before


def test_kind_mismatch_is_refused(tmp_path):
    from_iterator(tmp_path / "r", [np.arange(3, dtype=np.float32)])
    with pytest.raises(DatasetError, match="ragged"):
        from_numpy(tmp_path / "r", np.ones((2, 3), dtype=np.float32))
    with pytest.raises(DatasetError, match="RaggedDataset"):
        DenseDataset(tmp_path / "r")


@pytest.mark.parametrize("bad", [
    np.array([{"a": 1}, None], dtype=object),
    np.zeros(3, dtype=[("a", "<i4"), ("b", "<f4")]),
])
def test_object_and_structured_dtypes_are_refused(tmp_path, bad):
    with pytest.raises(DatasetError, match="object|structured"):
        from_numpy(tmp_path / "d", bad)
    with pytest.raises(DatasetError, match="object|structured"):
        from_iterator(tmp_path / "r", [bad])
    assert not (tmp_path / "d").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("dtype", ["|O", [["a", "<i4"]]])
def test_a_schema_file_declaring_unusable_dtypes_is_refused(tmp_path, dtype):
    from_numpy(tmp_path / "d", np.ones((2, 2), dtype=np.int32))
    s = schema_of(tmp_path / "d")
    s["dtype"] = dtype
    (tmp_path / "d" / "schema.msgpack").write_bytes(msgpack.packb(s))
    with pytest.raises(DatasetError, match="dtype"):
        DenseDataset(tmp_path / "d")


def test_schema_extra_keys_are_kept_and_reserved_ones_checked(tmp_path):
    arr = np.ones((4, 2), dtype=np.int16)
    from_numpy(tmp_path / "d", arr, schema={"source": "unit test", "dtype": "<i2"})
    s = schema_of(tmp_path / "d")
    assert s["source"] == "unit test" and s["dtype"] == "<i2"
    with DenseDataset(tmp_path / "d") as ds:
        assert ds.schema["source"] == "unit test"
    with pytest.raises(DatasetError, match="contradicts"):
        from_numpy(tmp_path / "e", arr, schema={"item_shape": [1, 2]})
    assert not (tmp_path / "e").exists()


def test_from_iterator_arrays_and_bytes(tmp_path):
    rng = np.random.default_rng(3)
    recs = [rng.normal(size=(int(k), 3)).astype(np.float32) for k in rng.integers(0, 40, 300)]
    assert from_iterator(tmp_path / "r", iter(recs), chunk_bytes=1000) == 300
    assert schema_of(tmp_path / "r")["item_shape"] == [3]
    with RaggedDataset(tmp_path / "r") as rs:
        got = rs[:]
        assert len(got) == 300
        for g, r in zip(got, recs, strict=True):
            assert g.dtype == np.float32 and g.shape == r.shape
            np.testing.assert_array_equal(g, r)
        np.testing.assert_array_equal(rs.lengths([0, 1, 2]), [len(r) for r in recs[:3]])

    blobs = [b"alpha", b"", bytearray(b"gamma!"), memoryview(b"delta")]
    from_iterator(tmp_path / "b", blobs)
    assert schema_of(tmp_path / "b")["dtype"] == "|u1"
    with RaggedDataset(tmp_path / "b") as rs:
        assert [r.tobytes() for r in rs[:]] == [bytes(b) for b in blobs]


def test_from_iterator_mismatch_midway_rolls_back(tmp_path):
    first = [np.arange(5, dtype=np.int32) for _ in range(50)]
    from_iterator(tmp_path / "r", first)
    before = snapshot(tmp_path / "r")

    def source():
        for i in range(200):  # several appends go through before the bad record
            yield np.arange(i % 17, dtype=np.int32)
        yield np.arange(3, dtype=np.int64)

    with pytest.raises(DatasetError, match="record 200"):
        from_iterator(tmp_path / "r", source(), chunk_bytes=64, append=True)
    with RaggedDataset(tmp_path / "r") as rs:
        assert len(rs) == 50
        assert all((r == np.arange(5)).all() for r in rs[:])
    after = snapshot(tmp_path / "r")
    assert after["schema.msgpack"] == before["schema.msgpack"]
    # Compaction freed the rolled-back tail: the old bytes, then only a hole (zeros; the file
    # keeps its size so that readers mapping it never lose a page).
    old = len(before["0.zr"])
    assert after["0.zr"][:old] == before["0.zr"]
    assert after["0.zr"][old:].count(0) == len(after["0.zr"]) - old


def test_a_record_over_one_mib_is_refused(tmp_path):
    with pytest.raises(LimitExceededError, match="limit"):
        from_numpy(tmp_path / "d", np.zeros((2, (1 << 20) + 1), dtype=np.uint8))
    with pytest.raises(LimitExceededError, match="record 1"):
        from_iterator(tmp_path / "r", [np.zeros(4, np.uint8), np.zeros((1 << 20) + 1, np.uint8)])
    assert not (tmp_path / "d").exists() and not (tmp_path / "r").exists()


def test_overwrite_keeps_the_old_dataset_when_the_new_one_fails(tmp_path):
    from_iterator(tmp_path / "r", [np.arange(4, dtype=np.int32)] * 3)

    def bad():
        yield np.arange(2, dtype=np.int32)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        from_iterator(tmp_path / "r", bad(), overwrite=True)
    with RaggedDataset(tmp_path / "r") as rs:
        assert len(rs) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_refuses_to_write_into_a_foreign_directory(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="not a loaderx dataset"):
        from_numpy(tmp_path / "d", np.ones((2, 2)))
    assert os.listdir(tmp_path / "d") == ["notes.txt"]


def test_bad_arguments(tmp_path):
    with pytest.raises(ZrecordValueError, match="codec"):
        from_numpy(tmp_path / "d", np.ones(3), codec="lz4")
    with pytest.raises(ZrecordValueError, match="chunk_bytes"):
        from_numpy(tmp_path / "d", np.ones(3), chunk_bytes=0)
    with pytest.raises(DatasetError, match="dimension"):
        from_numpy(tmp_path / "d", np.float32(3))
    with pytest.raises(DatasetError, match="no records"):
        from_iterator(tmp_path / "d", [])
    with pytest.raises(DatasetError, match="scalar"):
        from_iterator(tmp_path / "d", [np.int32(4)])


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=3),
    n=st.integers(0, 40),
    chunk=st.integers(1, 300),
    codec=st.sampled_from(["raw", "zstd"]),
)
def test_from_numpy_matches_the_array(tmp_path_factory, shape, n, chunk, codec):
    path = tmp_path_factory.mktemp("h") / "d"
    arr = (np.arange(n * int(np.prod(shape, dtype=np.int64))) % 251).astype(np.uint16)
    arr = arr.reshape((n, *shape))
    assert from_numpy(path, arr, codec=codec, chunk_bytes=chunk) == n
    with DenseDataset(path) as ds:
        assert len(ds) == n and ds.item_shape == tuple(shape)
        np.testing.assert_array_equal(ds[:], arr)


def test_converting_an_mmap_never_materializes_it(tmp_path):
    """Converting a 192 MiB memmapped .npy in 8 MiB chunks: anonymous memory (RssAnon, not the
    file pages of the map that ru_maxrss would count) grows by far less than the array."""
    script = textwrap.dedent("""
        import sys, threading, time
        import numpy as np
        from loaderx.converter import from_numpy

        def anon_kib():
            for line in open("/proc/self/status"):
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])

        npy, out = sys.argv[1], sys.argv[2]
        arr = np.lib.format.open_memmap(npy, mode="w+", dtype=np.uint8, shape=(16384, 12288))
        arr[:] = (np.arange(12288, dtype=np.uint8) // 7)[None, :]
        arr.flush()
        del arr
        src = np.load(npy, mmap_mode="r")
        peak, stop = [anon_kib()], False
        base = peak[0]

        def watch():
            while not stop:
                peak[0] = max(peak[0], anon_kib())
                time.sleep(0.002)

        t = threading.Thread(target=watch)
        t.start()
        from_numpy(out, src, codec="zstd", chunk_bytes=8 << 20)
        stop = True
        t.join()
        print((peak[0] - base) // 1024)
    """)
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "a.npy"),
                        str(tmp_path / "d")], capture_output=True, text=True, check=True)
    grew_mib = int(r.stdout.strip().splitlines()[-1])
    assert grew_mib < 64, f"anonymous memory grew by {grew_mib} MiB converting 192 MiB"
    with DenseDataset(tmp_path / "d") as ds:
        assert len(ds) == 16384
        np.testing.assert_array_equal(ds[[0, 16383]][1], np.arange(12288, dtype=np.uint8) // 7)


def test_converter_output_is_durable_on_return(tmp_path):
    """A converter syncs before returning: another process opening the store right away (a
    reader sees only synced lengths) sees every record."""
    from_numpy(tmp_path / "d", np.arange(100, dtype=np.int32))
    code = ("from loaderx.dataset import DenseDataset; import sys; "
            "print(len(DenseDataset(sys.argv[1])))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "d")], capture_output=True,
                       text=True, check=True)
    assert r.stdout.strip() == "100"


def test_progress_bar_when_asked(tmp_path, monkeypatch):
    """progress=True drives tqdm (a stand-in here) with the record count; progress=False and a
    non-terminal stderr stay silent."""
    import types

    updates: list[int] = []

    class FakeBar:
        def __init__(self, total=None, desc=None, unit=None):
            updates.append(-1 if total is None else total)

        def update(self, n):
            updates.append(n)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    fake = types.ModuleType("tqdm.auto")
    fake.tqdm = FakeBar
    monkeypatch.setitem(sys.modules, "tqdm", types.ModuleType("tqdm"))
    monkeypatch.setitem(sys.modules, "tqdm.auto", fake)
    from_numpy(tmp_path / "d", np.zeros((10, 4), np.uint8), chunk_bytes=16, progress=True)
    assert updates[0] == 10 and sum(updates[1:]) == 10 and len(updates) == 4
    updates.clear()
    from_numpy(tmp_path / "e", np.zeros((10, 4), np.uint8), progress=False)
    from_numpy(tmp_path / "f", np.zeros((10, 4), np.uint8))  # stderr is not a terminal here
    assert updates == []


def test_progress_shows_the_dictionary_training_and_a_sized_total(tmp_path, monkeypatch, capsys):
    """Without tqdm, the one-line display says when the dictionary is being trained (no record
    is written then), and from_iterator over a list shows a total."""
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    rng = np.random.default_rng(0)
    recs = [rng.integers(0, 4, 300, dtype=np.uint8) for _ in range(400)]
    from_iterator(tmp_path / "d", recs, codec="zstd_dict", progress=True)
    err = capsys.readouterr().err
    assert "training the zstd dictionary..." in err
    assert "400/400 records" in err and "100.0%" in err
    from_numpy(tmp_path / "n", np.stack(recs), codec="zstd_dict", progress=True)
    assert "training the zstd dictionary..." in capsys.readouterr().err


# -- issue 19: appends that were not asked for, and the safe creation path ---------------------


def test_an_append_not_asked_for_warns_once_and_append_false_refuses(tmp_path):
    """Re-running a conversion on the same path appends, as 0.9.11 does, but says so once per
    path (naming append=True and overwrite=True); append=True is silent; append=False refuses
    an existing dataset, and append=True with overwrite=True is a contradiction."""
    import warnings

    from loaderx.errors import AppendWarning, LoaderxValueError

    a = np.arange(6, dtype=np.int32).reshape(3, 2)
    from_numpy(tmp_path / "d", a)
    with pytest.warns(AppendWarning, match=r"append=True.*overwrite=True"):
        assert from_numpy(tmp_path / "d", a) == 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert from_numpy(tmp_path / "d", a) == 9  # once per path
        assert from_numpy(tmp_path / "d", a, append=True) == 12
        from_iterator(tmp_path / "r", [b"x"])
        assert from_iterator(tmp_path / "r", [b"y"], append=True) == 2
    with pytest.warns(AppendWarning):
        from_iterator(tmp_path / "r", [b"z"])
    before = snapshot(tmp_path / "d")
    with pytest.raises(DatasetError, match="append=False"):
        from_numpy(tmp_path / "d", a, append=False)
    with pytest.raises(DatasetError, match="append=False"):
        from_iterator(tmp_path / "r", [b"z"], append=False)
    with pytest.raises(LoaderxValueError, match="contradict"):
        from_numpy(tmp_path / "d", a, append=True, overwrite=True)
    assert snapshot(tmp_path / "d") == before
    assert from_numpy(tmp_path / "new", a, append=False) == 3  # nothing there: fine
    assert from_numpy(tmp_path / "d", a, append=False, overwrite=True) == 3


def test_an_append_keeps_the_schema_extra_keys(tmp_path):
    from_numpy(tmp_path / "d", np.ones((2, 2), np.int8), schema={"source": "a", "n": 1})
    from_numpy(tmp_path / "d", np.ones((2, 2), np.int8), schema={"n": 2}, append=True)
    s = schema_of(tmp_path / "d")
    assert s["source"] == "a" and s["n"] == 2


@pytest.mark.parametrize("how", ["enospc", "directory-at-temporary-name"])
def test_an_append_whose_schema_rewrite_fails_is_undone(tmp_path, monkeypatch, how):
    """The schema rewrite is the last step of an append: when it fails, the appended records
    go too, so a retry does not add them twice."""
    from loaderx._store import schema as _schema

    first = np.arange(10, dtype=np.int64).reshape(5, 2)
    more = -first
    from_numpy(tmp_path / "d", first, codec="raw")
    before = schema_of(tmp_path / "d")
    if how == "enospc":
        def full(path, schema):
            raise OSError(28, "No space left on device", path)
        monkeypatch.setattr(_schema, "write", full)
    else:  # the engine's durable write refuses what it cannot remove at its temporary name
        tmp = pathlib.Path(_schema.tmp_name(str(tmp_path / "d")))
        tmp.mkdir()
        (tmp / "x").write_text("x")
    with pytest.raises(OSError):
        from_numpy(tmp_path / "d", more, codec="zstd", append=True)
    monkeypatch.undo()
    if how != "enospc":
        import shutil
        shutil.rmtree(tmp)
    with DenseDataset(tmp_path / "d") as ds:
        assert len(ds) == 5
    assert schema_of(tmp_path / "d") == before
    assert from_numpy(tmp_path / "d", more, codec="zstd", append=True) == 10  # the retry
    with DenseDataset(tmp_path / "d") as ds:
        np.testing.assert_array_equal(ds[:], np.concatenate([first, more]))


def test_a_failed_overwrite_leaves_the_old_dataset_writable(tmp_path, monkeypatch):
    """The swap of an overwrite fails (here as onto a mount point: EBUSY): the old dataset is
    neither retired nor changed, and later conversions can still append to it."""
    from loaderx import _native

    old = np.arange(8, dtype=np.int16).reshape(4, 2)
    from_numpy(tmp_path / "d", old)
    real_rename = os.rename

    def busy(a, b, *args, **kw):
        if os.path.abspath(os.fspath(b)) == str(tmp_path / "d") or \
                os.path.abspath(os.fspath(a)) == str(tmp_path / "d"):
            raise OSError(16, "Device or resource busy", os.fspath(b))
        return real_rename(a, b, *args, **kw)

    monkeypatch.setattr(os, "rename", busy)
    monkeypatch.setattr(_native, "rename_exchange", busy, raising=False)
    with pytest.raises((DatasetError, OSError), match="busy|mount point"):
        from_numpy(tmp_path / "d", np.zeros((3, 2), np.int16), overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert from_numpy(tmp_path / "d", old, append=True) == 8  # still writable
    with DenseDataset(tmp_path / "d") as ds:
        np.testing.assert_array_equal(ds[:], np.concatenate([old, old]))


def test_a_symlink_planted_at_a_guessable_staging_name_is_not_followed(tmp_path):
    """Conversions used to build in ``<path>.loaderx-new-<pid>`` and followed a link planted
    there: the records (and the schema) landed in another directory."""
    victim = tmp_path / "victim"
    from_numpy(victim, np.ones((2, 2), np.float32))
    before = snapshot(victim)
    for name in (f"d.loaderx-new-{os.getpid()}", f"d.loaderx-new-{os.getpid()}.old",
                 f".d.loaderx-new-{os.getpid()}", "d.tmp"):
        os.symlink(victim, tmp_path / name)
    from_numpy(tmp_path / "d", np.zeros((3, 2), np.float32))
    from_numpy(tmp_path / "d", np.zeros((3, 2), np.float32), overwrite=True)
    assert snapshot(victim) == before
    with DenseDataset(tmp_path / "d") as ds:
        np.testing.assert_array_equal(ds[:], np.zeros((3, 2), np.float32))


@pytest.mark.parametrize("seen", [True, False], ids=["ismount", "only-ebusy"])
def test_converting_into_an_empty_mount_point(tmp_path, monkeypatch, seen):
    """An empty directory that is a mount point cannot be renamed onto or away (EBUSY, injected
    here): the store is built inside it and its files moved in, meta.zr last -- whether
    os.path.ismount says so up front or only the rename does."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    real_rename = os.rename

    def rename(a, b, *args, **kw):
        if str(mnt) in (os.path.abspath(os.fspath(a)), os.path.abspath(os.fspath(b))):
            raise OSError(16, "Device or resource busy", os.fspath(b))
        return real_rename(a, b, *args, **kw)

    monkeypatch.setattr(os, "rename", rename)
    if seen:
        real = os.path.ismount
        monkeypatch.setattr(os.path, "ismount", lambda p: os.path.abspath(p) == str(mnt)
                            or real(p))
    arr = np.arange(40, dtype=np.float64).reshape(10, 4)
    assert from_numpy(mnt, arr, codec="zstd") == 10
    assert from_numpy(mnt, arr, append=True) == 20
    with DenseDataset(mnt) as ds:
        np.testing.assert_array_equal(ds[:], np.concatenate([arr, arr]))
    assert not [p for p in os.listdir(mnt) if "loaderx-" in p]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnt"]
    if seen:  # a swap there is refused before anything is built
        with pytest.raises(DatasetError, match="mount point"):
            from_numpy(mnt, arr, overwrite=True)
        with DenseDataset(mnt) as ds:
            assert len(ds) == 20


def test_relative_paths_and_a_parent_of_dot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arr = np.arange(6, dtype=np.uint8).reshape(3, 2)
    assert from_numpy("d", arr) == 3
    assert from_numpy("./d/", arr, append=True) == 6
    assert from_numpy("d", arr, overwrite=True) == 3
    assert from_iterator("r", [b"ab", b"c"]) == 2
    os.mkdir("sub")
    assert from_numpy(os.path.join("sub", "x"), arr) == 3
    assert sorted(os.listdir(".")) == ["d", "r", "sub"] and os.listdir("sub") == ["x"]
    with DenseDataset("d") as ds:
        np.testing.assert_array_equal(ds[:], arr)


def test_overwrite_through_a_symbolic_link_is_refused(tmp_path):
    """A swap would replace the link itself and retire the dataset it points to."""
    from_numpy(tmp_path / "real", np.ones((2, 2), np.int8))
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(DatasetError, match="symbolic link"):
        from_numpy(tmp_path / "link", np.zeros((3, 2), np.int8), overwrite=True)
    assert from_numpy(tmp_path / "link", np.ones((1, 2), np.int8), append=True) == 3
    assert from_numpy(tmp_path / "real", np.zeros((3, 2), np.int8), overwrite=True) == 3


def test_missing_parent_directories_are_created(tmp_path):
    assert from_numpy(tmp_path / "a" / "b" / "d", np.ones((2, 2), np.int8)) == 2
    assert os.listdir(tmp_path / "a" / "b") == ["d"]


def test_codec_auto_stores_small_records_raw_and_large_ones_with_zstd(tmp_path):
    """``codec="auto"`` follows the measured rule: zstd costs far more per small record to
    decode than it saves (scripts/bench_fixed.py), so records under 4 KiB are stored raw."""
    from loaderx.converter import AUTO_RAW_BELOW
    from loaderx.dataset import DenseDataset

    rng = np.random.default_rng(0)
    small = rng.integers(0, 17, (300, 8, 8)).astype(np.float32)         # 256 B records
    large = np.tile(np.arange(1024, dtype=np.int32), (40, 1))             # 4 KiB records
    assert small[0].nbytes < AUTO_RAW_BELOW <= large[0].nbytes
    from_numpy(tmp_path / "small", small, codec="auto", progress=False)
    from_numpy(tmp_path / "large", large, codec="auto", progress=False)
    with DenseDataset(tmp_path / "small") as s, DenseDataset(tmp_path / "large") as big:
        assert s.schema["codec"] == "raw" and big.schema["codec"] == "zstd"
        np.testing.assert_array_equal(s[np.arange(300)], small)
        np.testing.assert_array_equal(big[np.arange(40)], large)
