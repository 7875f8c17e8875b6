"""Packed sequences (loaderx.pack): the row plans, the dense view, its companion arrays in the
loader, the token-corpus layout of the converter, and bad input."""

from __future__ import annotations

import bisect
import json
import os
import pickle
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import loaderx
from loaderx import ConcatDataset, DataLoader, RaggedDataset, from_iterator, from_numpy, pack
from loaderx._views.pack_plan import ConcatPlan, FirstFitPlan
from loaderx.dataset import DenseDataset
from loaderx.errors import (
    DatasetError,
    LimitExceededError,
    LoaderxIndexError,
    LoaderxTypeError,
    LoaderxValueError,
    TokenArrayWarning,
)

# These tests truncate on purpose; tests/test_mixture.py checks the warning itself.
pytestmark = pytest.mark.filterwarnings("ignore::loaderx.errors.TruncationWarning")

# Tokens that say where they come from: document d, position p is d * _STRIDE + p + 1.
_STRIDE = 100_000
EOS = np.iinfo(np.uint32).max
PAD = EOS - 1


def _doc(d: int, n: int, dtype: type = np.uint32) -> np.ndarray:
    return (d * _STRIDE + np.arange(n) + 1).astype(dtype)


def _corpus(tmp_path, lengths, name="docs", dtype=np.uint32, **kw) -> RaggedDataset:
    path = tmp_path / name
    from_iterator(path, [_doc(d, int(n), dtype) for d, n in enumerate(lengths)],
                  progress=False, **kw)
    return RaggedDataset(path)


