"""Packed sequences at their limits: memory sized by the documents, not by ``seq_len`` or the
batch (each risky case in a child process under a 2 GiB address-space limit, so a regression
fails with a MemoryError instead of taking the machine down), and end / padding tokens of any
integer dtype -- negative, big-endian -- written alike by the native gather and the NumPy
reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loaderx
from loaderx import RaggedDataset, from_iterator, pack
from loaderx.errors import LimitExceededError, LoaderxValueError

# These tests truncate on purpose; tests/test_mixture.py checks the warning itself.
pytestmark = pytest.mark.filterwarnings("ignore::loaderx.errors.TruncationWarning")

METHODS = ["concat", "first_fit"]
#: loaderx.packing.MAX_BATCH_TOKENS: a batch's int32 segment ids and positions.
MAX_BATCH_TOKENS = 2**31 - 1

# -- memory: bounded by the documents, a batch refused before it is allocated -------------------

_CHILD = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    import loaderx
    from loaderx.errors import LimitExceededError

    docs = loaderx.RaggedDataset(sys.argv[1])
    docs[0]  # the store's chunk mapped (its address space reserved) before the limit
    np.random.default_rng(0)
    with open("/proc/self/status") as f:
        used = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize"))
    limit = used + int(sys.argv[2])  # 2 GiB (by default) more than is mapped now
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def run(what, f):
        try:
            out = f()
        except LimitExceededError as e:
            out = {"limit": str(e)}
        except MemoryError as e:
            out = {"memory": str(e)}
        print(json.dumps([what, out]), flush=True)
""")


def _in_child(tmp_path, body: str, headroom: int = 2 << 30) -> dict[str, Any]:
    """Runs ``body`` after :data:`_CHILD` in a fresh interpreter whose RLIMIT_AS allows
    ``headroom`` bytes more than it has mapped (Linux: /proc/self/status); each
    ``run(what, f)`` gives ``{what: f()}`` (or ``{"limit": message}`` /
    ``{"memory": message}``)."""
    pytest.importorskip("resource")
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs /proc/self/status (Linux)")
    script = tmp_path / "child.py"
    script.write_text(_CHILD + textwrap.dedent(body))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "docs"), str(headroom)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(line) for line in proc.stdout.splitlines())


def _four_short_documents(tmp_path, dtype=np.uint16) -> None:
    from_iterator(tmp_path / "docs", [np.arange(1, n + 1, dtype=dtype) for n in (3, 5, 2, 9)],
                  codec="raw", progress=False)


def test_first_fit_plan_memory_is_bounded_by_the_documents_not_seq_len(tmp_path):
    """Finding 5: first_fit's plan was 8 bytes per unit of seq_len (a histogram of sizes
    0..seq_len, and a bit set as wide as a row): seq_len = 2**30 over 4 short documents asked
    for 8 GiB. Now it keeps a few bytes per document at any seq_len up to the limit."""
    _four_short_documents(tmp_path)
    got = _in_child(tmp_path, """
        for s in (2**30, 2**31 - 1):
            for eos in (None, 0):
                def plan(s=s, eos=eos):
                    v = loaderx.pack(docs, s, method="first_fit", eos_id=eos, seed=3)
                    return [len(v), v.plan_bytes, v.padding_tokens, v.truncated]
                run(f"{s} {eos}", plan)
    """)
    for s in (2**30, 2**31 - 1):
        for eos, used in ((None, 19), (0, 23)):
            rows, plan_bytes, padding, truncated = got[f"{s} {eos}"]
            assert (rows, padding, truncated) == (1, s - used, 0)
            assert plan_bytes < 1024


def test_a_batch_too_large_to_allocate_is_refused_before_trying(tmp_path):
    """Finding 5, the batch: a row of seq_len tokens (and its int32 segment ids and positions)
    is materialised per batch. A batch that cannot be held is refused, naming its size, before
    anything is allocated -- not a MemoryError, not an OOM kill. (concat over these documents
    has no row of 2**30 tokens; its batches are the next test's.)"""
    _four_short_documents(tmp_path)
    got = _in_child(tmp_path, """
        view = loaderx.pack(docs, 2**30, method="first_fit")
        idx = np.zeros(1, np.uint64)
        run("rows", lambda: len(view))
        run("getitem", lambda: view[0].shape)
        run("gather", lambda: view.gather(idx).shape)
        run("segments", lambda: view.segments(idx)[0].shape)
        dst = np.empty(0, np.uint8)  # never reached: refused before dst is looked at
        run("gather_rows", lambda: view.gather_rows(idx, dst))
        view._native = None  # the NumPy reference
        run("numpy gather_rows", lambda: view.gather_rows(idx, dst))
    """)
    assert got.pop("rows") == 1
    for what, out in got.items():
        assert "limit" in out, (what, out)
        assert "1 packed row of 1073741824 tokens" in out["limit"], out
        assert "needs 10.0 GiB" in out["limit"], out  # uint16 + 2 x int32 a token
        assert "more than this process can have" in out["limit"], out
        assert "smaller seq_len or batch" in out["limit"], out


