"""Token corpora from a flat token stream (loaderx.intake.tokens and ``loaderx convert
--split-at``): documents cut at the end token, written for pack(), and the packed stream equal
to the file's own stream."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import loaderx
from loaderx import ConcatDataset, RaggedDataset, from_token_stream, pack
from loaderx.errors import LoaderxTypeError, LoaderxValueError
from loaderx.intake.tokens import split_documents

EOS = 7


def _stream(rng: np.random.Generator, docs: int, dtype: type = np.uint16) -> np.ndarray:
    """Documents of random tokens (never EOS), each followed by EOS; some empty, one long."""
    parts = []
    for n in [0, *rng.integers(0, 60, docs).tolist(), 0, 0, 5000]:
        doc = rng.integers(8, 1000, n).astype(dtype)
        parts += [doc, np.array([EOS], dtype)]
    return np.concatenate(parts)


def _reference_split(stream: np.ndarray) -> list[list[int]]:
    """The documents as a plain Python loop sees them."""
    docs, cur = [], []
    for t in stream.tolist():
        if t == EOS:
            docs.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur:
        docs.append(cur)
    return docs


@pytest.mark.parametrize("tail", [True, False])
def test_split_documents_equals_a_python_loop(monkeypatch, tail):
    import loaderx.intake.tokens as tokens

    monkeypatch.setattr(tokens, "_BLOCK", 64)  # documents straddle the scan's blocks
    stream = _stream(np.random.default_rng(1), 40)
    if not tail:
        stream = stream[:-3]  # no end token at the end: the last document is the rest
    got = [d.tolist() for d in split_documents(stream, EOS)]
    assert got == _reference_split(stream)
    assert any(not d for d in got), "empty documents are kept"


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int32])
@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_packed_rows_are_the_files_stream(tmp_path, dtype, codec):
    """Written with the end token dropped and packed with eos_id=EOS in document order, every
    row is the next seq_len tokens of the original stream; the long document is in pieces."""
    stream = _stream(np.random.default_rng(2), 50, dtype)
    piece = 512 if codec == "raw" else None  # raw's default (1 MiB) holds 5000 tokens whole
    n = from_token_stream(tmp_path / "d", stream, EOS, codec=codec, progress=False,
                          max_record_bytes=piece)
    assert n == len(_reference_split(stream))
    docs = RaggedDataset(tmp_path / "d")
    assert docs.schema["end_token"] == EOS
    assert len(docs) > n, "the 5000-token document is stored in pieces"
    view = pack(docs, 64, eos_id=EOS)
    order = view._plan.order
    # The packed stream in the plan's document order, rebuilt from the reference documents.
    ref = _reference_split(stream)
    want = np.array([t for k in order.tolist() for t in [*ref[k], EOS]], dtype=dtype)
    got = view[:].reshape(-1)
    assert len(got) == len(want) // 64 * 64
    np.testing.assert_array_equal(got, want[:len(got)])


def test_bad_token_streams_are_refused(tmp_path):
    with pytest.raises(LoaderxValueError, match="does not fit"):
        from_token_stream(tmp_path / "a", np.zeros(4, np.uint16), 70000)
    with pytest.raises(LoaderxValueError, match="1-D integer"):
        from_token_stream(tmp_path / "b", np.zeros((2, 2), np.uint16), 0)
    with pytest.raises(LoaderxValueError, match="1-D integer"):
        from_token_stream(tmp_path / "c", np.zeros(4, np.float32), 0)
    with pytest.raises(LoaderxTypeError, match="NumPy array"):
        from_token_stream(tmp_path / "d", [1, 2, 0], 0)
    with pytest.raises(LoaderxValueError, match="empty"):
        from_token_stream(tmp_path / "e", np.zeros(0, np.uint16), 0)
    assert not any(tmp_path.iterdir()), "a refused stream writes nothing"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loaderx", *args], capture_output=True,
                          text=True, timeout=300)


def test_cli_converts_a_nanogpt_bin_and_a_npy(tmp_path):
    stream = _stream(np.random.default_rng(3), 30)
    stream.tofile(tmp_path / "train.bin")
    np.save(tmp_path / "train.npy", stream)
    r = _cli("convert", str(tmp_path / "train.bin"), str(tmp_path / "a"), "--split-at",
             str(EOS), "--dtype", "uint16", "--progress", "off")
    assert r.returncode == 0, r.stderr
    assert "eos_id=7" in r.stdout
    r = _cli("convert", str(tmp_path / "train.npy"), str(tmp_path / "b"), "--split-at",
             str(EOS), "--codec", "zstd", "--progress", "off")
    assert r.returncode == 0, r.stderr
    a, b = RaggedDataset(tmp_path / "a"), RaggedDataset(tmp_path / "b")
    ref = _reference_split(stream)
    for ds in (a, b):
        view = pack(ds, 16, eos_id=EOS)
        assert view.documents == len(ref)
    assert a.schema["codec"] == "raw" and b.schema["codec"] == "zstd"
    # Misuse: a raw file without --dtype, a dtype that does not divide the file, a .npy with
    # --dtype, token options without --split-at.
    cases = [
        (["--split-at", "7"], "--dtype"),
        (["--split-at", "7", "--dtype", "uint32"], "whole number"),
        (["--split-at", "7", "--dtype", "float32"], "integer type"),
    ]
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x07\x00\x01\x00")
    for extra, says in cases:
        r = _cli("convert", str(tmp_path / "odd.bin"), str(tmp_path / "x"), *extra)
        assert r.returncode == 2 and says in r.stderr, (extra, r.stderr)
    r = _cli("convert", str(tmp_path / "train.npy"), str(tmp_path / "x"), "--split-at", "7",
             "--dtype", "uint16")
    assert r.returncode == 2 and "drop --dtype" in r.stderr
    r = _cli("convert", str(tmp_path / "train.npy"), str(tmp_path / "x"), "--dtype", "uint16")
    assert r.returncode == 2 and "--split-at" in r.stderr
    assert not (tmp_path / "x").exists()


def test_a_concatenation_of_packed_views_names_the_fix(tmp_path):
    loaderx.from_iterator(tmp_path / "a", [np.arange(50, dtype=np.uint16)] * 4,
                          progress=False)
    view = pack(RaggedDataset(tmp_path / "a"), 16)
    with pytest.raises(LoaderxTypeError, match=r"pack\(ConcatDataset"):
        ConcatDataset([view, view])
    with pytest.raises(LoaderxTypeError, match="must be a dataset path"):
        ConcatDataset([object()])


@pytest.mark.parametrize("append", [True, None])
def test_an_append_with_another_end_token_is_refused(tmp_path, append):
    """One corpus, one end token: documents cut at another token would be packed back with
    the corpus's (``pack(eos_id=schema["end_token"])``), so such an append is refused before
    anything is written, naming the corpus's end token; the same token appends."""
    import warnings

    stream = np.array([5, 6, EOS, 8, EOS], np.uint16)
    assert from_token_stream(tmp_path / "c", stream, EOS, progress=False) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", loaderx.errors.AppendWarning)
        with pytest.raises(LoaderxValueError, match=f"end at token {EOS} .*eos_id={EOS}"):
            from_token_stream(tmp_path / "c", np.array([9, 3, 9], np.uint16), 3,
                              append=append, progress=False)
        docs = RaggedDataset(tmp_path / "c")
        assert docs.schema["end_token"] == EOS and len(docs) == 2
        assert from_token_stream(tmp_path / "c", stream, EOS, append=append,
                                 progress=False) == 2
    docs = RaggedDataset(tmp_path / "c")
    assert docs.schema["end_token"] == EOS and len(docs) == 4
    # A new corpus in its place may have another end token.
    assert from_token_stream(tmp_path / "c", np.array([9, 3, 9], np.uint16), 3,
                             overwrite=True, progress=False) == 2
    assert RaggedDataset(tmp_path / "c").schema["end_token"] == 3
    with pytest.raises(LoaderxValueError, match="contradicts the end token"):
        from_token_stream(tmp_path / "d", stream, EOS, schema={"end_token": 3})
    assert not (tmp_path / "d").exists()