def _decode(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = tokens.astype(np.int64) - 1
    return t // _STRIDE, t % _STRIDE


def _all_rows(view) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    idx = np.arange(len(view), dtype=np.uint64)
    seg, pos = view.segments(idx)
    return view[idx], seg, pos


LENGTHS = [5, 0, 17, 1, 64, 3, 0, 40, 9, 2, 33, 8]


# -- concat -------------------------------------------------------------------------------------


@pytest.mark.parametrize("eos", [None, EOS])
@pytest.mark.parametrize("seq_len", [1, 7, 16, 64])
def test_concat_every_token_exactly_once_but_the_tail(tmp_path, eos, seq_len):
    view = pack(_corpus(tmp_path, LENGTHS), seq_len, eos_id=eos, seed=3)
    tokens, _, _ = _all_rows(view)
    flat = tokens.reshape(-1)
    text = flat[flat != EOS] if eos is not None else flat
    seen = list(zip(*map(np.ndarray.tolist, _decode(text)), strict=True))
    assert len(seen) == len(set(seen))  # no (document, position) twice
    corpus = {(d, p) for d, n in enumerate(LENGTHS) for p in range(n)}
    assert set(seen) <= corpus
    total = sum(LENGTHS) + (len(LENGTHS) if eos is not None else 0)
    assert len(view) == total // seq_len and view.dropped_tokens == total % seq_len
    missing = corpus - set(seen)
    eos_missing = (len(LENGTHS) - int((flat == EOS).sum())) if eos is not None else 0
    assert len(missing) + eos_missing == view.dropped_tokens
    # What is missing is the end of the stream: a suffix of each document it touches.
    for d in {d for d, _ in missing}:
        lost = sorted(p for dd, p in missing if dd == d)
        assert lost == list(range(LENGTHS[d] - len(lost), LENGTHS[d]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=40), st.integers(1, 50), st.integers(0, 2**32),
       st.booleans())
def test_concat_plan_covers_the_stream(lengths, seq_len, seed, eos):
    plan = ConcatPlan(np.array(lengths, dtype=np.uint32), seq_len, seed, eos)
    parts = plan.parts(np.arange(plan.rows, dtype=np.uint64))
    # Every row is full, its parts back to back.
    assert (np.bincount(parts.row, weights=parts.length, minlength=plan.rows) == seq_len).all()
    assert (parts.length > 0).all()
    # The parts, in row order, are the documents in the plan's order, each whole but the last.
    pieces = {}
    for d, p, n, c in zip(parts.doc, parts.doc_pos, parts.length, parts.content, strict=True):
        pieces.setdefault(int(d), []).append((int(p), int(n), int(c)))
    for d, got in pieces.items():
        at = 0
        for p, n, c in got:
            assert p == at
            assert c == min(n, max(lengths[d] - p, 0))
            at += n
        assert at <= lengths[d] + eos
    assert plan.rows * seq_len + plan.dropped_tokens == sum(lengths) + eos * len(lengths)


def test_concat_segment_ids_and_positions_agree_with_the_documents(tmp_path):
    view = pack(_corpus(tmp_path, LENGTHS), 16, eos_id=EOS, seed=1)
    tokens, seg, pos = _all_rows(view)
    assert seg.dtype == np.int32 and pos.dtype == np.int32
    for row, sids, poss in zip(tokens, seg, pos, strict=True):
        assert sids[0] == 1 and (np.diff(sids) >= 0).all() and (np.diff(sids) <= 1).all()
        for s in np.unique(sids):
            part = row[sids == s]
            at = poss[sids == s]
            assert (np.diff(at) == 1).all()  # consecutive positions of one document
            text = part[part != EOS]
            docs, p = _decode(text)
            assert len(set(docs.tolist())) <= 1
            assert (p == at[:len(text)]).all()
            if len(text) < len(part):  # the end token: last of the part, at the doc's end
                assert part[-1] == EOS and len(part) - len(text) == 1
                d = int(docs[0]) if len(text) else None
                if d is not None:
                    assert at[-1] == LENGTHS[d]


def test_concat_positions_continue_into_the_next_row(tmp_path):
    view = pack(_corpus(tmp_path, [50]), 16)
    tokens, seg, pos = _all_rows(view)
    assert pos.reshape(-1).tolist() == list(range(48))
    assert (seg == 1).all() and view.dropped_tokens == 2


def test_concat_eos_after_every_document(tmp_path):
    view = pack(_corpus(tmp_path, LENGTHS), 4, eos_id=EOS, seed=5)
    flat = view[np.arange(len(view))].reshape(-1)
    order = view._plan.order
    expect = np.concatenate([np.append(_doc(int(d), LENGTHS[d]), EOS) for d in order])
    assert (flat == expect[:len(flat)]).all()


def test_concat_seed_changes_the_order_only(tmp_path):
    docs = _corpus(tmp_path, LENGTHS)
    a, b = pack(docs, 8, seed=1), pack(docs, 8, seed=2)
    assert len(a) == len(b) and a.dropped_tokens == b.dropped_tokens
    assert not np.array_equal(a[:], b[:])
    assert np.array_equal(pack(docs, 8, seed=1)[:], a[:])  # the same seed, the same rows


# -- first fit ----------------------------------------------------------------------------------


FF_LENGTHS = [5, 0, 17, 1, 64, 3, 0, 40, 9, 2, 33, 8, 70, 16, 15, 1, 1, 30]


@pytest.mark.parametrize("eos", [None, EOS])
def test_first_fit_never_splits_a_document(tmp_path, eos):
    view = pack(_corpus(tmp_path, FF_LENGTHS), 16, method="first_fit", eos_id=eos, pad_id=PAD)
    tokens, seg, pos = _all_rows(view)
    found: dict[int, int] = {}
    for row, sids in zip(tokens, seg, strict=True):
        for s in np.unique(sids[sids > 0]):
            part = row[sids == s]
            text = part[(part != EOS) & (part != PAD)]
            if not len(text):
                continue
            docs, p = _decode(text)
            d = int(docs[0])
            assert (docs == d).all() and p.tolist() == list(range(len(text)))  # from its start
            assert d not in found  # in one row only
            found[d] = len(text)
    room = 16 - (eos is not None)
    for d, n in enumerate(FF_LENGTHS):
        if n:
            assert found[d] == min(n, room)  # whole, or truncated to the row


def test_first_fit_rows_hold_at_most_seq_len_and_padding_is_segment_zero(tmp_path):
    view = pack(_corpus(tmp_path, FF_LENGTHS), 16, method="first_fit", eos_id=EOS, pad_id=PAD)
    tokens, seg, pos = _all_rows(view)
    assert tokens.shape == (len(view), 16)
    assert ((tokens == PAD) == (seg == 0)).all()
    assert (pos[seg == 0] == 0).all()
    # Padding only at the end of a row; documents back to back before it.
    for sids in seg:
        used = int((sids > 0).sum())
        assert (sids[:used] > 0).all() and (sids[used:] == 0).all()
    assert int((seg == 0).sum()) == view.padding_tokens
    ends = (tokens == EOS).sum()
    assert ends == sum(1 for _ in FF_LENGTHS)  # every document (even empty) ends in eos


def test_first_fit_truncation_counted(tmp_path):
    docs = _corpus(tmp_path, FF_LENGTHS)
    view = pack(docs, 16, method="first_fit")
    assert view.truncated == sum(n > 16 for n in FF_LENGTHS)
    with_eos = pack(docs, 16, method="first_fit", eos_id=EOS)
    assert with_eos.truncated == sum(n + 1 > 16 for n in FF_LENGTHS)
    with pytest.raises(LoaderxValueError, match=r"6 of 18 documents are longer than "
                       r"seq_len=16 \(the longest: 70 tokens\)"):
        pack(docs, 16, method="first_fit", truncate=False)
    assert pack(docs, 70, method="first_fit", truncate=False).truncated == 0


def _best_fit_decreasing_rows(sizes: list[int], cap: int) -> list[int]:
    """The room left in each row after best-fit decreasing, item by item (the reference)."""
    rooms: list[int] = []
    for s in sorted((x for x in sizes if x > 0), reverse=True):
        i = bisect.bisect_left(rooms, s)
        if i == len(rooms):
            bisect.insort(rooms, cap - s)
        else:
            bisect.insort(rooms, rooms.pop(i) - s)
    return rooms


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 80), max_size=120), st.integers(1, 40), st.integers(0, 2**32),
       st.booleans())