def test_a_large_concat_batch_is_refused_before_trying(tmp_path):
    """The same for concat rows of a modest seq_len in a batch of many rows: the batch's size
    is the rows times seq_len, refused past the memory the process can have, and past
    MAX_BATCH_TOKENS (the int32 range of a batch's segment ids and positions) anywhere."""
    from_iterator(tmp_path / "docs", [np.arange(1, 50_001, dtype=np.uint32)] * 20,
                  codec="raw", progress=False)
    got = _in_child(tmp_path, """
        view = loaderx.pack(docs, 1000, eos_id=0)
        for n in (2**20, 2**22):
            idx = np.zeros(n, np.uint64)
            run(f"{n}", lambda idx=idx: view[idx].shape)
            run(f"{n} segments", lambda idx=idx: view.segments(idx)[0].shape)
        run("small", lambda: view[np.arange(64)].shape)
    """)
    assert got.pop("small") == [64, 1000]
    for what, out in got.items():
        assert "limit" in out, (what, out)
    assert "1048576 packed rows of 1000 tokens" in got["1048576"]["limit"]
    assert "11.7 GiB" in got["1048576"]["limit"]  # 12 bytes a token: uint32 + 2 x int32
    assert "more than this process can have" in got["1048576"]["limit"]
    assert "at most 2147483647 tokens" in got["4194304"]["limit"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_batch_past_the_limit_is_refused_before_it_is_filled(tmp_path, num_workers):
    """In a DataLoader the batch's token buffer comes from the loader's pool (allocated, not
    touched); the packed view refuses the batch before filling it or allocating its segment
    ids and positions, and the loader delivers the error."""
    _four_short_documents(tmp_path, np.uint8)
    got = _in_child(tmp_path, f"""
        view = loaderx.pack(docs, 2**30, method="first_fit")
        def first_batch():
            with loaderx.DataLoader({{"t": view}}, batch_size=2, mode="iid",
                                    num_workers={num_workers}) as loader:
                return list(next(loader))
        run("loader", first_batch)
    """, headroom=5 << 30)
    # Headroom: the pool's 2 GiB token buffer (never filled) plus room for the allocator's
    # arenas (on 3.13t mimalloc reserves 1 GiB at a time, and 2 worker threads may each
    # want one: with 3 GiB that ran out and was a MemoryError now and then); the segment
    # ids and positions of a filled batch would need 16 GiB more.
    assert "a batch holds at most 2147483647 tokens" in got["loader"]["limit"], got
    assert "2 packed rows of 1073741824 tokens" in got["loader"]["limit"], got


def test_seq_len_past_the_batch_limit_is_refused_at_pack(tmp_path):
    """No row of more than MAX_BATCH_TOKENS tokens can be read (a row is a batch of one), so
    such a seq_len is refused at pack(), naming the limit -- it used to plan for minutes and
    gigabytes (first_fit) or give rows no read could hold."""
    _four_short_documents(tmp_path)
    docs = RaggedDataset(tmp_path / "docs")
    for method in METHODS:
        with pytest.raises(LimitExceededError, match=r"seq_len=2147483648 is over .*2147483647"):
            pack(docs, 2**31, method=method)
        pack(docs, MAX_BATCH_TOKENS, method=method)  # the limit itself plans


def test_concat_refuses_a_document_whose_positions_pass_int32(tmp_path, monkeypatch):
    """A concat document continues over rows with its positions: one of more than 2**31 tokens
    (its end token counted) would wrap the int32 positions, so it is refused at pack()."""
    _four_short_documents(tmp_path)
    docs = RaggedDataset(tmp_path / "docs")
    import loaderx._views.packing as packing  # where _record_lengths is looked up

    monkeypatch.setattr(packing, "_record_lengths",
                        lambda layout, size: np.array([3, 2**31], np.uint32))
    pack(docs, 1024)  # the last position is 2**31 - 1
    pack(docs, 1024, method="first_fit", eos_id=0)  # truncated to the row: no long position
    with pytest.raises(LimitExceededError, match=r"document 1 holds 2147483649 tokens"):
        pack(docs, 1024, eos_id=0)


def test_the_kept_aranges_stay_few(tmp_path):
    """The concat segments kept an int32 arange for every batch size ever asked for, never
    dropped: reading batches of 1, 2, ... n rows kept O(n**2 * seq_len) memory."""
    from_iterator(tmp_path / "docs", [np.arange(1, 5001, dtype=np.uint16)], progress=False)
    view = pack(RaggedDataset(tmp_path / "docs"), 16)
    view._native = None
    for n in range(1, 40):
        view.segments(np.arange(n, dtype=np.uint64))
    assert len(view._aranges) <= 4
    seg, pos = view.segments(np.arange(5, dtype=np.uint64))
    assert (pos.reshape(-1) == np.arange(80)).all() and (seg == 1).all()


# -- end and padding tokens of any dtype: the native gather equals the NumPy reference ----------

_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           ">i2", ">i4", ">u2", ">u8"]


