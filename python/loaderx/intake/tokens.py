"""Token corpora: a flat stream of token ids (a nanoGPT-style ``train.bin``, or a 1-D ``.npy``)
cut into documents at the end-of-document token and written in the layout :func:`loaderx.pack`
reads best.

* :func:`split_documents` -- the documents of a 1-D token array, as views, one block of the
  array at a time (a memory-mapped file of any size is never read whole).
* :func:`from_token_stream` -- writes them with :func:`loaderx.from_iterator`: the end token
  dropped (``pack(docs, seq_len, eos_id=...)`` puts it back, so the packed stream is the file's
  stream), long documents in pieces, raw by default.

Why raw: packed rows are read at random, a few hundred tokens from each document. A zstd record
must be decoded whole to read any of it, so a row costs a piece of decoding however small the
row; measured on this project's benchmark corpus (``scripts/bench_packing.py``) even 1-4 KiB
pieces ran at a fifth of the raw loader's rate, and ``zstd -b`` itself decodes 1 KiB blocks of
the corpus at about 230 MB/s. So ``codec="raw"`` (pieces of up to 1 MiB, the record limit) is
the default, and ``codec="zstd"`` gets 4 KiB pieces, the best zstd layout measured there.

>>> import numpy as np, tempfile, os, loaderx
>>> stream = np.array([5, 6, 0, 7, 0, 8, 9, 9, 0], dtype=np.uint16)  # 0 ends a document
>>> [d.tolist() for d in split_documents(stream, 0)]
[[5, 6], [7], [8, 9, 9]]
>>> root = tempfile.mkdtemp()
>>> from_token_stream(os.path.join(root, "docs"), stream, 0)
3
>>> view = loaderx.pack(loaderx.RaggedDataset(os.path.join(root, "docs")), 3, eos_id=0)
>>> len(view), sorted(view[:].reshape(-1).tolist()) == sorted(stream.tolist())
(3, True)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, cast

import numpy as np

from loaderx.errors import LoaderxTypeError, LoaderxValueError
from loaderx.zrecord import Codec

__all__ = ["from_token_stream", "split_documents", "TOKEN_PIECE_BYTES"]

#: Piece size (``max_record_bytes``) per codec for a token corpus: raw pieces as large as a
#: record may be (a row copies only its tokens), zstd pieces small (a row decodes its pieces).
TOKEN_PIECE_BYTES = {"raw": 1 << 20, "zstd": 4 << 10, "zstd_dict": 4 << 10}

#: Tokens scanned for end tokens at a time: bounds the scan's memory for any file size.
_BLOCK = 1 << 24


def _end_token(tokens: Any, eos_id: Any) -> tuple[np.ndarray, int]:
    """The stream as a 1-D integer array and ``eos_id`` checked against its dtype."""
    if not isinstance(tokens, np.ndarray):
        raise LoaderxTypeError(f"tokens must be a NumPy array (np.memmap or np.load(..., "
                               f"mmap_mode='r') for a file), got {type(tokens).__name__}")
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise LoaderxValueError(f"tokens must be a 1-D integer array, got {tokens.dtype} of "
                                f"shape {tokens.shape}")
    if isinstance(eos_id, (bool, np.bool_)) or not isinstance(eos_id, (int, np.integer)):
        raise LoaderxValueError(f"the end token must be an int, got {eos_id!r}")
    info = np.iinfo(tokens.dtype)
    if not info.min <= int(eos_id) <= info.max:
        raise LoaderxValueError(f"the end token {eos_id} does not fit the tokens' dtype "
                                f"{tokens.dtype} ({info.min}..{info.max})")
    return tokens, int(eos_id)


def split_documents(tokens: np.ndarray, eos_id: int) -> Iterator[np.ndarray]:
    """The documents of the 1-D token stream ``tokens``: the runs between ``eos_id`` tokens
    (which are dropped), as views of ``tokens``, in order. Two end tokens in a row give an
    empty document; tokens after the last end token are the last document (none when the
    stream ends with one)."""
    return _documents(*_end_token(tokens, eos_id))


def _documents(tokens: np.ndarray, eos: int) -> Iterator[np.ndarray]:
    """:func:`split_documents` of a checked stream."""
    start = 0
    for lo in range(0, len(tokens), _BLOCK):
        ends = np.flatnonzero(tokens[lo:lo + _BLOCK] == eos) + lo
        for end in ends.tolist():
            yield tokens[start:end]
            start = end + 1
    if start < len(tokens):
        yield tokens[start:]


def from_token_stream(path: str | os.PathLike[str], tokens: np.ndarray, eos_id: int, *,
                      codec: str = "raw", max_record_bytes: int | None = None,
                      **options: Any) -> int:
    """Writes the documents of ``tokens`` (see :func:`split_documents`) as a ragged dataset at
    ``path``, one document per record, long ones in pieces of ``max_record_bytes`` (default:
    :data:`TOKEN_PIECE_BYTES` of the codec), and returns how many documents there are.
    ``options`` go to :func:`loaderx.from_iterator` (``overwrite``, ``progress``, ...). Read
    it with ``loaderx.pack(RaggedDataset(path), seq_len, eos_id=eos_id)``."""
    from loaderx.converter import from_iterator

    tokens, eos = _end_token(tokens, eos_id)
    if max_record_bytes is None:
        max_record_bytes = TOKEN_PIECE_BYTES.get(codec, 4 << 10)
    documents = 0

    def counted() -> Iterator[np.ndarray]:
        nonlocal documents
        for doc in _documents(tokens, eos):
            documents += 1
            yield doc

    if not len(tokens):
        raise LoaderxValueError("the token stream is empty: there is no document to write")
    schema = dict(options.pop("schema", None) or {})
    schema.setdefault("end_token", eos)  # what pack(eos_id=) should be given back
    if schema["end_token"] != eos:
        raise LoaderxValueError(f"schema={{'end_token': {schema['end_token']!r}}} contradicts "
                                f"the end token {eos}; leave end_token out of schema=")
    _check_corpus_end_token(path, eos, options)
    from_iterator(path, counted(), codec=cast(Codec, codec),
                  max_record_bytes=max_record_bytes, schema=schema, **options)
    return documents


def _check_corpus_end_token(path: str | os.PathLike[str], eos: int,
                            options: dict[str, Any]) -> None:
    """An append (the default where a dataset is at ``path``, unless ``overwrite=True`` or
    ``append=False``) must cut documents at the end token the corpus was cut at: its packed
    rows put that token back between documents (``pack(eos_id=...)``), so one corpus has one
    end token, kept in its schema as ``end_token``."""
    if options.get("overwrite") or options.get("append") is False:
        return  # a new corpus, or an append refused by from_iterator
    from loaderx._store import schema as _schema
    from loaderx._store import staging

    path = os.fspath(path)
    staging.remove_stale(path)  # as the append would: a replacement a kill cut short, finished
    if not _schema.is_store(path):
        return
    had = _schema.read(path).extra.get("end_token")
    if had is not None and had != eos:
        raise LoaderxValueError(
            f"{path} is a token corpus whose documents end at token {had!r} (its schema's "
            f"end_token); appending documents cut at {eos} would make pack(eos_id=...) wrong "
            f"for one of them. Append with eos_id={had!r}, or write another corpus "
            "(another path, or overwrite=True to replace this one)")
