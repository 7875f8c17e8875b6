"""Row plans of packed sequences: which pieces of which documents make up each row.

A plan is computed once from the documents' lengths alone (no record is read) and then
answers, for any batch of row indices, the *parts* of those rows: runs of consecutive tokens of
one document, with where they go in the row. Two plans:

* :class:`ConcatPlan` (``method="concat"``): the documents in a seeded order, each followed by
  the end-of-document token when there is one, form one token stream; row ``j`` is stream
  tokens ``j * seq_len .. (j + 1) * seq_len``. The plan keeps the order (one integer per
  document) and each document's start in the stream (one int64 per document); a row's parts
  are two binary searches away.
* :class:`FirstFitPlan` (``method="first_fit"``): whole documents (truncated to ``seq_len``)
  packed into rows without ever being split, the rest of a row padding. The packing is
  best-fit decreasing -- longest documents first, each into the fullest row it still fits,
  a new row when none does -- computed on the histogram of document sizes instead of document
  by document: documents of one size are interchangeable, and so are rows with the same room
  left, so the work is a loop over the distinct sizes (at most the longest document's, never
  more than ``seq_len``) and groups of identical rows, then a few vectorised passes over the
  documents. Nothing is sized by ``seq_len`` itself: the histogram runs to the largest size a
  document takes, the rooms left are a sorted list of those that occur. Documents of one size are
  taken in a seeded order, so the seed decides which documents share a row. The plan keeps the
  rows as a CSR table: ``row_ptr`` (int64, one per row) and ``row_docs`` (one integer per
  document).

Both are pure functions of (lengths, seq_len, seed, eos) and immutable once built, so every
thread, worker process and resumed run sees the same rows.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import NamedTuple

import numpy as np

__all__ = ["ConcatPlan", "FirstFitPlan", "Parts"]

#: Documents per vectorised step of the first-fit expansion (bounds its temporary memory).
_CHUNK = 1 << 18


class Parts(NamedTuple):
    """The parts of a batch of rows, in row order and, within a row, in token order.

    ``row``: the batch row (index into the rows asked for); ``doc``: the document;
    ``doc_pos``: the position in the document of the part's first token; ``length``: tokens in
    the part (the end-of-document token included when the part ends with it); ``flat``: the
    position of the part's first token in the batch's tokens, rows back to back; ``segment``:
    1, 2, ... for the documents of a row in row order (int32); ``content``: of ``length``, how
    many tokens are the document's own (the rest, 0 or 1, is the end-of-document token);
    ``covered``: whether the parts tile the rows (no padding), back to back."""

    row: np.ndarray
    doc: np.ndarray
    doc_pos: np.ndarray
    length: np.ndarray
    flat: np.ndarray
    segment: np.ndarray
    content: np.ndarray
    covered: bool


def _index_dtype(n: int) -> type[np.unsignedinteger]:
    return np.uint32 if n < (1 << 32) else np.uint64


def _size_dtype(top: int) -> type[np.unsignedinteger]:
    """The smallest unsigned dtype the native gather takes (16, 32 or 64 bits) for sizes up to
    ``top``."""
    if top < (1 << 16):
        return np.uint16
    return np.uint32 if top < (1 << 32) else np.uint64


def _seeded_order(n: int, seed: int) -> np.ndarray:
    """A permutation of ``range(n)`` drawn from ``seed``, shuffled in place in 4 or 8 bytes
    per document (``rng.permutation`` would hold an int64 array)."""
    order = np.arange(n, dtype=_index_dtype(n))
    np.random.default_rng(seed).shuffle(order)
    return order


def _segments(row: np.ndarray) -> np.ndarray:
    """1, 2, ... within each run of equal ``row`` values (``row`` sorted)."""
    return (_rank_in_runs(row) + 1).astype(np.int32)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + c) for s, c in zip(starts, counts)])``, vectorised."""
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    ends = np.cumsum(counts)
    return np.arange(total, dtype=np.int64) + np.repeat(
        starts.astype(np.int64) - (ends - counts), counts)