def test_first_fit_plan_is_best_fit_decreasing(lengths, seq_len, seed, eos):
    plan = FirstFitPlan(np.array(lengths, dtype=np.uint32), seq_len, seed, eos)
    sizes = [min(n + eos, seq_len) for n in lengths]
    rooms, placed = [], []
    for j in range(plan.rows):
        docs = plan.row_docs[plan.row_ptr[j]:plan.row_ptr[j + 1]].tolist()
        assert docs
        used = sum(sizes[d] for d in docs)
        assert used <= seq_len
        rooms.append(seq_len - used)
        placed += docs
    assert sorted(placed) == [d for d, s in enumerate(sizes) if s]  # each document once
    assert sorted(rooms) == _best_fit_decreasing_rows(sizes, seq_len)
    assert plan.truncated == sum(n + eos > seq_len for n in lengths)
    assert plan.padding_tokens == sum(rooms)


# -- both methods in the loader -----------------------------------------------------------------


def _batches(view, steps, **kw):
    with DataLoader({"tok": view}, batch_size=kw.pop("batch_size", 8), seed=7, **kw) as loader:
        return [next(loader) for _ in range(steps)]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), k


METHODS = ["concat", "first_fit"]


@pytest.mark.parametrize("method", METHODS)
def test_batch_has_tokens_segment_ids_and_positions(tmp_path, method):
    view = pack(_corpus(tmp_path, FF_LENGTHS), 16, method=method, eos_id=EOS, pad_id=PAD)
    (batch,) = _batches(view, 1, num_workers=0)
    assert sorted(batch) == ["tok", "tok_positions", "tok_segment_ids"]
    assert batch["tok"].shape == batch["tok_segment_ids"].shape == (8, 16)
    assert batch["tok"].dtype == np.uint32 and batch["tok_positions"].dtype == np.int32
    rows = loaderx.Sampler(len(view), 8, "cyclic", 7).batch(0)
    seg, pos = view.segments(rows)
    assert np.array_equal(batch["tok"], view[rows])
    assert np.array_equal(batch["tok_segment_ids"], seg)
    assert np.array_equal(batch["tok_positions"], pos)


@pytest.mark.parametrize("method", METHODS)
def test_identical_batches_for_0_1_4_workers(tmp_path, method):
    view = pack(_corpus(tmp_path, FF_LENGTHS * 5), 16, method=method, eos_id=EOS, pad_id=PAD)
    runs = [_batches(view, 25, num_workers=w) for w in (0, 1, 4)]
    _same(runs[0], runs[1])
    _same(runs[0], runs[2])


_RESUME_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    from loaderx import DataLoader, RaggedDataset, pack
    path, method, state, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    view = pack(RaggedDataset(path), 16, method=method, eos_id={eos}, pad_id={pad}, seed=11)
    with DataLoader({{"tok": view}}, batch_size=8, seed=7, num_workers=2) as loader:
        loader.load_state_dict(state)
        batches = [next(loader) for _ in range(4)]
    np.savez(out, **{{f"{{i}}-{{k}}": v for i, b in enumerate(batches) for k, v in b.items()}})
