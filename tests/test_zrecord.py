"""The Zrecord Python API: round trips, the destination contract, and clear errors for every
kind of bad input."""

from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest

from loaderx import errors
from loaderx.zrecord import MAX_RECORD_BYTES, Zrecord


def records(n: int, seed: int = 0, max_len: int = 5000) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        size = int(rng.integers(0, max_len))
        base = np.arange(size, dtype=np.uint8) // 4 + np.uint8(i % 200)
        noise = rng.integers(0, 3, size=size, dtype=np.uint8)
        out.append((base + noise).tobytes())
    return out


def pack(recs: list[bytes]) -> tuple[bytes, np.ndarray]:
    sizes = np.array([len(r) for r in recs], dtype=np.uint64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.uint64)
    return b"".join(recs), offsets


def read(z: Zrecord, idx) -> list[bytes]:
    idx = np.asarray(idx, dtype=np.uint64)
    lens = z.lengths(idx).astype(np.uint64)
    offsets = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.uint64)
    dst = np.zeros(int(lens.sum()), dtype=np.uint8)
    z.gather(idx, dst, offsets)
    return [dst[o : o + n].tobytes() for o, n in zip(offsets, lens, strict=True)]


@pytest.fixture
def store(tmp_path):
    with Zrecord(tmp_path / "s") as z:
        yield z


@pytest.mark.parametrize("codec", ["raw", "zstd", "zstd_dict"])
def test_round_trip_every_codec(tmp_path, codec):
    recs = records(300) + [b"", b"x", bytes(MAX_RECORD_BYTES)]
    with Zrecord(tmp_path / "s", codec=codec) as z:
        if codec == "zstd_dict":
            sample, _ = pack(recs[:200])
            sizes = [len(r) for r in recs[:200]]
            assert 0 < z.train_dict(sample, sizes, 8192) <= 8192
            assert z.has_dict()
        src, offsets = pack(recs)
        assert z.append(src, offsets) == 0
        assert len(z) == len(recs)
        assert read(z, range(len(recs))) == recs
        st = z.stats()
        assert st["records"] == len(recs)
        assert st["logical_bytes"] == sum(map(len, recs))
        if codec == "raw":
            assert st["compressed_records"] == 0
        else:
            assert st["live_bytes"] < st["logical_bytes"]
            assert st["compressed_records"] > 250
    with Zrecord(tmp_path / "s", codec="raw") as z:
        assert read(z, np.arange(len(recs))[::-1]) == recs[::-1]


def test_any_dtype_source_and_destination(store):
    rows = np.arange(60, dtype=np.float32).reshape(5, 3, 4)
    store.append(rows, np.arange(5) * 48)
    out = np.full((3, 3, 4), -1, dtype=np.float32)
    store.gather([4, 0, 2], out, np.arange(3) * 48)
    np.testing.assert_array_equal(out, rows[[4, 0, 2]])
    # Offsets are in bytes, so records can land anywhere in any dtype's buffer.
    words = np.zeros(2 * 12 + 4, dtype=np.float32)
    store.gather([1, 3], words, [16, 16 + 48])
    np.testing.assert_array_equal(words[4:16], rows[1].ravel())
    np.testing.assert_array_equal(words[16:28], rows[3].ravel())
    assert (words[:4] == 0).all()


def test_codec_per_append(store):
    data = bytes(1000)
    store.append(data, [0], codec="raw")
    store.append(data, [0], codec="zstd")
    assert store.stats()["compressed_records"] == 1
    assert read(store, [0, 1]) == [data, data]


@pytest.mark.parametrize(
    "idxs, exc",
    [
        ([5], errors.ZrecordIndexError),
        ([-1], errors.ZrecordIndexError),
        (np.array([0.0]), errors.ZrecordIndexError),
        ([True], errors.ZrecordIndexError),
        (np.array([1, 2**40]), errors.ZrecordIndexError),
    ],
)
def test_bad_indices(store, idxs, exc):
    store.append(b"abcdef", [0, 3])
    dst = np.zeros(16, dtype=np.uint8)
    with pytest.raises(exc) as info:
        store.gather(idxs, dst, [0] * len(idxs))
    assert isinstance(info.value, IndexError)
    with pytest.raises(IndexError):
        store.lengths(idxs)
    assert (dst == 0).all()