class ConcatPlan:
    """Documents in a seeded order, concatenated and cut into rows (see the module docs).

    ``lengths``: tokens per document (any unsigned or non-negative integer array); ``eos``:
    whether each document is followed by one end-of-document token."""

    def __init__(self, lengths: np.ndarray, seq_len: int, seed: int, eos: bool) -> None:
        n = len(lengths)
        self.seq_len = seq_len
        self.eos = bool(eos)
        self.order = _seeded_order(n, seed)
        self.starts = np.zeros(n + 1, dtype=np.int64)
        # Each document's length (and end-of-document token) in stream order, summed into
        # its end, a chunk at a time (no array of all the lengths in that order).
        for lo in range(0, n, _CHUNK):
            hi = min(lo + _CHUNK, n)
            ends = self.starts[lo + 1:hi + 1]
            np.cumsum(lengths[self.order[lo:hi]], out=ends, dtype=np.int64)
            ends += self.starts[lo] + (np.arange(1, hi - lo + 1) if self.eos else 0)
        self.ends = self.starts[1:]
        #: Whether some document takes no token (then some parts are empty, and dropped).
        self.has_empty = not self.eos and bool(n) and int(lengths.min()) == 0
        self.total_tokens = int(self.starts[-1])
        self.rows = self.total_tokens // seq_len
        #: Tokens of the stream's tail, shorter than a row, that no row holds.
        self.dropped_tokens = self.total_tokens - self.rows * seq_len

    @property
    def nbytes(self) -> int:
        """Memory the plan keeps."""
        return self.order.nbytes + self.starts.nbytes

    def parts(self, rows: np.ndarray) -> Parts:
        """The parts of ``rows`` (uint64 row indices, each below :attr:`rows`). Written for
        batches of a few dozen rows, whose cost is the number of NumPy calls: kept small."""
        s = self.seq_len
        starts = self.starts
        lo = rows.astype(np.int64)
        lo *= s
        hi = lo + s
        first = starts.searchsorted(lo, "right")
        first -= 1
        counts = starts.searchsorted(hi, "left")
        counts -= first
        ends = counts.cumsum()
        total = int(ends[-1]) if len(ends) else 0
        local = np.arange(total, dtype=np.int64)
        local -= (ends - counts).repeat(counts)  # 0, 1, ... within each row
        k = local + first.repeat(counts)
        row_lo = lo.repeat(counts)
        begin = starts[k]
        part_lo = np.maximum(begin, row_lo)  # a row's first part may start inside its document
        end = self.ends[k]
        row_lo += s
        length = np.minimum(end, row_lo)
        length -= part_lo
        doc_pos = part_lo
        doc_pos -= begin
        content = length
        if self.eos:  # a part holds its document's end token unless the row ends first
            content = length - (end <= row_lo)
        if self.has_empty:  # empty documents hold no token of any row
            keep = length > 0
            k, doc_pos, length, content = k[keep], doc_pos[keep], length[keep], content[keep]
            row = np.arange(len(rows), dtype=np.int64).repeat(counts)[keep]
            segment = _segments(row)
        else:
            row = np.arange(len(rows), dtype=np.int64).repeat(counts)
            local += 1
            segment = local.astype(np.int32)
        flat = length.cumsum()  # the rows are full and back to back
        flat -= length
        return Parts(row, self.order[k], doc_pos, length, flat, segment, content, True)