""").format(eos=int(EOS), pad=int(PAD))


@pytest.mark.parametrize("method", METHODS)
def test_state_dict_at_any_step_resumes_in_a_new_process(tmp_path, method):
    docs = _corpus(tmp_path, FF_LENGTHS * 4)
    view = pack(docs, 16, method=method, eos_id=EOS, pad_id=PAD, seed=11)
    script = tmp_path / "child.py"
    script.write_text(_RESUME_CHILD)
    with DataLoader({"tok": view}, batch_size=8, seed=7, num_workers=2) as loader:
        for step in (0, 3, 10):
            while loader.step < step:
                next(loader)
            state = loader.state_dict()
            expect = [next(loader) for _ in range(4)]
            loader.load_state_dict(state)  # back, for the next step's state
            out = tmp_path / f"resumed-{step}.npz"
            subprocess.run([sys.executable, str(script), docs.path, method, json.dumps(state),
                            str(out)], check=True, timeout=120)
            with np.load(out) as got:
                for i, batch in enumerate(expect):
                    for k, v in batch.items():
                        assert got[f"{i}-{k}"].tobytes() == v.tobytes(), (step, i, k)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("count", [2, 4])
def test_shard_slices_concatenate_to_the_global_batch(tmp_path, method, count):
    view = pack(_corpus(tmp_path, FF_LENGTHS * 3), 16, method=method, eos_id=EOS, pad_id=PAD)
    whole = _batches(view, 6, num_workers=2)
    shards = [_batches(view, 6, num_workers=2, shard_index=i, shard_count=count)
              for i in range(count)]
    for step, batch in enumerate(whole):
        for k, v in batch.items():
            assert np.array_equal(np.concatenate([s[step][k] for s in shards]), v)


@pytest.mark.parametrize("method", METHODS)
def test_finite_pass_reads_every_row_once(tmp_path, method):
    view = pack(_corpus(tmp_path, FF_LENGTHS), 16, method=method, eos_id=EOS, pad_id=PAD)
    with DataLoader({"tok": view}, batch_size=5, num_workers=2) as loader:
        got = list(loader.epoch())
    tokens, seg, pos = _all_rows(view)
    assert np.array_equal(np.concatenate([b["tok"] for b in got]), tokens)
    assert np.array_equal(np.concatenate([b["tok_segment_ids"] for b in got]), seg)
    assert np.array_equal(np.concatenate([b["tok_positions"] for b in got]), pos)


@pytest.mark.parametrize("method", METHODS)
def test_subset_and_split_keep_segment_ids_and_positions(tmp_path, method):
    view = pack(_corpus(tmp_path, FF_LENGTHS * 2), 16, method=method, eos_id=EOS)
    train, val = loaderx.split(view, [0.8, 0.2], seed=0)
    for part in (train, val, view.subset([3, 1, 2])):
        (batch,) = _batches(part, 1, batch_size=2, num_workers=1)
        assert sorted(batch) == ["tok", "tok_positions", "tok_segment_ids"]
        with DataLoader({"tok": part}, batch_size=len(part), num_workers=0) as loader:
            (every,) = list(loader.epoch())
        rows = part.indices
        seg, pos = view.segments(rows)
        assert np.array_equal(every["tok"], view[rows])
        assert np.array_equal(every["tok_segment_ids"], seg)
        assert np.array_equal(every["tok_positions"], pos)


def test_a_checkpoint_of_one_packing_is_refused_on_another(tmp_path):
    docs = _corpus(tmp_path, FF_LENGTHS * 3)
    a = pack(docs, 16, seed=1)
    with DataLoader({"tok": a}, batch_size=4, num_workers=0) as loader:
        next(loader)
        state = loader.state_dict()
    assert a.view_digest == pack(docs, 16, seed=1).view_digest
    others = [pack(docs, 16, seed=2), pack(docs, 16, method="first_fit", seed=1),
              pack(docs.subset(np.arange(len(docs))), 16, seed=1)]
    for other in others:
        if len(other) != len(a):  # then the length alone tells them apart
            other = other.subset(np.arange(len(a)) % len(other))
        with DataLoader({"tok": other}, batch_size=4, num_workers=0) as loader:
            with pytest.raises(LoaderxValueError):
                loader.load_state_dict(state)


@pytest.mark.parametrize("method", METHODS)
def test_pickles_by_its_inputs(tmp_path, method):
    view = pack(_corpus(tmp_path, FF_LENGTHS), 16, method=method, eos_id=EOS, seed=4)
    back = pickle.loads(pickle.dumps(view))
    assert isinstance(back, loaderx.PackedDataset) and len(back) == len(view)
    assert np.array_equal(back[:], view[:])
    idx = np.arange(len(view), dtype=np.uint64)
    for x, y in zip(back.segments(idx), view.segments(idx), strict=True):
        assert np.array_equal(x, y)
    assert back.view_digest == view.view_digest


# -- corpora at the edges -----------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_empty_documents(tmp_path, method):
    view = pack(_corpus(tmp_path, [0, 0, 3, 0, 0, 2, 0]), 5, method=method)
    tokens, seg, pos = _all_rows(view)
    text = tokens[seg > 0]
    assert sorted(text.tolist()) == sorted(_doc(2, 3).tolist() + _doc(5, 2).tolist())
    assert view.documents == 7
    only_empty = pack(_corpus(tmp_path, [0, 0], name="empty"), 4, method=method)
    assert len(only_empty) == 0
    ends = pack(_corpus(tmp_path, [0, 0, 0, 0], name="ends"), 2, method=method, eos_id=EOS)
    assert len(ends) == 2 and (ends[:] == EOS).all()  # an empty document is its end token


def test_a_corpus_shorter_than_one_row(tmp_path):
    docs = _corpus(tmp_path, [3, 4])
    concat = pack(docs, 64)
    assert len(concat) == 0 and concat.dropped_tokens == 7
    with pytest.raises(LoaderxValueError, match="empty"):
        DataLoader({"tok": concat}, batch_size=1)
    ff = pack(docs, 64, method="first_fit", pad_id=PAD)
    assert len(ff) == 1 and ff.padding_tokens == 57
    (batch,) = _batches(ff, 1, batch_size=1, num_workers=0)
    assert (batch["tok_segment_ids"][0, :7] > 0).all()


@pytest.mark.parametrize("layout", [{}, {"max_record_bytes": 4096}])
@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_one_huge_document(tmp_path, layout, codec):
    n = 100_000
    docs = _corpus(tmp_path, [n], codec=codec, **layout)
    view = pack(docs, 1000)
    assert len(view) == 100 and view.dropped_tokens == 0
    tokens, seg, pos = _all_rows(view)
    assert np.array_equal(tokens.reshape(-1), _doc(0, n))
    assert pos.reshape(-1).tolist() == list(range(n)) and (seg == 1).all()
    ff = pack(docs, 1000, method="first_fit")
    assert len(ff) == 1 and ff.truncated == 1
    assert np.array_equal(ff[0], _doc(0, 1000))


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("method", METHODS)
def test_token_dtypes(tmp_path, dtype, method):
    rng = np.random.default_rng(0)
    top = min(int(np.iinfo(dtype).max), 50_000)
    docs = [rng.integers(0, top, int(n)).astype(dtype) for n in FF_LENGTHS]
    from_iterator(tmp_path / "d", docs, progress=False)
    eos = int(np.iinfo(dtype).max)
    view = pack(RaggedDataset(tmp_path / "d"), 16, method=method, eos_id=eos, pad_id=top)
    assert view.dtype == np.dtype(dtype)
    (batch,) = _batches(view, 1, num_workers=0)
    assert batch["tok"].dtype == np.dtype(dtype)
    # The rows hold the documents' tokens, read back from the segment ids and positions.
    tokens, seg, pos = _all_rows(view)
    if method == "concat":
        stream = np.concatenate([np.append(docs[int(d)], dtype(eos)) for d in view._plan.order])
        assert np.array_equal(tokens.reshape(-1), stream[:tokens.size])
    else:
        assert (tokens[seg == 0] == top).all()


def test_pieces_read_as_the_same_documents(tmp_path):
    lengths = [5, 0, 17, 1, 64, 3, 0, 40, 9, 2, 33, 8, 12, 24]
    whole = _corpus(tmp_path, lengths, name="whole")
    pieces = _corpus(tmp_path, lengths, name="pieces", max_record_bytes=48)  # 12 tokens
    assert pieces.schema["piece_rows"] == 12 and len(pieces) > len(whole)
    for method in METHODS:
        a = pack(whole, 16, method=method, eos_id=EOS, seed=9)
        b = pack(pieces, 16, method=method, eos_id=EOS, seed=9)
        assert b.documents == len(lengths)
        assert np.array_equal(a[:], b[:])
        idx = np.arange(len(a), dtype=np.uint64)
        for x, y in zip(a.segments(idx), b.segments(idx), strict=True):
            assert np.array_equal(x, y)


def test_pieces_survive_an_append(tmp_path):
    path = tmp_path / "p"
    from_iterator(path, [_doc(0, 30)], max_record_bytes=40, progress=False)  # 10 tokens
    from_iterator(path, [_doc(1, 25), _doc(2, 10)], append=True, progress=False)
    ds = RaggedDataset(path)
    assert ds.schema["piece_rows"] == 10
    view = pack(ds, 5)
    assert view.documents == 3
    tokens, seg, pos = _all_rows(view)
    lengths = [30, 25, 10]
    stream = np.concatenate([_doc(int(d), lengths[d]) for d in view._plan.order])
    assert np.array_equal(tokens.reshape(-1), stream)
    with pytest.raises(DatasetError, match="pieces of 10 rows"):
        from_iterator(path, [_doc(3, 4)], append=True, max_record_bytes=80, progress=False)


def test_appending_in_pieces_to_whole_records_is_refused_when_ambiguous(tmp_path):
    path = tmp_path / "w"
    from_iterator(path, [_doc(0, 30)], progress=False)
    with pytest.raises(DatasetError, match="whole records of 10 rows or more"):
        from_iterator(path, [_doc(1, 3)], append=True, max_record_bytes=40, progress=False)
    from_iterator(path, [_doc(1, 3)], append=True, max_record_bytes=124, progress=False)
    assert RaggedDataset(path).schema["piece_rows"] == 31


def test_a_subset_that_cuts_a_document_is_refused(tmp_path):
    pieces = _corpus(tmp_path, [30, 5, 25], max_record_bytes=40)  # 10 tokens a piece
    # Records: doc 0 = 0, 1, 2, 3 (30 = 10 + 10 + 10 + empty); doc 1 = 4; doc 2 = 5, 6, 7.
    assert len(pieces) == 8
    whole = pack(pieces.subset([4, 5, 6, 7]), 5)
    assert whole.documents == 2
    with pytest.raises(DatasetError, match="next piece is not the next record"):
        pack(pieces.subset([0, 2, 3]), 5)
    with pytest.raises(DatasetError, match="earlier pieces"):
        pack(pieces.subset([1, 2, 3]), 5)
    with pytest.raises(DatasetError, match="goes on past the end"):
        pack(pieces.subset([4, 5]), 5)


def test_concat_dataset_of_parts_packs_like_one_store(tmp_path):
    one = _corpus(tmp_path, FF_LENGTHS, name="one")
    a = _corpus(tmp_path, FF_LENGTHS[:7], name="a")
    from_iterator(tmp_path / "b", [_doc(d + 7, n) for d, n in enumerate(FF_LENGTHS[7:])],
                  progress=False)
    both = ConcatDataset([a, RaggedDataset(tmp_path / "b")])
    for method in METHODS:
        x, y = pack(one, 16, method=method, seed=2), pack(both, 16, method=method, seed=2)
        assert np.array_equal(x[:], y[:])
        (batch,) = _batches(y, 1, num_workers=2)
        assert batch["tok"].shape == (8, 16)


def test_reading_parts_without_the_engines_gather_parts(tmp_path, monkeypatch):
    docs = _corpus(tmp_path, FF_LENGTHS * 2, codec="zstd", max_record_bytes=64)
    for method in METHODS:
        native = pack(docs, 16, method=method, eos_id=EOS, pad_id=PAD)
        fallback = pack(docs, 16, method=method, eos_id=EOS, pad_id=PAD)
        assert native._gather_parts == hasattr(loaderx._native.Zrecord, "gather_parts")
        fallback._gather_parts = False
        assert np.array_equal(native[:], fallback[:])


def test_rows_out_of_range(tmp_path):
    view = pack(_corpus(tmp_path, FF_LENGTHS), 16)
    with pytest.raises(LoaderxIndexError):
        view[len(view)]
    dst = np.zeros(view.record_bytes, dtype=np.uint8)
    with pytest.raises(LoaderxIndexError, match="out of range"):
        view.gather_rows(np.array([len(view)], dtype=np.uint64), dst)
    assert not dst.any()


# -- bad input ----------------------------------------------------------------------------------


def test_a_dense_source_is_refused(tmp_path):
    from_numpy(tmp_path / "x", np.zeros((4, 3), dtype=np.uint16), progress=False)
    with pytest.raises(LoaderxTypeError, match="dense.*from_iterator"):
        pack(DenseDataset(tmp_path / "x"), 4)


def test_a_2d_ragged_source_is_refused(tmp_path):
    from_iterator(tmp_path / "x", [np.zeros((3, 2), np.int32), np.zeros((1, 2), np.int32)],
                  progress=False)
    with pytest.raises(LoaderxValueError, match=r"1-D token records.*\(n, 2\)"):
        pack(RaggedDataset(tmp_path / "x"), 4)


@pytest.mark.parametrize("source", [[np.arange(3)], np.arange(10), "docs"])
def test_not_a_dataset_is_refused(source):
    with pytest.raises(LoaderxTypeError, match="RaggedDataset|open it first"):
        pack(source, 4)


def test_float_tokens_are_refused(tmp_path):
    from_iterator(tmp_path / "f", [np.zeros(3, np.float32)], progress=False)
    with pytest.raises(LoaderxTypeError, match="integer tokens"):
        pack(RaggedDataset(tmp_path / "f"), 4)


@pytest.mark.parametrize("seq_len", [0, -1, 2.5, True, "8", None])
def test_bad_seq_len(tmp_path, seq_len):
    with pytest.raises(LoaderxValueError, match="seq_len must be a positive int"):
        pack(_corpus(tmp_path, [3]), seq_len)


@pytest.mark.parametrize("dtype,bad", [(np.uint16, 65536), (np.uint16, -1), (np.int32, 2**31),
                                       (np.uint8, 256)])
@pytest.mark.parametrize("what", ["eos_id", "pad_id"])
def test_token_ids_outside_the_dtype(tmp_path, dtype, bad, what):
    docs = _corpus(tmp_path, [3, 4], dtype=dtype)
    with pytest.raises(LoaderxValueError, match=rf"{what}={bad} does not fit .* {np.dtype(dtype)}"):
        pack(docs, 4, **{what: bad})


@pytest.mark.parametrize("kw", [{"method": "best"}, {"truncate": "yes"}, {"eos_id": 1.5},
                                {"pad_id": None}, {"seed": "x"}])
def test_other_bad_arguments(tmp_path, kw):
    with pytest.raises(LoaderxValueError):
        pack(_corpus(tmp_path, [3, 4]), 4, **kw)


def test_max_record_bytes_checked(tmp_path):
    doc = [_doc(0, 5)]
    with pytest.raises(LoaderxValueError, match="no whole 4-byte row"):
        from_iterator(tmp_path / "a", doc, max_record_bytes=3, progress=False)
    with pytest.raises(LimitExceededError, match="over the"):
        from_iterator(tmp_path / "b", doc, max_record_bytes=2 << 20, progress=False)
    with pytest.raises(DatasetError, match="written by max_record_bytes="):
        from_iterator(tmp_path / "c", doc, schema={"piece_rows": 3}, progress=False)


def test_documents_past_the_record_limit_fit_in_pieces(tmp_path):
    big = np.arange(300_000, dtype=np.uint32)  # 1.2 MB, over the 1 MiB record limit
    with pytest.raises(LimitExceededError, match="max_record_bytes="):
        from_iterator(tmp_path / "a", [big], progress=False)
    from_iterator(tmp_path / "b", [big], max_record_bytes=1 << 16, progress=False)
    view = pack(RaggedDataset(tmp_path / "b"), 1000)
    assert np.array_equal(view[:].reshape(-1), big)


# -- the 1-D token array pitfall ----------------------------------------------------------------


def test_from_numpy_warns_on_a_long_token_array(tmp_path):
    with pytest.warns(TokenArrayWarning, match="from_iterator.*loaderx.pack"):
        from_numpy(tmp_path / "t", np.zeros(1 << 22, dtype=np.uint16), codec="raw",
                   progress=False)


def test_from_numpy_stays_quiet_for_labels(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_numpy(tmp_path / "labels", np.zeros(1 << 22, dtype=np.int64), codec="raw",
                   progress=False)
        from_numpy(tmp_path / "short", np.zeros(1000, dtype=np.uint16), progress=False)


def test_from_numpy_refuses_a_token_array_past_the_record_cap(tmp_path):
    tokens = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint16), ((1 << 24) + 1,), (0,))
    with pytest.raises(LimitExceededError, match="one record per element.*from_iterator"):
        from_numpy(tmp_path / "t", tokens, progress=False)
    assert not os.path.exists(tmp_path / "t")


def test_prefetch_names_the_records_of_the_rows(tmp_path, monkeypatch):
    docs = _corpus(tmp_path, FF_LENGTHS, max_record_bytes=64)
    view = pack(docs, 16, eos_id=EOS)
    asked = []
    monkeypatch.setattr(docs, "prefetch", lambda idxs: asked.append(np.asarray(idxs)) or True)
    assert view.prefetch([0, 1, len(view) + 5]) is True  # past the end: ignored, as a hint
    parts = view._plan.parts(np.array([0, 1], dtype=np.uint64))
    records = view._record_parts(parts, parts.flat)[0]
    assert sorted(asked[0].tolist()) == sorted(set(records.tolist()))
    assert view.prefetch([len(view)]) is False
    assert isinstance(view.recently_cold, bool)


def _rows_in_child(view, rows):
    seg, pos = view.segments(rows)
    return view[rows], seg, pos


def test_a_spawned_worker_process_reads_the_same_rows(tmp_path):
    import multiprocessing

    view = pack(_corpus(tmp_path, FF_LENGTHS, max_record_bytes=64), 16, method="first_fit",
                eos_id=EOS, seed=3)
    rows = [0, len(view) - 1, 2]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        got = pool.apply(_rows_in_child, (view, rows))
    for x, y in zip(got, _rows_in_child(view, rows), strict=True):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int32])
@pytest.mark.parametrize("eos", [None, 7])
@pytest.mark.parametrize("layout", ["whole", "pieces", "subset", "pieces-subset"])
@pytest.mark.parametrize("method", METHODS)
def test_the_native_rows_equal_the_numpy_reference(tmp_path, dtype, eos, layout, method):
    """One native call (_native.pack_concat / pack_first_fit) plans, gathers and fills segment
    ids and positions for packing over one store -- documents whole or in pieces, the store or
    a subset of whole documents; the NumPy path is its reference, on the same random rows
    (empty documents, documents longer than a row and than a piece, truncated ones, padding
    and the end token included)."""
    rng = np.random.default_rng(11)
    docs = [rng.integers(8, 1000, n).astype(dtype) for n in rng.integers(0, 300, 120)]
    piece = 40 * np.dtype(dtype).itemsize if "pieces" in layout else None
    loaderx.from_iterator(tmp_path / "d", docs, codec="raw", progress=False,
                          max_record_bytes=piece)
    source: Any = loaderx.RaggedDataset(tmp_path / "d")
    if "subset" in layout:  # every other document, each with all its pieces
        lengths = source.store.lengths(np.arange(len(source), dtype=np.uint64))
        ends = lengths != (piece or 0)  # bytes: a full piece is continued
        doc_of = np.concatenate([[0], np.cumsum(ends)[:-1]])
        source = loaderx.Subset(source, np.flatnonzero(doc_of % 2 == 0))
    fast = loaderx.pack(source, 37, method=method, eos_id=eos, pad_id=5, seed=3)
    slow = loaderx.pack(source, 37, method=method, eos_id=eos, pad_id=5, seed=3)
    assert fast._native is not None
    slow._native = None
    rows = rng.integers(0, len(fast), 64).astype(np.uint64)
    got = np.zeros(64 * fast.record_bytes, np.uint8)
    want = np.zeros_like(got)
    fast.gather_rows(rows, got)
    slow.gather_rows(rows, want)
    assert (got == want).all()
    for a, b in zip(fast.segments(rows), slow.segments(rows), strict=True):
        assert (a == b).all()
    with pytest.raises(LoaderxIndexError):
        fast.gather_rows(np.array([len(fast)], np.uint64), got)


@pytest.mark.parametrize("native", [True, False])
def test_gather_rows_reads_positions_of_any_integer_dtype(tmp_path, native):
    """Rows asked for as int32 are those rows, even when their bytes equal the last uint64
    batch's (the parts cache is keyed by bytes) -- and a negative row counts from the end."""
    view = pack(_corpus(tmp_path, LENGTHS), 7, eos_id=EOS)
    if not native:
        view._native = None
    rb = view.record_bytes
    first = np.zeros(rb, np.uint8)
    view.gather_rows(np.array([1], dtype=np.uint64), first)
    got = np.zeros(2 * rb, np.uint8)
    view.gather_rows(np.array([1, 0], dtype=np.int32), got)  # the same 8 bytes
    assert np.array_equal(got.view(view.dtype).reshape(2, 7), view[np.array([1, 0])])
    last = np.zeros(rb, np.uint8)
    view.gather_rows(np.array([-1], dtype=np.int64), last)
    assert np.array_equal(last.view(view.dtype), view[len(view) - 1])