def test_destination_contract(store):
    store.append(b"abcdef", [0, 3])
    base = np.zeros(16, dtype=np.uint8)
    with pytest.raises(ValueError, match="C-contiguous"):
        store.gather([0], base[::2], [0])
    ro = np.zeros(16, dtype=np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        store.gather([0], ro, [0])
    with pytest.raises(ValueError, match="too small"):
        store.gather([0, 1], base, [0, 14])
    with pytest.raises(ValueError, match="overlap"):
        store.gather([0, 1], base, [0, 2])
    with pytest.raises(ValueError, match="offsets"):
        store.gather([0, 1], base, [0])
    with pytest.raises(ValueError, match="negative"):
        store.gather([0], base, [-1])
    with pytest.raises(ValueError, match="read-only"):
        store.gather([0], b"immutable bytes", [0])
    assert (base == 0).all(), "a refused gather writes nothing"


# Arrays of these kinds go straight to the native gather; everything else is converted first.
# Both routes must read the same bytes and refuse the same bad input with the same errors.
INDEX_FORMS = [
    list,
    lambda v: np.array(v, dtype=np.int64),
    lambda v: np.array(v, dtype=np.uint64),
    lambda v: np.array(v, dtype=np.int32),
    lambda v: np.array(v, dtype=np.int64)[::-1][::-1],  # a view, still contiguous
    lambda v: np.repeat(np.array(v, dtype=np.int64), 2)[::2],  # strided
    lambda v: np.array(v, dtype=np.int64).reshape(1, -1),
]


@pytest.mark.parametrize("index_form", INDEX_FORMS)
@pytest.mark.parametrize("offset_form", INDEX_FORMS[:4])
@pytest.mark.parametrize("dst_dtype", [np.uint8, np.float32])
def test_gather_argument_forms_agree(store, index_form, offset_form, dst_dtype):
    recs = records(20, seed=7, max_len=64)
    store.append(*pack(recs))
    picks = [13, 2, 19, 2, 0]
    sizes = [len(recs[i]) for i in picks]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int).tolist()
    room = (sum(sizes) + 3) // 4 * 4
    dst = np.zeros(room // np.dtype(dst_dtype).itemsize, dtype=dst_dtype)
    store.gather(index_form(picks), dst, offset_form(offsets))
    got = dst.view(np.uint8)
    assert ([got[o : o + n].tobytes() for o, n in zip(offsets, sizes, strict=True)]
            == [recs[i] for i in picks])


def test_usual_arrays_take_the_direct_route(store):
    store.append(b"abcdef", [0, 3])
    dst = np.zeros(6, dtype=np.uint8)
    direct = store._native.try_gather
    assert direct(np.array([1, 0]), dst, np.array([0, 3]))
    assert dst.tobytes() == b"defabc"
    assert direct(np.array([0], dtype=np.uint64), dst, np.array([3], dtype=np.uint64))
    # Everything that needs converting or a precise error is declined untouched.
    dst[:] = 0
    for args in [([0], dst, [0]), (np.array([-1]), dst, np.array([0])),
                 (np.array([0]), dst, np.array([-1])),
                 (np.array([0], dtype=np.int32), dst, np.array([0])),
                 (np.array([0]), dst.view(np.int8), np.array([0])),
                 (np.array([0]), dst[::2], np.array([0]))]:
        assert not direct(*args)
    assert (dst == 0).all()


def test_gather_bad_arrays_are_refused_like_lists(store):
    store.append(b"abcdef", [0, 3])
    base = np.zeros(16, dtype=np.uint8)
    with pytest.raises(errors.ZrecordIndexError, match="-1 is negative"):
        store.gather(np.array([0, -1]), base, np.array([0, 4]))
    with pytest.raises(errors.ZrecordIndexError, match="out of range"):
        store.gather(np.array([0, 2], dtype=np.uint64), base, np.array([0, 4], dtype=np.uint64))
    with pytest.raises(errors.ZrecordValueError, match="must not be negative"):
        store.gather(np.array([0, 1]), base, np.array([0, -4]))
    with pytest.raises(errors.ZrecordValueError, match="C-contiguous"):
        store.gather(np.array([0]), base[::2], np.array([0]))
    ro = np.zeros(16, dtype=np.uint8)
    ro.flags.writeable = False
    with pytest.raises(errors.ZrecordValueError, match="read-only"):
        store.gather(np.array([0]), ro, np.array([0]))
    with pytest.raises(errors.ZrecordValueError, match="overlap"):
        store.gather(np.array([0, 1]), base, np.array([0, 2]))
    with pytest.raises(errors.ZrecordIndexError, match="integers"):
        store.gather(np.array([0.0]), base, np.array([0]))
    assert (base == 0).all(), "a refused gather writes nothing"
    store.close()
    with pytest.raises(errors.StoreClosedError):
        store.gather(np.array([0]), base, np.array([0]))


def test_append_errors(store):
    with pytest.raises(errors.LimitExceededError, match="1048576"):
        store.append(bytes(MAX_RECORD_BYTES + 1), [0])
    with pytest.raises(ValueError, match="non-decreasing"):
        store.append(b"abc", [2, 1])
    with pytest.raises(ValueError, match="unknown codec"):
        store.append(b"abc", [0], codec="lz4")
    with pytest.raises(errors.MissingDictionaryError):
        store.append(b"abc", [0], codec="zstd_dict")
    with pytest.raises(ValueError, match="C-contiguous"):
        store.append(np.zeros((4, 4), dtype=np.uint8)[:, ::2], [0])
    with pytest.raises(ValueError, match="bytes-like"):
        store.append(12345, [0])
    assert len(store) == 0


def test_unknown_codec_on_open(tmp_path):
    with pytest.raises(ValueError, match="unknown codec 'gzip'"):
        Zrecord(tmp_path / "s", codec="gzip")


def test_delete_compact_stats(store):
    recs = records(50, seed=3)
    store.append(*pack(recs))
    store.delete([49, 0, 0, 10])
    model = list(recs)
    for i in sorted({49, 0, 10}, reverse=True):
        model[i] = model[-1]
        model.pop()
    assert read(store, range(len(store))) == model
    before = store.stats()
    assert before["reclaimable"] > 0
    report = store.compact()
    assert report["moved"] > 0
    after = store.stats()
    assert after["chunk_bytes"] == before["chunk_bytes"] - before["reclaimable"]
    assert after["reclaimable"] == 0
    assert read(store, range(len(store))) == model


def test_dictionary_cannot_be_replaced(store):
    samples = b"".join(records(100, max_len=1000))
    sizes = [len(r) for r in records(100, max_len=1000)]
    store.train_dict(samples, sizes, 4096)
    with pytest.raises(ValueError, match="already has a dictionary"):
        store.train_dict(samples, sizes, 4096)
    with pytest.raises(ValueError, match="target"):
        Zrecord(store.path + "2").train_dict(samples, sizes, 0)


def test_corrupt_files_raise_corrupt_store_error(tmp_path):
    path = tmp_path / "s"
    with Zrecord(path, codec="zstd") as z:
        z.append(*pack(records(10, seed=1, max_len=3000)))
    meta = path / "meta.zr"
    with open(meta, "r+b") as f:
        f.write(b"XXXX")
    with pytest.raises(errors.CorruptStoreError, match="magic"):
        Zrecord(path)
    with open(meta, "r+b") as f:
        f.write(b"ZREC")
    os.truncate(path / "0.zr", 10)
    with Zrecord(path) as z, pytest.raises(errors.CorruptStoreError, match="0.zr"):
        read(z, range(10))
    os.truncate(meta, 100)
    with pytest.raises(errors.CorruptStoreError, match="meta.zr"):
        Zrecord(path)


def test_os_errors_keep_their_type(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(NotADirectoryError) as info:
        Zrecord(f)
    assert info.value.errno == errno.ENOTDIR
    assert info.value.filename == str(f)


def test_read_only_directory(tmp_path):
    path = tmp_path / "s"
    with Zrecord(path, codec="zstd") as z:
        z.append(b"abc" * 100, [0, 150])
    os.chmod(path / "meta.zr", 0o444)
    os.chmod(path / "0.zr", 0o444)
    try:
        if os.access(path / "meta.zr", os.W_OK):
            pytest.skip("running as a user that ignores file permissions")
        with Zrecord(path) as z:
            assert read(z, [0, 1]) == [b"abc" * 50, b"abc" * 50]
            with pytest.raises(PermissionError):
                z.append(b"more", [0])
    finally:
        os.chmod(path / "meta.zr", 0o644)
        os.chmod(path / "0.zr", 0o644)


def test_closed_handle(tmp_path):
    z = Zrecord(tmp_path / "s")
    z.append(b"abc", [0])
    z.close()
    z.close()
    assert z.closed and "closed" in repr(z)
    with pytest.raises(errors.StoreClosedError):
        len(z)
    with pytest.raises(errors.ZrecordError):
        z.append(b"abc", [0])
    with Zrecord(tmp_path / "s") as z2:
        assert len(z2) == 1, "close syncs"


def test_second_writer_is_refused(tmp_path):
    a = Zrecord(tmp_path / "s")
    b = Zrecord(tmp_path / "s")
    a.append(b"abc", [0])
    with pytest.raises(errors.StoreBusyError, match="writer lock"):
        b.append(b"def", [0])
    a.close()
    b.close()


def test_threads_gather_while_appending(tmp_path):
    recs = records(400, seed=9, max_len=4000)
    with Zrecord(tmp_path / "s") as z:
        z.append(*pack(recs[:100]))
        done = threading.Event()
        failures: list[str] = []
        died: list[BaseException] = []

        def reader(seed: int) -> None:
            try:
                rng = np.random.default_rng(seed)
                while not done.is_set():
                    n = len(z)
                    idx = rng.integers(0, n, size=32)
                    for i, got in zip(idx, read(z, idx), strict=True):
                        if got != recs[i]:
                            failures.append(f"record {i}")
            except BaseException as e:  # raised again in the test's thread
                died.append(e)

        threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for k in range(100, 400, 20):
            z.append(*pack(recs[k : k + 20]))
        done.set()
        for t in threads:
            t.join()
        if died:  # a reader that died of an exception fails the test with it
            raise AssertionError(f"{len(died)} reader thread(s) died") from died[0]
        assert failures == []
        assert read(z, range(400)) == recs


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_reads_and_parent_goes_on(tmp_path):
    """The pool is rebuilt in a forked child (its threads do not survive fork): no deadlock,
    correct data; the child may not write through the parent's handle; the parent still works."""
    recs = records(600, seed=4, max_len=6000)
    z = Zrecord(tmp_path / "s")
    z.append(*pack(recs))
    assert read(z, range(600)) == recs  # the parent's pool is up
    pid = os.fork()
    if pid == 0:  # child: report through the exit status only
        code = 0
        try:
            if read(z, range(600)) != recs:
                code = 2
            try:
                z.append(b"from the child", [0])
                code = 3
            except errors.StoreBusyError:
                pass
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    z.append(b"parent again", [0])
    assert read(z, [600]) == [b"parent again"]
    z.close()


def test_prefetch_is_a_hint(tmp_path):
    """prefetch asks for what is not cached and says so; indices past the end are ignored;
    reads are unchanged."""
    recs = records(50, seed=9, max_len=9000)
    with Zrecord(tmp_path / "s") as z:
        z.append(*pack(recs))
        z.sync()
        assert z.prefetch(range(50)) is False  # just written: in memory
        for name in os.listdir(tmp_path / "s"):
            fd = os.open(tmp_path / "s" / name, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        assert z.prefetch([0, 10, 20, 49]) is True
        assert z.prefetch([10**6]) is False
        assert read(z, range(50)) == recs


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_gather_parts_reads_windows_of_records(tmp_path, codec):
    """Windows of records equal slices of the whole records (NumPy as the reference), the same
    record asked for several times; windows past a record's end are refused, writing nothing."""
    rng = np.random.default_rng(5)
    recs = [rng.integers(0, 50, n, dtype=np.uint8).tobytes() for n in rng.integers(0, 4000, 40)]
    with Zrecord(tmp_path / "s", codec=codec) as z:
        z.append(*pack(recs))
        idxs = rng.integers(0, len(recs), 300)
        starts = np.array([rng.integers(0, len(recs[i]) + 1) for i in idxs])
        lens = np.array([rng.integers(0, len(recs[i]) - s + 1) for i, s in zip(idxs, starts,
                                                                                  strict=True)])
        offsets = np.concatenate([[0], np.cumsum(lens)[:-1]])
        dst = np.zeros(int(lens.sum()), np.uint8)
        z.gather_parts(idxs, starts, lens, dst, offsets)
        want = b"".join(recs[i][s:s + n] for i, s, n in zip(idxs, starts, lens, strict=True))
        assert dst.tobytes() == want
        before = dst.copy()
        with pytest.raises(errors.LoaderxValueError, match="holds"):
            z.gather_parts([0, 1], [0, len(recs[1])], [1, 1], dst, [0, 1])
        assert (dst == before).all()