class FirstFitPlan:
    """Whole documents packed into rows, never split (see the module docs).

    ``lengths``: tokens per document; each takes ``min(length + eos, seq_len)`` tokens of a row
    (:attr:`truncated` counts those cut); documents taking no tokens (empty, without an
    end-of-document token) are in no row."""

    def __init__(self, lengths: np.ndarray, seq_len: int, seed: int, eos: bool) -> None:
        s = seq_len
        self.seq_len = s
        self.eos = bool(eos)
        n = len(lengths)
        room = s - self.eos  # a row's room for a document's own tokens
        #: How many documents (their end-of-document token counted) were longer than a row.
        self.truncated = int(np.count_nonzero(lengths > room))
        #: The longest document (its end-of-document token counted), 0 without documents.
        self.longest = int(lengths.max()) + self.eos if n else 0
        # The largest size a document takes: the histogram (and all the plan) is sized by the
        # documents, whatever seq_len is.
        top = min(self.longest, s)
        size_dtype = _size_dtype(top)
        #: Tokens each document takes in its row.
        self.sizes = np.minimum(lengths, room).astype(size_dtype)
        #: The documents' own tokens, and how many of them the rows keep.
        self.document_tokens = int(lengths.sum(dtype=np.int64)) if n else 0
        self.kept_tokens = int(self.sizes.sum(dtype=np.int64)) if n else 0
        if self.eos:
            self.sizes += size_dtype(1)
        counts = np.bincount(self.sizes, minlength=top + 1)
        by_size = self._by_size(counts, seed)
        events = _best_fit_decreasing(counts, s)
        self.rows = events.bins
        self.row_ptr, self.row_docs = _expand(events, by_size, self.rows)
        self.placed = len(self.row_docs)
        #: Padding tokens over all rows.
        self.padding_tokens = self.rows * s - int(
            counts @ np.arange(len(counts), dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Memory the plan keeps."""
        return self.sizes.nbytes + self.row_ptr.nbytes + self.row_docs.nbytes

    def parts(self, rows: np.ndarray) -> Parts:
        """The parts of ``rows`` (uint64 row indices): one per document, each from the
        document's start (padding is no part)."""
        return _first_fit_parts(self, rows)

    def _by_size(self, counts: np.ndarray, seed: int) -> np.ndarray:
        """The documents that take tokens, longest first, in a seeded order within a size:
        a counting sort of a seeded permutation, in chunks (no int64 array of all)."""
        n = len(self.sizes)
        order = _seeded_order(n, seed)
        out = np.empty(int(n - counts[0]), dtype=order.dtype)
        # Where the next document of each size goes: sizes top, top - 1, ..., 1 one after
        # another (size 0 is left out).
        nxt = (np.cumsum(counts[::-1])[::-1] - counts).astype(np.int64)
        top = self.sizes.dtype.type(len(counts) - 1)
        for lo in range(0, n, _CHUNK):
            docs = order[lo:lo + _CHUNK]
            size = self.sizes[docs]
            taking = size > 0
            docs, size = docs[taking], size[taking]
            sort = np.argsort(top - size, kind="stable")  # a radix sort for 16-bit sizes
            size, docs = size[sort], docs[sort]
            here = np.bincount(size, minlength=len(counts))
            out[nxt[size] + _rank_in_runs(size)] = docs
            nxt += here
        return out


def _rank_in_runs(values: np.ndarray) -> np.ndarray:
    """0, 1, ... within each run of equal ``values``."""
    n = len(values)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    first = np.ones(n, dtype=bool)
    first[1:] = values[1:] != values[:-1]
    starts = np.flatnonzero(first)
    return np.arange(n, dtype=np.int64) - np.repeat(starts, np.diff(np.append(starts, n)))


class _Events(NamedTuple):
    """The placements of a best-fit-decreasing run: event ``e`` puts ``per_bin[e]`` documents
    of size ``size[e]`` into each of bins ``first_bin[e] .. first_bin[e] + bins_of[e]``, which
    held ``held[e]`` documents each before; the documents are the next ones of the size order."""

    first_bin: np.ndarray
    bins_of: np.ndarray
    per_bin: np.ndarray
    held: np.ndarray
    bins: int


def _best_fit_decreasing(counts: np.ndarray, cap: int) -> _Events:
    """Best-fit decreasing on the histogram ``counts[size]`` of item sizes ``1..len(counts) - 1``
    (each at most ``cap``) into bins of ``cap``.

    Rows with the same room left are kept together as *groups* -- runs of consecutive bin ids
    with one history (the same sizes in the same order) -- in a bucket per room left. Items of
    size ``s`` go to the fullest rows they fit: the buckets of room ``r >= s`` from the
    smallest up, each row of a bucket taking ``r // s`` of them (best fit puts the next item
    into the same row while it fits, that row being the fullest then), then new rows of
    ``cap // s`` each. A group is split when a size runs out within it. The rooms that have a
    bucket are a sorted list (at most one entry per group, never one per unit of ``cap``)."""
    buckets: dict[int, list[list[int]]] = {}  # room -> groups [first_bin, bins, held]
    rooms: list[int] = []  # the rooms with a bucket, ascending
    log: list[tuple[int, int, int, int]] = []
    next_bin = 0

    def put(room: int, group: list[int]) -> None:
        if room == 0:
            return  # a full row takes nothing more
        bucket = buckets.get(room)
        if bucket is None:
            buckets[room] = [group]
            insort(rooms, room)
        else:
            bucket.append(group)

    for s in np.flatnonzero(counts[1:])[::-1] + 1:
        s = int(s)
        left = int(counts[s])
        while left:
            at = bisect_left(rooms, s)
            if at == len(rooms):
                break
            room = rooms[at]  # the fullest rows the items fit
            q = room // s
            groups = buckets[room]
            while groups and left:
                first, nb, held = groups[-1]
                take = min(nb, left // q)
                if take:
                    log.append((first, take, q, held))
                    left -= take * q
                    if take == nb:
                        groups.pop()
                    else:
                        groups[-1] = [first + take, nb - take, held]
                    put(room - q * s, [first, take, held + q])
                    continue
                # Fewer than q items left: they fill one row of this group part way.
                log.append((first, 1, left, held))
                if nb == 1:
                    groups.pop()
                else:
                    groups[-1] = [first + 1, nb - 1, held]
                put(room - left * s, [first, 1, held + left])
                left = 0
            if not groups:
                del buckets[room]
                del rooms[bisect_left(rooms, room)]
        if left:
            q = cap // s
            full, rest = divmod(left, q)
            if full:
                log.append((next_bin, full, q, 0))
                put(cap - q * s, [next_bin, full, q])
                next_bin += full
            if rest:
                log.append((next_bin, 1, rest, 0))
                put(cap - rest * s, [next_bin, 1, rest])
                next_bin += 1
    table = np.array(log, dtype=np.int64).reshape(-1, 4)
    return _Events(table[:, 0], table[:, 1], table[:, 2], table[:, 3], next_bin)


def _expand(events: _Events, by_size: np.ndarray,
            bins: int) -> tuple[np.ndarray, np.ndarray]:
    """The CSR table of the rows: ``row_ptr`` (int64, ``bins + 1``) and ``row_docs`` (each
    row's documents in the order they were placed), from the events and the size order."""
    first, nb, per, held = events.first_bin, events.bins_of, events.per_bin, events.held
    # Documents per row from a difference array (each event adds `per` to a run of rows),
    # summed twice in place into the row pointers: one array of bins + 2.
    row_ptr = np.zeros(bins + 2, dtype=np.int64)
    np.add.at(row_ptr, first + 1, per)
    np.add.at(row_ptr, first + nb + 1, -per)
    np.cumsum(row_ptr, out=row_ptr)
    np.cumsum(row_ptr, out=row_ptr)
    row_ptr = row_ptr[:bins + 1]
    placed = len(by_size)
    row_docs = np.empty(placed, dtype=by_size.dtype)
    event_start = np.zeros(len(first) + 1, dtype=np.int64)
    np.cumsum(nb * per, out=event_start[1:])
    # The documents are consumed in size order, event after event: document g of the size
    # order is item t = g - event_start[e] of its event e, in bin first + t // per, after the
    # held + t % per documents placed there before it.
    for lo in range(0, placed, _CHUNK):
        hi = min(lo + _CHUNK, placed)
        e0 = int(np.searchsorted(event_start, lo, side="right")) - 1
        e1 = int(np.searchsorted(event_start, hi, side="left"))
        here = (np.minimum(event_start[e0 + 1:e1 + 1], hi)
                - np.maximum(event_start[e0:e1], lo))
        e = np.repeat(np.arange(e0, e1), here)
        t = np.arange(lo, hi, dtype=np.int64)
        t -= event_start[e]
        q = per[e]
        b = t // q
        t -= b * q
        b += first[e]
        t += held[e]
        t += row_ptr[b]
        row_docs[t] = by_size[lo:hi]
    return row_ptr, row_docs


def _first_fit_parts(plan: FirstFitPlan, rows: np.ndarray) -> Parts:
    s = plan.seq_len
    starts = plan.row_ptr[rows]
    counts = plan.row_ptr[rows.astype(np.int64) + 1]
    counts -= starts
    ends = counts.cumsum()
    total = int(ends[-1]) if len(ends) else 0
    head = ends - counts
    local = np.arange(total, dtype=np.int64)
    local -= head.repeat(counts)
    doc = plan.row_docs[local + starts.repeat(counts)]
    length = plan.sizes[doc].astype(np.int64)
    # Each part starts where the row's earlier parts end.
    flat = length.cumsum()
    flat -= length
    row = np.arange(len(rows), dtype=np.int64).repeat(counts)
    flat += (row * s - flat[head].repeat(counts)) if total else 0
    local += 1
    return Parts(row, doc, np.zeros(total, dtype=np.int64), length, flat,
                 local.astype(np.int32), length - plan.eos if plan.eos else length, False)
