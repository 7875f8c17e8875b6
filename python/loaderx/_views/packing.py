"""The implementation behind :mod:`loaderx.packing`, the public module, whose documentation
says what this does and why."""

from __future__ import annotations

import hashlib
import operator
import os
import threading
import warnings
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from loaderx import _native
from loaderx._views.dataset import RaggedDataset, pinned_to
from loaderx._views.gather import _dense_gather, _indices, _one_index
from loaderx._views.pack_plan import ConcatPlan, FirstFitPlan, Parts, _ranges
from loaderx._views.recycle import aligned_empty
from loaderx.errors import (
    DatasetError,
    LimitExceededError,
    LoaderxIndexError,
    LoaderxTypeError,
    LoaderxValueError,
    TruncationWarning,
)
from loaderx.sampler import normalize_seed

__all__ = ["pack", "PackedDataset", "PIECE_ROWS_KEY", "MAX_BATCH_TOKENS"]

#: The schema key of a token corpus written in pieces (see the module docs).
PIECE_ROWS_KEY = "piece_rows"

#: The most tokens a batch of packed rows holds, and so the largest ``seq_len`` (a row is a
#: batch of one): a batch's segment ids and positions are int32 arrays over its tokens.
MAX_BATCH_TOKENS = (1 << 31) - 1

#: A concat document holds at most this many tokens, its end token counted: its positions
#: (int32) run from 0 to one less.
_MAX_DOCUMENT_TOKENS = 1 << 31

#: Batches of fewer bytes than this are not checked against the process's memory.
_CHECKED_BATCH_BYTES = 1 << 26

#: The int32 ``arange`` arrays of batch sizes a view keeps (see ``PackedDataset._arange``).
_KEPT_ARANGES = 4

Method = Literal["concat", "first_fit"]
_METHODS = ("concat", "first_fit")


def pack(docs: Any, seq_len: int, *, method: Method = "concat", seed: Any = 0,
         eos_id: int | None = None, pad_id: int = 0, truncate: bool | None = None,
         repack: bool = False) -> PackedDataset:
    """The documents of ``docs`` packed into rows of ``seq_len`` tokens; see the module docs.

    ``docs``: a ragged dataset, subset or concatenation of 1-D integer records (one document
    each, or pieces of documents written with ``max_record_bytes=``). ``method``:
    ``"concat"`` or ``"first_fit"``. ``seed``: any int, the documents' order (concat) or
    which documents share a row (first_fit). ``eos_id``: a token written after every document
    (None: none). ``pad_id``: the token of first_fit's padding. ``truncate``: first_fit's
    treatment of a document longer than a row (None: cut it and warn, once per view, with the
    share of the tokens kept; True: cut it; False: LoaderxValueError). ``repack``: each pass
    over the rows packed anew (:meth:`PackedDataset.pass_view`; read through
    ``loaderx.mix``)."""
    return PackedDataset(docs, seq_len, method=method, seed=seed, eos_id=eos_id,
                         pad_id=pad_id, truncate=truncate, repack=repack)


class _Layout(NamedTuple):
    """Where the documents' records live: ``parts`` (the ragged datasets that hold them),
    ``part_starts`` (each part's first record in the base's numbering, and the total), and
    ``indices`` (each view record's base record; None: the identity)."""

    parts: list[RaggedDataset]
    part_starts: np.ndarray
    indices: np.ndarray | None