def _native_and_numpy(source: Any, seq_len: int, **kw: Any) -> tuple[Any, Any]:
    fast = pack(source, seq_len, **kw)
    slow = pack(source, seq_len, **kw)
    assert fast._native is not None
    slow._native = None
    return fast, slow


def _assert_same_rows(fast: Any, slow: Any, rows: np.ndarray) -> None:
    got = np.full(len(rows) * fast.record_bytes, 0xAB, np.uint8)
    want = np.full_like(got, 0xCD)
    fast.gather_rows(rows, got)
    slow.gather_rows(rows, want)
    assert got.tobytes() == want.tobytes()
    for a, b in zip(fast.segments(rows), slow.segments(rows), strict=True):
        assert (a == b).all()


def _write(path: Any, dtype: np.dtype, lengths: list[int], rng: np.random.Generator,
           pieces: bool) -> RaggedDataset:
    info = np.iinfo(dtype)
    docs = [rng.integers(max(info.min, -10**6), min(info.max, 10**6), n, endpoint=True)
            .astype(dtype) for n in lengths]
    from_iterator(path, docs, codec="raw", progress=False,
                  max_record_bytes=8 * dtype.itemsize if pieces else None)
    return RaggedDataset(path)


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("method", METHODS)
def test_signed_and_big_endian_tokens_native_equals_numpy(tmp_path, dtype, method):
    """Finding 9: a negative eos_id / pad_id (pad_id=-100, eos_id=-1) raised OverflowError on
    every native read (the binding takes the tokens as u64); and a big-endian store got the
    end and padding tokens byte-swapped. Both paths now write the token's own bytes."""
    dt = np.dtype(dtype)
    info = np.iinfo(dt)
    source = _write(tmp_path / "d", dt, [5, 0, 17, 1, 30, 3, 9, 2, 12, 4, 6],
                    np.random.default_rng(1), pieces=False)
    signed = dt.kind == "i"
    cases = ([(-1, -100), (info.min, info.max), (info.max, info.min)] if signed
             else [(info.max, info.max - 1), (1, info.max - 1), (0, info.max)])
    for eos, pad in cases:
        fast, slow = _native_and_numpy(source, 8, method=method, eos_id=eos, pad_id=pad, seed=2)
        _assert_same_rows(fast, slow, np.arange(len(fast), dtype=np.uint64))
        tokens = fast[:]
        assert tokens.dtype == dt
        assert (tokens == eos).sum() >= 8  # every document's end token, as a value of dt
        if method == "first_fit":
            assert fast.padding_tokens > 0
            seg, _ = fast.segments(np.arange(len(fast)))
            assert (tokens[seg == 0] == pad).all()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_DTYPES), st.sampled_from(METHODS), st.booleans(), st.data())
def test_any_token_ids_native_equals_numpy(dtype, method, pieces, data):
    dt = np.dtype(dtype)
    info = np.iinfo(dt)
    token = st.integers(int(info.min), int(info.max))
    eos = data.draw(st.none() | token)
    pad = data.draw(token)
    lengths = data.draw(st.lists(st.integers(0, 40), min_size=1, max_size=25))
    seq_len = data.draw(st.integers(1, 24))
    with tempfile.TemporaryDirectory() as tmp:
        source = _write(os.path.join(tmp, "d"), dt, lengths, np.random.default_rng(0), pieces)
        fast, slow = _native_and_numpy(source, seq_len, method=method, eos_id=eos, pad_id=pad,
                                       seed=data.draw(st.integers(0, 99)))
        if len(fast):
            rows = np.array(data.draw(st.lists(st.integers(0, len(fast) - 1), min_size=1,
                                               max_size=12)), np.uint64)
            _assert_same_rows(fast, slow, rows)
        source.close()


@pytest.mark.parametrize("dtype,bad", [("uint8", 300), ("uint8", -1), ("uint64", -1),
                                       ("int8", 128), ("int8", -129), ("int16", -100_000),
                                       ("uint64", 2**64), ("int64", -(2**63) - 1)])
@pytest.mark.parametrize("what", ["eos_id", "pad_id"])
def test_token_ids_that_do_not_fit_the_dtype_are_refused_at_pack(tmp_path, dtype, bad, what):
    dt = np.dtype(dtype)
    from_iterator(tmp_path / "d", [np.arange(4, dtype=dt)], progress=False)
    info = np.iinfo(dt)
    with pytest.raises(LoaderxValueError, match=rf"{what}={bad} does not fit the documents' "
                       rf"dtype {dt} \(\[{info.min}, {info.max}\]\)"):
        pack(RaggedDataset(tmp_path / "d"), 4, **{what: bad})


def test_a_pickled_view_keeps_its_negative_tokens(tmp_path):
    import pickle

    source = _write(tmp_path / "d", np.dtype(np.int16), [3, 7, 2, 11], np.random.default_rng(0),
                    pieces=True)
    view = pack(source, 6, method="first_fit", eos_id=-1, pad_id=-100)
    back = pickle.loads(pickle.dumps(view))
    assert (back.eos_id, back.pad_id) == (-1, -100)
    assert np.array_equal(back[:], view[:])
    assert loaderx.PackedDataset is type(back)