def _layout(docs: Any) -> _Layout:
    """The parts of a ragged dataset, subset or concatenation, checked for token records."""
    from loaderx._views.concat import ConcatDataset
    from loaderx._views.subset import Subset

    if isinstance(docs, (str, os.PathLike)):
        raise LoaderxTypeError(f"pack() got a path; open it first: "
                               f"pack(RaggedDataset({os.fspath(docs)!r}), ...)")
    base, indices = docs, None
    if isinstance(docs, Subset):
        base, indices = docs.dataset, docs.indices
    if isinstance(base, RaggedDataset):
        parts = [base]
    elif isinstance(base, ConcatDataset) and base.kind == "ragged":
        parts = [p for p in base.parts if isinstance(p, RaggedDataset)]
    elif getattr(base, "kind", None) == "dense":
        raise LoaderxTypeError(
            f"pack() needs ragged token records (one document per record); "
            f"{type(docs).__name__} is dense. Write documents with "
            "loaderx.from_iterator(path, docs) and pass RaggedDataset(path)")
    else:
        raise LoaderxTypeError(
            f"pack() needs a RaggedDataset (or a ragged Subset / ConcatDataset) of token "
            f"documents, got {type(docs).__name__}; write them with "
            "loaderx.from_iterator(path, docs) first")
    first = parts[0]
    if first.item_shape != ():
        raise LoaderxValueError(
            f"pack() needs 1-D token records; {first.path} holds records of shape "
            f"(n, {', '.join(map(str, first.item_shape))})".replace(", )", ")")
            + " (one token per row of a record; store each document's tokens as a 1-D array)")
    if first.dtype.kind not in "iu":
        raise LoaderxTypeError(f"pack() needs integer tokens; {first.path} holds "
                               f"{first.dtype} records")
    lengths = np.array([len(p) for p in parts], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return _Layout(parts, starts, indices)


def _piece_rows(parts: list[RaggedDataset]) -> int:
    """The parts' common ``piece_rows`` (0: documents are whole records)."""
    found = {int(p.schema.get(PIECE_ROWS_KEY) or 0) for p in parts}
    if len(found) != 1:
        raise DatasetError(f"the parts were written with different max_record_bytes (piece "
                           f"sizes {sorted(found)} rows); pack parts of one layout together")
    return found.pop()


class _Documents(NamedTuple):
    """The documents of a view: each one's tokens and (pieces only) first view record (the
    lengths are dropped once the plan is made)."""

    lengths: np.ndarray
    first_record: np.ndarray | None
    piece_rows: int


def _record_lengths(layout: _Layout, itemsize: int) -> np.ndarray:
    """Tokens of every view record (uint32), from the record tables."""
    out = []
    if layout.indices is None:
        for p in layout.parts:
            out.append(p.store.lengths(np.arange(len(p), dtype=np.uint64)))
        nbytes = np.concatenate(out) if len(out) > 1 else out[0]
    else:
        part, local = _locate(layout, layout.indices)
        nbytes = np.empty(len(local), dtype=np.uint32)
        for k in np.unique(part):
            here = part == k
            nbytes[here] = layout.parts[int(k)].store.lengths(local[here])
    if itemsize > 1:
        if (nbytes % itemsize).any():
            bad = int(np.flatnonzero(nbytes % itemsize)[0])
            raise DatasetError(f"record {bad} holds {int(nbytes[bad])} bytes, not a whole "
                               f"number of {itemsize}-byte tokens")
        nbytes //= itemsize
    return nbytes


def _locate(layout: _Layout, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each base record's part and index within it."""
    if len(layout.parts) == 1:
        return np.zeros(len(base), dtype=np.int64), base.astype(np.uint64, copy=False)
    part = np.searchsorted(layout.part_starts, base, side="right") - 1
    return part, (base - layout.part_starts[part].astype(np.uint64)).astype(np.uint64)


def _documents(layout: _Layout, lengths: np.ndarray, piece_rows: int) -> _Documents:
    """Records grouped into documents: a record of ``piece_rows`` tokens is continued by the
    next one. Refuses a view that cuts a document (a subset holding some of its pieces)."""
    if not piece_rows:
        return _Documents(lengths, None, 0)
    continued = lengths == piece_rows
    n = len(lengths)
    if n and continued[-1]:
        raise DatasetError("the last record is a full piece, so its document goes on past the "
                           "end of the data; a subset must hold every piece of its documents "
                           "(or the store was changed by a delete)")
    if layout.indices is not None or len(layout.parts) > 1:
        base = (layout.indices if layout.indices is not None
                else np.arange(n, dtype=np.uint64))
        part, local = _locate(layout, base)
        at = np.flatnonzero(continued)
        broken = (part[at + 1] != part[at]) | (local[at + 1] != local[at] + 1)
        if broken.any():
            i = int(at[np.flatnonzero(broken)[0]])
            raise DatasetError(f"record {i} of the view is a piece of a document whose next "
                               f"piece is not the next record; select whole documents (every "
                               "piece, in order) when making a subset of a corpus written "
                               "with max_record_bytes=")
        if layout.indices is not None:
            _check_document_starts(layout, continued, part, local)
    ends = np.flatnonzero(~continued)
    first = np.empty(len(ends), dtype=np.int64)
    first[0:1] = 0
    first[1:] = ends[:-1] + 1
    doc_lengths = (ends - first) * piece_rows + lengths[ends].astype(np.int64)
    small = first.astype(np.uint32) if n < (1 << 32) else first  # 4 bytes a document
    return _Documents(doc_lengths, small, piece_rows)


def _check_document_starts(layout: _Layout, continued: np.ndarray, part: np.ndarray,
                           local: np.ndarray) -> None:
    """A subset's documents must start where the store's do: the record before each one's
    first piece (if any) is not a full piece."""
    starts = np.flatnonzero(np.concatenate([[True], ~continued[:-1]]))
    inner = starts[local[starts] > 0]
    for k in np.unique(part[inner]):
        here = inner[part[inner] == k]
        store = layout.parts[int(k)]
        before = store.lengths(local[here] - np.uint64(1))
        cut = before == _piece_rows([store])
        if cut.any():
            i = int(here[np.flatnonzero(cut)[0]])
            raise DatasetError(f"record {i} of the view continues a document whose earlier "
                               "pieces the view does not hold; select whole documents when "
                               "making a subset of a corpus written with max_record_bytes=")


def _token_id(value: Any, what: str, dtype: np.dtype) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise LoaderxValueError(f"{what} must be an integer token, got {value!r}")
    try:
        token = operator.index(value)
    except TypeError:
        raise LoaderxValueError(f"{what} must be an integer token, got "
                                f"{type(value).__name__} ({value!r})") from None
    info = np.iinfo(dtype)
    if not info.min <= token <= info.max:
        raise LoaderxValueError(f"{what}={token} does not fit the documents' dtype {dtype} "
                                f"([{info.min}, {info.max}]); pass a token id in that range")
    return token


def _token_bits(token: int, dtype: np.dtype) -> int:
    """``token``'s bytes as the documents store them (``dtype``: signed or unsigned, either byte
    order), read as a little-endian unsigned integer: the native gather writes a token's low
    ``itemsize`` bytes of it, little-endian, so it writes exactly what the NumPy path does."""
    return int.from_bytes(np.array(token, dtype=dtype).tobytes(), "little")


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB"


def _memory_limit() -> tuple[int, str] | None:
    """The most memory this process can have, and what sets it: the smallest of the physical
    memory, the cgroup's ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1), and the soft
    ``RLIMIT_AS`` / ``RLIMIT_DATA``; None where none is known."""
    found: list[tuple[int, str]] = []
    try:
        found.append((os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
                      "the physical memory"))
    except (AttributeError, OSError, ValueError):
        pass
    for file, what in (("/sys/fs/cgroup/memory.max", "the cgroup's memory.max"),
                       ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                        "the cgroup's memory.limit_in_bytes")):
        try:
            with open(file) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            found.append((int(text), what))
    try:
        import resource
    except ImportError:  # not on Unix
        resource = None  # type: ignore[assignment]
    if resource is not None:
        for name in ("RLIMIT_AS", "RLIMIT_DATA"):
            which = getattr(resource, name, None)
            if which is None:
                continue
            soft = resource.getrlimit(which)[0]
            if soft != resource.RLIM_INFINITY and soft > 0:
                found.append((int(soft), name))
    found = [f for f in found if f[0] > 0]
    return min(found) if found else None


class _Cache(threading.local):
    """The last batch's parts, per thread: the loader gathers a stream, then asks for its
    companion arrays with the same indices."""

    key: bytes = b""
    parts: Parts | None = None
    segments_key: bytes = b""
    segments: tuple[np.ndarray, np.ndarray] | None = None


class PackedDataset:
    """Rows of ``seq_len`` tokens packed from token documents: a dense view (see the module
    docs; made by :func:`pack`)."""

    kind = "dense"

    def __init__(self, docs: Any, seq_len: int, *, method: Method = "concat", seed: Any = 0,
                 eos_id: int | None = None, pad_id: int = 0, truncate: bool | None = None,
                 repack: bool = False, _warned: bool = False) -> None:
        if isinstance(seq_len, (bool, np.bool_)) or not isinstance(seq_len, (int, np.integer)):
            raise LoaderxValueError(f"seq_len must be a positive int, got {seq_len!r}")
        if seq_len <= 0:
            raise LoaderxValueError(f"seq_len must be a positive int, got {seq_len}")
        if seq_len > MAX_BATCH_TOKENS:
            raise LimitExceededError(
                f"seq_len={seq_len} is over the {MAX_BATCH_TOKENS} tokens (2**31 - 1) a batch "
                "of packed rows, and so one row, can hold (the segment ids and positions are "
                "int32); use a smaller seq_len")
        if method not in _METHODS:
            raise LoaderxValueError(f"method must be one of {_METHODS}, got {method!r}")
        if truncate is not None and not isinstance(truncate, (bool, np.bool_)):
            raise LoaderxValueError(f"truncate must be None, True or False, got {truncate!r}")
        if not isinstance(repack, (bool, np.bool_)):
            raise LoaderxValueError(f"repack must be True or False, got {repack!r}")
        layout = _layout(docs)
        self._docs = docs
        self._docs_len = len(docs)
        self._layout = layout
        self._dtype = np.dtype(layout.parts[0].dtype)
        self._eos = None if eos_id is None else _token_id(eos_id, "eos_id", self._dtype)
        self._pad = _token_id(pad_id, "pad_id", self._dtype)
        self._seq_len = int(seq_len)
        self._method: Method = method
        self._seed = seed
        self._truncate: bool | None = None if truncate is None else bool(truncate)
        self._repack = bool(repack)
        self._record_bytes = self._seq_len * self._dtype.itemsize
        piece_rows = _piece_rows(layout.parts)
        documents = _documents(layout, _record_lengths(layout, self._dtype.itemsize),
                               piece_rows)
        self._documents = documents
        key = normalize_seed(seed)
        eos = self._eos is not None
        # What the native gather writes: the tokens' bytes (negative ids, either byte order).
        self._eos_bits = None if self._eos is None else _token_bits(self._eos, self._dtype)
        self._pad_bits = _token_bits(self._pad, self._dtype)
        self._plan: ConcatPlan | FirstFitPlan
        if method == "concat":
            _check_positions(documents.lengths, eos)
            self._plan = ConcatPlan(documents.lengths, self._seq_len, key, eos)
        else:
            plan = FirstFitPlan(documents.lengths, self._seq_len, key, eos)
            if plan.truncated and self._truncate is False:
                raise LoaderxValueError(
                    f"{plan.truncated} of {len(documents.lengths)} documents are longer than "
                    f"seq_len={self._seq_len} (the longest: {plan.longest} tokens"
                    f"{', its end token counted' if eos else ''}); pass truncate=True to "
                    "cut them, or a larger seq_len")
            if plan.truncated and self._truncate is None and not _warned:
                warnings.warn(
                    f"first_fit cut {plan.truncated} of {len(documents.lengths)} documents to "
                    f"seq_len={self._seq_len} (the longest: {plan.longest} tokens"
                    f"{', its end token counted' if eos else ''}): the rows keep "
                    f"{_share(plan.kept_tokens, plan.document_tokens)} of the documents' "
                    "tokens. method='concat' keeps every token (documents split across rows); "
                    "pass truncate=True to cut without this warning, truncate=False to refuse, "
                    "or a larger seq_len", TruncationWarning, stacklevel=3)
            self._plan = plan
        # The lengths went into the plan; only the document count and the pieces stay.
        self._document_count = len(documents.lengths)
        self._documents = documents._replace(lengths=np.empty(0, dtype=np.int64))
        self._cache = _Cache()
        self._aranges: dict[int, np.ndarray] = {}
        self._gather_parts = all(hasattr(p.store._native, "gather_parts")
                                 for p in layout.parts)
        # Packing over one store -- whole records or pieces, the whole store or a subset --
        # has a native form that plans, gathers and fills segment ids and positions in one call.
        self._native = (layout.parts[0].store._native if len(layout.parts) == 1
                        and hasattr(_native, "pack_concat") else None)
        self._view_records = (None if layout.indices is None else
                              np.ascontiguousarray(layout.indices, dtype=np.uint64))
        first = documents.first_record
        self._first_record = (None if first is None or first.dtype == np.uint32
                              else first.astype(np.uint64))

    # -- what the plan says --------------------------------------------------------------------

    @property
    def docs(self) -> Any:
        """The documents' dataset."""
        return self._docs

    @property
    def seq_len(self) -> int:
        return self._seq_len

    @property
    def method(self) -> str:
        return self._method

    @property
    def eos_id(self) -> int | None:
        return self._eos

    @property
    def pad_id(self) -> int:
        return self._pad

    @property
    def documents(self) -> int:
        """How many documents the view packs."""
        return self._document_count

    @property
    def repacks(self) -> bool:
        """Whether each pass over the rows is packed anew (``repack=True``; see
        :meth:`pass_view`)."""
        return self._repack

    def pass_view(self, p: int) -> PackedDataset:
        """Pass ``p``'s rows of a view that re-packs per pass: the documents packed in the
        pass's own seeded order (pass 0: this view). As many rows as this view; the view does
        not re-pack itself."""
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, np.integer)) or p < 0:
            raise LoaderxValueError(f"a pass is an integer of 0 or more, got {p!r}")
        if not self._repack or p == 0:
            return self
        view = PackedDataset(self._docs, self._seq_len, method=self._method,
                             seed=_pass_seed(self._seed, int(p)), eos_id=self._eos,
                             pad_id=self._pad, truncate=True)
        if len(view) != len(self):  # the plans' row counts do not depend on the order
            raise AssertionError(f"pass {p} packs {len(view)} rows, pass 0 {len(self)}")
        return view

    @property
    def truncated(self) -> int:
        """first_fit: documents cut to fit a row (0 for concat)."""
        return self._plan.truncated if isinstance(self._plan, FirstFitPlan) else 0

    @property
    def dropped_tokens(self) -> int:
        """concat: tokens of the stream's tail, shorter than a row, that no row holds."""
        return self._plan.dropped_tokens if isinstance(self._plan, ConcatPlan) else 0

    @property
    def padding_tokens(self) -> int:
        """first_fit: padding tokens over all rows (0 for concat)."""
        return self._plan.padding_tokens if isinstance(self._plan, FirstFitPlan) else 0

    @property
    def plan_bytes(self) -> int:
        """Memory the row plan and the document table keep."""
        first = self._documents.first_record
        extra = 0 if first is None else first.nbytes
        return self._plan.nbytes + extra

    # -- the dense-source protocol (loaderx.source) --------------------------------------------

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def item_shape(self) -> tuple[int, ...]:
        return (self._seq_len,)

    @property
    def record_bytes(self) -> int:
        return self._record_bytes

    def __len__(self) -> int:
        return self._plan.rows

    @property
    def path(self) -> str:
        return os.pathsep.join(p.path for p in self._layout.parts)

    @property
    def closed(self) -> bool:
        return any(p.closed for p in self._layout.parts)

    @property
    def recently_cold(self) -> bool:
        return any(p.recently_cold for p in self._layout.parts)

    @property
    def view_digest(self) -> str:
        """A digest of what the rows are: the arguments, the plan's size and the documents'
        view, so that a checkpoint of one packing is refused on another."""
        base = getattr(self._docs, "view_digest", "")
        text = repr((self._method, self._seq_len, normalize_seed(self._seed), self._eos,
                     self._pad, self._truncate is not False, self.documents, len(self), base)
                    + (("repack",) if self._repack else ()))
        return "pack-" + hashlib.sha1(text.encode()).hexdigest()[:16]

    def _check_batch(self, rows: int) -> None:
        """Refuses a batch of ``rows`` rows that cannot be held -- more than
        :data:`MAX_BATCH_TOKENS` tokens, or more bytes (tokens, int32 segment ids and positions)
        than the process can have -- before anything is allocated, naming its size."""
        tokens = rows * self._seq_len
        nbytes = tokens * (self._dtype.itemsize + 8)
        if nbytes < _CHECKED_BATCH_BYTES:
            return
        what = (f"a batch of {rows} packed row{'' if rows == 1 else 's'} of {self._seq_len} "
                f"tokens")
        if tokens > MAX_BATCH_TOKENS:
            raise LimitExceededError(
                f"{what} holds {tokens} tokens; a batch holds at most {MAX_BATCH_TOKENS} tokens "
                "(2**31 - 1: its segment ids and positions are int32). Use a smaller seq_len "
                "or batch (fewer rows at a time)")
        limit = _memory_limit()
        if limit is not None and nbytes > limit[0]:
            raise LimitExceededError(
                f"{what} needs {_gib(nbytes)} ({self._dtype} tokens plus int32 segment ids and "
                f"positions, {self._dtype.itemsize + 8} bytes a token), more than this process "
                f"can have ({_gib(limit[0])}: {limit[1]}). Use a smaller seq_len or batch "
                "(fewer rows at a time)")

    def gather(self, idxs: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``idxs`` as one ``(len(idxs), seq_len)`` array (into ``out`` when given)."""
        if not (isinstance(idxs, np.ndarray) and idxs.dtype == np.uint64 and idxs.ndim == 1):
            idxs = _indices(idxs, len(self)).reshape(-1)
        self._check_batch(len(idxs))  # before the batch is allocated
        return _dense_gather(self, idxs, out)

    def gather_rows(self, idxs: npt.NDArray[np.uint64], dst: npt.NDArray[np.uint8],
                    shards: int | None = None,
                    rows: npt.NDArray[np.uint64] | None = None) -> None:
        """Writes row ``idxs[i]`` into row ``i`` (or ``rows[i]``) of the uint8 buffer ``dst`` of
        ``record_bytes``-byte rows (see :mod:`loaderx.source`)."""
        if not len(idxs):
            return
        idxs = self._row_indices(idxs)  # uint64 as given; other dtypes checked and converted
        self._check_batch(len(idxs))
        if self._native is not None and rows is None:
            self._gather_native(idxs, dst, shards)
            return
        parts = self._parts(idxs)
        s = self._seq_len
        slots = len(idxs) if rows is None else int(rows.max()) + 1
        if not (isinstance(dst, np.ndarray) and dst.dtype == np.uint8 and dst.ndim == 1
                and dst.flags.c_contiguous and dst.flags.writeable):
            raise LoaderxValueError("dst must be a writable, C-contiguous 1-D uint8 array")
        if slots * self._record_bytes > len(dst):
            raise LoaderxValueError(f"dst holds {len(dst)} bytes, too few for {slots} rows of "
                                    f"{self._record_bytes} bytes")
        tokens = dst[:slots * self._record_bytes].view(self._dtype)
        at = parts.flat
        if rows is not None:  # batch row i goes to row rows[i] of dst
            shift = rows.astype(np.int64) - np.arange(len(idxs), dtype=np.int64)
            shift *= s
            at = at + shift[parts.row]
        if not parts.covered:  # padding first, the documents over it
            if rows is None:
                tokens.fill(self._pad)
            else:
                tokens.reshape(-1, s)[rows.astype(np.int64)] = self._pad
        self._read(parts, at, dst, shards)
        if self._eos is not None:  # end-of-document tokens
            ended = parts.length > parts.content
            tokens[(at + parts.content)[ended]] = self._eos

    def _gather_native(self, idxs: npt.NDArray[np.uint64], dst: npt.NDArray[np.uint8],
                       shards: int | None, into: tuple[np.ndarray, np.ndarray] | None = None
                       ) -> None:
        """:meth:`gather_rows` in one native call (``_native.pack_concat`` or
        ``pack_first_fit``), which also fills the segment ids and positions, kept for the
        :meth:`companions` call that follows -- or written into ``into``, two C-contiguous
        ``(len(idxs), seq_len)`` int32 arrays (see :meth:`gather_with_segments`)."""
        plan, store = self._plan, self._native
        assert store is not None
        rows = self._row_indices(idxs)
        if len(rows) and int(rows.max()) >= len(self):
            bad = int(rows[rows >= len(self)][0])
            raise LoaderxIndexError(f"row {bad} is out of range for {len(self)} packed rows")
        if into is None:
            seg = np.empty((len(rows), self._seq_len), np.int32)
            pos = np.empty((len(rows), self._seq_len), np.int32)
        else:
            seg, pos = into
        pieces = self._documents
        first = self._first_record if self._first_record is not None else pieces.first_record
        layout = (first, pieces.piece_rows, self._view_records)
        size = self._dtype.itemsize
        if isinstance(plan, ConcatPlan):
            _native.pack_concat(store, plan.starts, plan.order, rows, self._seq_len,
                                self._eos_bits, size, dst, seg.reshape(-1), pos.reshape(-1),
                                shards, layout)
        else:
            _native.pack_first_fit(store, plan.row_ptr, plan.row_docs, plan.sizes, rows,
                                   self._seq_len, self._eos_bits, self._pad_bits, size, dst,
                                   seg.reshape(-1), pos.reshape(-1), shards, layout)
        if into is None:
            cache = self._cache
            cache.segments_key, cache.segments = rows.tobytes(), (seg, pos)

    def _filler(self) -> Any:
        """The native batch call of this view with its fixed arguments bound, or None:
        ``fill(rows, dst, segments, positions, shards)`` with ``rows`` (uint64, each below
        ``len``: not checked), ``dst`` the uint8 buffer of those rows and the flat int32
        segment ids and positions -- for a mixture, which calls it once per source and batch."""
        args = self._native_args()
        if args is None:
            return None
        store, how, eos, layout = args
        size, s = self._dtype.itemsize, self._seq_len
        if how[0] == "concat":
            _, starts, order = how

            def fill(rows: np.ndarray, dst: np.ndarray, seg: np.ndarray, pos: np.ndarray,
                     shards: int | None) -> None:
                _native.pack_concat(store, starts, order, rows, s, eos, size, dst, seg, pos,
                                    shards, layout)
        else:
            _, ptr, docs, sizes, pad = how

            def fill(rows: np.ndarray, dst: np.ndarray, seg: np.ndarray, pos: np.ndarray,
                     shards: int | None) -> None:
                _native.pack_first_fit(store, ptr, docs, sizes, rows, s, eos, pad, size, dst,
                                       seg, pos, shards, layout)
        return fill

    def _native_args(self) -> tuple[Any, ...] | None:
        """This view's fixed native arguments: ``(store, plan, eos_id, layout)``, the plan
        ``("concat", starts, order)`` or ``("first_fit", row_ptr, row_docs, sizes, pad_id)``
        -- or None when it reads through Python."""
        store, plan = self._native, self._plan
        if store is None:
            return None
        pieces = self._documents
        first = self._first_record if self._first_record is not None else pieces.first_record
        layout = (first, pieces.piece_rows, self._view_records)
        how: tuple[Any, ...] = ("concat", plan.starts, plan.order) \
            if isinstance(plan, ConcatPlan) else \
            ("first_fit", plan.row_ptr, plan.row_docs, plan.sizes, self._pad_bits)
        return store, how, self._eos_bits, layout

    def _native_source(self) -> tuple[Any, ...] | None:
        """A source of ``_native.MixedBatch`` (see :meth:`_native_args`), or None: a view that
        re-packs per pass has no one plan."""
        return None if self.repacks else self._native_args()

    def gather_with_segments(self, idxs: npt.NDArray[np.uint64], dst: npt.NDArray[np.uint8],
                             seg: np.ndarray, pos: np.ndarray,
                             shards: int | None = None) -> None:
        """Rows ``idxs`` into the uint8 buffer ``dst`` (``record_bytes``-byte rows, back to back)
        and their segment ids and positions into ``seg`` and ``pos`` (C-contiguous
        ``(len(idxs), seq_len)`` int32 arrays, e.g. row ranges of a whole batch's): what a
        mixture's batch of several sources is filled with, without a copy."""
        if not len(idxs):
            return
        self._check_batch(len(idxs))
        if self._native is not None:
            self._gather_native(idxs, dst, shards, (seg.reshape(-1, self._seq_len),
                                                    pos.reshape(-1, self._seq_len)))
            return
        self.gather_rows(idxs, dst, shards)
        seg[...], pos[...] = self.segments(idxs)

    def companions(self, name: str, idxs: npt.NDArray[np.uint64]) -> dict[str, np.ndarray]:
        """``name_segment_ids`` and ``name_positions`` of rows ``idxs`` (see the module
        docs)."""
        seg, pos = self.segments(idxs)
        return {f"{name}_segment_ids": seg, f"{name}_positions": pos}

    def companion_names(self, name: str) -> tuple[str, ...]:
        return (f"{name}_segment_ids", f"{name}_positions")

    def segments(self, idxs: Any) -> tuple[np.ndarray, np.ndarray]:
        """Segment ids and positions of rows ``idxs``, two ``(len(idxs), seq_len)`` int32
        arrays: 1, 2, ... for the documents of a row in row order (0: padding), and each
        token's position inside its document."""
        flat = self._row_indices(idxs)
        self._check_batch(len(flat))
        cache = self._cache
        if cache.segments is not None and cache.segments_key == flat.tobytes():
            done, cache.segments = cache.segments, None  # filled by the native gather
            return done
        parts = self._parts(flat)
        s = self._seq_len
        total = len(flat) * s
        # A part's token t is at flat + t and at position doc_pos + t of its document.
        back = (parts.flat - parts.doc_pos).astype(np.int32).repeat(parts.length)
        if parts.covered:  # the parts tile the rows: no scatter
            seg = parts.segment.repeat(parts.length)
            pos = self._arange(total) - back
        else:
            seg = np.zeros(total, dtype=np.int32)
            pos = np.zeros(total, dtype=np.int32)
            at = _ranges(parts.flat, parts.length)
            seg[at] = parts.segment.repeat(parts.length)
            pos[at] = at.astype(np.int32) - back
        return seg.reshape(len(flat), s), pos.reshape(len(flat), s)

    def prefetch(self, idxs: Any) -> bool:
        """Starts reading the records rows ``idxs`` need into the page cache, without
        waiting."""
        flat = np.asarray(idxs, dtype=np.uint64).reshape(-1)
        flat = flat[flat < len(self)]
        if not len(flat):
            return False
        parts = self._parts(flat)
        records = self._record_parts(parts, parts.flat)[0]
        return bool(self._docs.prefetch(np.unique(records).astype(np.uint64)))

    # -- reading -------------------------------------------------------------------------------

    def _arange(self, n: int) -> np.ndarray:
        """``arange(n)`` as int32, kept per size (read-only, shared by threads) for the last
        few sizes: a loader asks for one or two (the batch, a finite pass's last one)."""
        aranges = self._aranges
        cached = aranges.get(n)
        if cached is None:
            cached = np.arange(n, dtype=np.int32)
            cached.setflags(write=False)
            if len(aranges) >= _KEPT_ARANGES:  # a new dict: other threads keep the old one
                aranges = self._aranges = {}
            aranges[n] = cached
        return cached

    def _row_indices(self, idxs: Any) -> np.ndarray:
        if isinstance(idxs, np.ndarray) and idxs.dtype == np.uint64 and idxs.ndim == 1:
            return idxs
        return _indices(idxs, len(self)).reshape(-1)

    def _parts(self, idxs: np.ndarray) -> Parts:
        """The plan's parts of rows ``idxs``, checked, kept for the companion arrays."""
        if len(idxs) and int(idxs.max()) >= len(self):
            bad = int(idxs[idxs >= len(self)][0])
            raise LoaderxIndexError(f"row {bad} is out of range for {len(self)} packed rows")
        key = idxs.tobytes()
        cache = self._cache
        if cache.parts is not None and cache.key == key:
            return cache.parts
        parts = self._plan.parts(idxs)
        cache.key, cache.parts = key, parts
        return parts

    def _record_parts(self, parts: Parts,
                      at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The document tokens of ``parts`` as ranges of records: (view record, first token
        in it, tokens, destination token), from the parts' destinations ``at``."""
        p = self._documents.piece_rows
        if not p:
            return parts.doc, parts.doc_pos, parts.content, at
        assert self._documents.first_record is not None
        piece = parts.doc_pos // p
        start = parts.doc_pos - piece * p
        if (start + parts.content <= p).all():  # usually: each part inside one piece
            return self._documents.first_record[parts.doc] + piece, start, parts.content, at
        has = np.flatnonzero(parts.content)
        start, count = parts.doc_pos[has], parts.content[has]
        first_piece = start // p
        pieces = (start + count - 1) // p - first_piece + 1
        owner = np.repeat(has, pieces)
        piece = _ranges(first_piece, pieces)
        lo = np.maximum(piece * p, parts.doc_pos[owner])
        hi = np.minimum((piece + 1) * p, (parts.doc_pos + parts.content)[owner])
        record = self._documents.first_record[parts.doc[owner]] + piece
        return record, lo - piece * p, hi - lo, at[owner] + (lo - parts.doc_pos[owner])

    def _read(self, parts: Parts, at: np.ndarray, dst: np.ndarray,
              shards: int | None = None) -> None:
        """Copies the document tokens of ``parts`` into ``dst`` at tokens ``at``, in at most
        ``shards`` parallel blocks."""
        record, first, count, to = self._record_parts(parts, at)
        if not len(record):
            return
        layout = self._layout
        base = (record.astype(np.uint64) if layout.indices is None
                else layout.indices[record])
        size = self._dtype.itemsize
        if size > 1:
            first, count, to = first * size, count * size, to * size
        # All non-negative int64: read as uint64 without a copy.
        first, count, to = first.view(np.uint64), count.view(np.uint64), to.view(np.uint64)
        several = len(layout.parts) > 1
        part, local = _locate(layout, base) if several else (None, base)
        for k in (np.unique(part) if part is not None else (0,)):
            store = layout.parts[int(k)].store
            if part is None:
                w = (local, first, count, to)
            else:
                here = np.flatnonzero(part == k)
                w = (local[here], first[here], count[here], to[here])
            if self._gather_parts:
                store._native.gather_parts(w[0], w[1], w[2], dst, w[3], shards)
            else:
                _copy_parts(store, *w, dst)

    # -- what the datasets share ---------------------------------------------------------------

    def __getitem__(self, idx: Any) -> Any:
        """``view[j]``: row ``j`` (``seq_len`` tokens); a slice, list, array or mask: an array
        of rows."""
        one = _one_index(idx, len(self))
        if one is not None:
            return self.gather(np.array([one], dtype=np.uint64))[0]
        flat = _indices(idx, len(self))
        return self.gather(flat.reshape(-1)).reshape(flat.shape + self.item_shape)

    def __getitems__(self, idxs: Sequence[int]) -> np.ndarray:
        return self.gather(_indices(idxs, len(self)).reshape(-1))

    def subset(self, indices: Any) -> Any:
        """Rows ``indices`` as a :class:`~loaderx.subset.Subset` (its batches keep the segment
        ids and positions)."""
        from loaderx._views.subset import Subset

        return Subset(self, indices)

    def close(self) -> None:
        for p in self._layout.parts:
            p.close()

    def __enter__(self) -> PackedDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_repack, (self._docs, self._seq_len, self._method, self._seed, self._eos,
                          self._pad, self._truncate, self._repack, self._docs_len))

    def __repr__(self) -> str:
        what = (f"dropped_tokens={self.dropped_tokens}" if self._method == "concat"
                else f"padding_tokens={self.padding_tokens}, truncated={self.truncated}")
        return (f"PackedDataset({self.documents} documents -> {len(self)} rows of "
                f"{self._seq_len} {self._dtype} tokens, method={self._method!r}, {what})")


def _check_positions(lengths: np.ndarray, eos: bool) -> None:
    """Refuses a concat document whose int32 positions would wrap: more than
    ``_MAX_DOCUMENT_TOKENS`` tokens, its end token counted."""
    if not len(lengths):
        return
    longest = int(lengths.argmax())
    tokens = int(lengths[longest]) + eos
    if tokens > _MAX_DOCUMENT_TOKENS:
        raise LimitExceededError(
            f"document {longest} holds {tokens} tokens{', its end token counted' if eos else ''};"
            f" concat packs documents of at most {_MAX_DOCUMENT_TOKENS} tokens (2**31: a "
            "position inside a document is int32). Split it into documents of that size, or "
            "use method='first_fit' (which cuts a document to its row)")


def _repack(docs: Any, seq_len: int, method: Method, seed: Any, eos_id: int | None,
            pad_id: int, truncate: bool | None, repack: bool = False,
            docs_len: int | None = None) -> PackedDataset:
    if docs_len is not None:  # the documents the view was built on, not those appended since
        docs = pinned_to(docs, docs_len, "the packed view's documents")
    # Built (and warned of what it cut) where it was pickled: a worker's copy, rebuilt for
    # each job, does not warn again.
    return PackedDataset(docs, seq_len, method=method, seed=seed, eos_id=eos_id,
                         pad_id=pad_id, truncate=truncate, repack=repack, _warned=True)


def _pass_seed(seed: Any, p: int) -> int:
    """The seed of pass ``p``'s packing: a 64-bit digest of the view's seed and ``p``."""
    raw = normalize_seed(seed).to_bytes(8, "little") + p.to_bytes(16, "little")
    digest = hashlib.blake2b(raw, digest_size=8, person=b"loaderx.repack").digest()
    return int.from_bytes(digest, "little")


def _share(part: int, whole: int) -> str:
    """``part / whole`` as a percentage: one decimal, or as many digits as show it is not 0
    or 100."""
    if not whole:
        return "100%"
    f = 100 * part / whole
    if 0.1 <= f <= 99.9 or f in (0.0, 100.0):
        return f"{f:.1f}%"
    return f"{f:.2g}%" if f < 0.1 else f"{f:.4g}%"


def _copy_parts(store: Any, local: np.ndarray, first: np.ndarray, count: np.ndarray,
                to: np.ndarray, dst: np.ndarray) -> None:
    """Without ``gather_parts`` (byte ranges): every record the parts name read whole once
    (one gather), then the parts copied out of it."""
    uniq, which = np.unique(local, return_inverse=True)
    nbytes = store.lengths(uniq).astype(np.uint64)
    offsets = np.zeros(len(uniq), dtype=np.uint64)
    np.cumsum(nbytes[:-1], out=offsets[1:])
    scratch = aligned_empty(int(nbytes.sum()))
    store.gather(uniq, scratch, offsets)
    to, count = to.view(np.int64), count.view(np.int64)
    src = offsets.view(np.int64)[which] + first.view(np.int64)
    dst[_ranges(to, count)] = scratch[_ranges(src, count)]
