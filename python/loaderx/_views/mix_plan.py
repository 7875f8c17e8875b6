"""The mixed order of :func:`loaderx.mix`: which source, and which of its draws, each position is.

A mixture's position ``n`` (0, 1, 2, ...) is one draw from one source. This module computes, for
any array of positions and without any state, the source of each and its *draw number* (how
many earlier positions drew from the same source); :mod:`loaderx.mixture` turns a draw number
into a record through the source's per-pass permutation (:func:`permute`).

The order: tables of earliest deadlines
---------------------------------------
Weights are integers ``a_i`` over a period ``q = sum(a)`` (the requested weights when they are
such ratios with ``q <= 2**20``, else their rounding for the ``q <= 65536`` that fits them best,
see :func:`quantize`). Source ``i``'s ``j``-th
draw (``j = 1, 2, ...``) has a *window* of positions: it may not come before position
``floor((j - 1) q / a_i)`` (else some prefix would hold more than ``ceil(a_i n / q)``) and must
come by ``ceil(j q / a_i) - 1`` (else a prefix would hold fewer than ``floor(a_i n / q)``). A
:class:`Table` places the ``q`` draws of one period by *earliest deadline first*: position ``t``
takes, among the draws whose window has opened and that are not placed yet, the one whose window
closes first. Tijdeman's theorem (the chairman assignment problem, 1980) says some order meets
every window -- every prefix within ``1 - 1/(2K - 2)`` of its share -- and earliest deadline
first meets every deadline whenever any order does (unit jobs on one machine), so the table
meets them all; the table is checked against every window when it is built anyway. A period
ends with exactly ``a_i`` draws of each source, so the next period starts exact and repeats the
table: for every ``n``, source ``i``'s count among the first ``n`` positions is
``floor(a_i n / q)`` or ``ceil(a_i n / q)`` -- within one record of ``weight * n``. A position's
source and draw number are one lookup: ``n // q`` periods of ``a_i`` draws, then the table at
``n % q``. Memory: the table, 3 to 5 bytes a position of one period, and ``O(K)`` beside it;
nothing the size of the run.

(Cumulative rounding -- source ``j`` gets ``round(P_j n) - round(P_{j-1} n)`` for the
cumulative weights ``P`` -- keeps every count within one too, but a count can *fall* from
``n`` to ``n + 1`` -- weights ``(0.5, 0.01, 0.49)`` at ``n = 50`` -- so it is not the counts of an
order; nor is a tree of two-way splits within one in general: its errors add up the levels.)

Schedules
---------
A schedule is a list of *pieces* (:class:`Piece`): a stretch of positions with one table, or a
linear transition from one table to another. In a transition of ``L`` positions the second
mixture's share grows linearly from 0 to 1: of its first ``t`` positions,
``round(t^2 / 2L)`` draw from the second table and the rest from the first, each table in its
own order; a source's count is then within ``2.5`` records of its target there (each table's
error below one, plus half a record of the split). Pieces start where the schedule's tables are
exact (periods and transitions of an even number of whole periods), so no error carries from
one piece to the next; where a schedule does not allow that (see :func:`schedule_period`) the
pieces still follow one another exactly, each from the counts its predecessor ended with.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

from loaderx.errors import LoaderxValueError

__all__ = ["MIX_LENGTH", "Q_MAX", "Q_EXACT", "MAX_TRANSITION", "Table", "Piece", "MixPlan",
           "quantize", "schedule_period", "permute", "draw_keys", "radix", "source_bases",
           "build_pieces", "small_orders", "SMALL"]

#: The positions of a mixture: ``len()`` of the endless stream (the largest Python length).
MIX_LENGTH = (1 << 63) - 1

#: The longest period of weights kept exactly (ratios such as decimals of up to 5 digits).
Q_EXACT = 1 << 20

#: The longest period of rounded weights: weights that are not ratios of a period of at most
#: ``Q_EXACT`` are rounded to multiples of ``1 / q`` for the ``q`` of at most ``Q_MAX`` (and
#: at least half of it) that rounds them closest.
Q_MAX = 1 << 16

#: The longest linear transition, in positions (its split is exact integer arithmetic to there).
MAX_TRANSITION = 1 << 40

#: A table keeps each source's count every this many positions (for counts inside a period).
_CK = 64

#: ... and every prefix's counts when they are at most this many numbers.
_FULL_PREFIX = 1 << 16

_U64 = np.uint64


# -- weights ---------------------------------------------------------------------------------


def quantize(weights: Sequence[float], divides: int | None = None) -> tuple[np.ndarray, bool]:
    """Integer weights ``a`` (``int64``, summing to the period ``q``) for the non-negative
    ``weights``: exact when they are ratios of integers with a period of at most
    :data:`Q_EXACT` (that divides ``divides``, when given), else the largest-remainder
    rounding for the period that rounds them closest (of at most :data:`Q_MAX`; one dividing
    ``divides``, when given). Returns ``(a, exact)``. A positive weight that rounds to 0 is
    the caller's to refuse (``a[i] == 0``)."""
    whole = all(isinstance(x, int) for x in weights)
    w = [Fraction(x) if isinstance(x, int) else Fraction(float(x)) for x in weights]
    total = sum(w)
    p = [x / total for x in w]
    # Integers are ratios as they are; floats that are ratios of small integers to within
    # their own precision (0.7, 0.2, 0.1) are taken for those ratios.
    near = [x.limit_denominator(Q_EXACT) for x in p]
    tolerance = 0.0 if whole else 4e-16
    if all(abs(float(a - b)) <= tolerance * float(b) for a, b in zip(near, p, strict=True)):
        q = math.lcm(*(x.denominator for x in near))
        if sum(near) == 1 and q <= Q_EXACT and (divides is None or divides % q == 0):
            return np.array([int(x * q) for x in near], dtype=np.int64), True
    if divides is None:
        periods = np.arange(Q_MAX // 2, Q_MAX + 1, dtype=np.int64)
    else:
        periods = np.array([_largest_divisor(divides, Q_MAX)], dtype=np.int64)
    share = np.array([float(x) for x in p])
    raw = periods[:, None] * share[None, :]
    a = np.floor(raw).astype(np.int64)
    short = periods - a.sum(axis=1)
    rank = np.argsort(np.argsort(-(raw - a), axis=1, kind="stable"), axis=1, kind="stable")
    a += rank < short[:, None]
    # The period whose rounding is closest, relative to each weight (positive weights kept).
    error = np.abs(a / periods[:, None] - share[None, :]) / np.where(share > 0, share, 1)
    error[((a == 0) & (share > 0)).any(axis=1)] = np.inf
    best = int(np.argmin(error.max(axis=1)))
    out = a[best]
    q = int(periods[best])
    return out, all(Fraction(int(n), q) == x for n, x in zip(out, p, strict=True))


def _largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of ``n`` (> 0) that is at most ``limit``."""
    factors: list[int] = []
    m = n
    f = 2
    while f * f <= m and f <= limit:
        while m % f == 0:
            factors.append(f)
            m //= f
        f += 1
    if 1 < m <= limit:
        factors.append(m)
    divisors = {1}
    for f in factors:
        divisors |= {d * f for d in divisors if d * f <= limit}
    return max(divisors)


def schedule_period(rows: Sequence[int], linear: bool) -> int | None:
    """What a schedule's periods must divide so that every piece starts exact: the gcd of the
    milestones' first rows and (linear transitions) of half of each transition's length; None
    when there is no milestone after the first (then the period is free)."""
    g = 0
    for k, r in enumerate(rows):
        if k:
            g = math.gcd(g, r)
            if linear:
                length = r - rows[k - 1]
                g = math.gcd(g, length // 2 if length % 2 == 0 else length)
    return g or None


# -- tables ----------------------------------------------------------------------------------


def _earliest_deadline(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One period of the order of integer weights ``a``: each position's source and its draw
    within the period (see the module docs)."""
    q = int(a.sum())
    k = len(a)
    src_of = np.repeat(np.arange(k, dtype=np.int64), a)
    j = np.arange(q, dtype=np.int64) - np.repeat(np.cumsum(a) - a, a) + 1  # 1-based draw
    aa = a[src_of]
    release = (j - 1) * q // aa
    deadline = (j * q + aa - 1) // aa - 1
    # Merging by deadline meets every window when no release binds (every weight at most
    # 1/K of the total does so): one sort.
    order = np.lexsort((src_of, release, deadline))
    at = np.arange(q, dtype=np.int64)
    if (release[order] <= at).all() and (deadline[order] >= at).all():
        return src_of[order], j[order] - 1
    src = np.empty(q, dtype=np.int64)
    draw = np.empty(q, dtype=np.int64)
    weights = [int(x) for x in a]
    nxt = [1] * k
    pending = [((q + w - 1) // w - 1, i) for i, w in enumerate(weights) if w]
    heapq.heapify(pending)
    waiting: list[tuple[int, int]] = []
    for t in range(q):
        while waiting and waiting[0][0] <= t:
            _, i = heapq.heappop(waiting)
            w = weights[i]
            heapq.heappush(pending, ((nxt[i] * q + w - 1) // w - 1, i))
        d, i = heapq.heappop(pending)
        if d < t:  # cannot happen (see the module docs); the check below would say so too
            raise AssertionError(f"the mixed order missed a deadline at {t} of {q}")
        src[t] = i
        draw[t] = nxt[i] - 1
        nxt[i] += 1
        w = weights[i]
        if nxt[i] <= w:
            heapq.heappush(waiting, ((nxt[i] - 1) * q // w, i))
    return src, draw


class Table:
    """One period of the mixed order of integer weights ``a`` (see the module docs): ``src``
    and ``draw`` per position of the period, and each source's count every :data:`_CK`
    positions. Immutable once built; shared by threads."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = np.ascontiguousarray(a, dtype=np.int64)
        self.q = int(self.a.sum())
        self.k = len(self.a)
        src, draw = _earliest_deadline(self.a)
        _check_windows(self.a, src)
        small = np.uint8 if self.k < 256 else np.uint16
        self.src = src.astype(small)
        self.draw = draw.astype(np.uint16 if self.q <= 1 << 16 else np.uint32)
        blocks = self.q // _CK + 1
        counts = np.bincount((np.arange(self.q) // _CK) * self.k + src,
                             minlength=blocks * self.k).reshape(blocks, self.k)
        self.ck = np.zeros((blocks + 1, self.k), dtype=np.int64)
        np.cumsum(counts, axis=0, out=self.ck[1:])
        # The sources padded by a block, so that a window of _CK positions never runs out.
        self.src_pad = np.concatenate([self.src, np.full(_CK, self.k, dtype=small)])
        # Small tables keep every prefix's counts: a count is then one lookup.
        self.prefix: np.ndarray | None = None
        if (self.q + 1) * self.k <= _FULL_PREFIX:
            self.prefix = np.zeros((self.q + 1, self.k), dtype=np.int64)
            np.cumsum(np.eye(self.k, dtype=np.int64)[src], axis=0, out=self.prefix[1:])
            self.prefix.setflags(write=False)
        for arr in (self.src, self.draw, self.ck, self.src_pad, self.a):
            arr.setflags(write=False)
        self.a_list: list[int] = self.a.tolist()

    @property
    def nbytes(self) -> int:
        extra = 0 if self.prefix is None else self.prefix.nbytes
        return self.src.nbytes + self.draw.nbytes + self.ck.nbytes + self.src_pad.nbytes + extra

    def at(self, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The source of draw ``m`` (int64, >= 0) of this order and how many draws of that
        source come before it."""
        full, o = np.divmod(m, self.q)
        s = self.src_pad[o]
        full *= self.a[s]
        full += self.draw[o]
        return s, full

    def counts_at(self, s: np.ndarray, m: np.ndarray) -> np.ndarray:
        """How many of the first ``m`` draws (int64 arrays) are source ``s``'s."""
        o = m % self.q
        b = o // _CK
        out = (m // self.q) * self.a[s] + self.ck[b, s]
        start = b * _CK
        window = start[:, None] + np.arange(_CK)
        hit = (self.src_pad[window] == s[:, None]) & (window < o[:, None])
        out += hit.sum(axis=1)
        return out

    def counts(self, m: int) -> np.ndarray:
        """Every source's count among the first ``m`` draws (``(K,)`` int64)."""
        full, o = divmod(int(m), self.q)
        if self.prefix is not None:
            return full * self.a + self.prefix[o]
        b = o // _CK
        part = np.bincount(self.src[b * _CK:o], minlength=self.k).astype(np.int64)
        return full * self.a + self.ck[b] + part


def _check_windows(a: np.ndarray, src: np.ndarray) -> None:
    """Refuses (AssertionError) an order whose prefix counts leave a window: some source's
    count among the first ``n`` is not ``floor`` or ``ceil`` of ``a_i n / q``."""
    q = int(a.sum())
    n = np.arange(q + 1, dtype=np.int64)
    for i, w in enumerate(a.tolist()):
        c = np.zeros(q + 1, dtype=np.int64)
        np.cumsum(src == i, out=c[1:])
        if ((c + 1) * q <= w * n).any() or ((c - 1) * q >= w * n).any() or c[-1] != w:
            raise AssertionError(f"the mixed order of weights {a.tolist()} leaves a window")


# -- pieces ----------------------------------------------------------------------------------


class Piece(NamedTuple):
    """A stretch of the mixed order: ``length`` positions (None: endless) from ``start`` with
    the table ``x``, or -- ``y`` given -- a linear transition from ``x`` to ``y``; ``c0``: each
    source's draws before ``start`` (int64)."""

    start: int
    length: int | None
    x: Table
    y: Table | None
    c0: np.ndarray


def _second_share(t: np.ndarray, length: int) -> np.ndarray:
    """``floor((t^2 + L) / 2L)`` (int64, exact for ``0 <= t <= L <= MAX_TRANSITION``): how
    many of a transition's first ``t`` positions draw from its second table."""
    t = t.astype(np.int64)
    two = 2 * length
    tf = t.astype(np.float64)
    out = np.floor((tf * tf + length) / two).astype(np.int64)
    # The float is off by at most a unit here; the residual, exact in wrapping 64-bit
    # arithmetic, says which way.
    with np.errstate(over="ignore"):
        tu = t.astype(_U64)
        for _ in range(3):
            rest = (tu * tu + _U64(length) - out.astype(_U64) * _U64(two)).view(np.int64)
            low, high = rest < 0, rest >= two
            if not (low.any() or high.any()):
                break
            out -= low
            out += high
    return out


class MixPlan:
    """The mixed order: ``pieces`` in position order (the last one endless), for ``k``
    sources. :meth:`locate` gives each position's source and draw number."""

    def __init__(self, pieces: list[Piece], k: int) -> None:
        self.pieces = pieces
        self.k = k
        self.starts = np.array([p.start for p in pieces], dtype=np.int64)
        self.last = pieces[-1]

    @property
    def nbytes(self) -> int:
        tables = {id(t): t for p in self.pieces for t in (p.x, p.y) if t is not None}
        return sum(t.nbytes for t in tables.values()) + sum(p.c0.nbytes for p in self.pieces)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each position's source and its draw number (int64 arrays)."""
        pos = positions if positions.dtype == np.int64 else positions.astype(np.int64)
        if not len(pos):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        if len(self.pieces) == 1 or int(pos.min()) >= self.last.start:
            return self._piece(self.last, pos)
        which = np.searchsorted(self.starts, pos, side="right") - 1
        src = np.empty(len(pos), dtype=np.int64)
        draw = np.empty(len(pos), dtype=np.int64)
        for k in np.unique(which):
            here = which == k
            src[here], draw[here] = self._piece(self.pieces[int(k)], pos[here])
        return src, draw

    def _piece(self, p: Piece, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = pos - p.start if p.start else pos
        if p.y is None:
            s, d = p.x.at(t)
            if p.start:
                d += p.c0[s]
            return s, d
        n = p.length
        assert n is not None
        second0 = _second_share(t, n)
        is_second = _second_share(t + 1, n) > second0
        first0 = t - second0
        src = np.empty(len(t), dtype=np.int64)
        draw = np.empty(len(t), dtype=np.int64)
        if is_second.any():
            s, d = p.y.at(second0[is_second])
            src[is_second] = s
            draw[is_second] = d + p.x.counts_at(s, first0[is_second])
        first = ~is_second
        if first.any():
            s, d = p.x.at(first0[first])
            src[first] = s
            draw[first] = d + p.y.counts_at(s, second0[first])
        draw += p.c0[src]
        return src, draw

    def counts(self, n: int) -> np.ndarray:
        """Every source's count among the first ``n`` positions (``(K,)`` int64)."""
        if len(self.pieces) == 1:
            return self.last.x.counts(n)
        k = int(np.searchsorted(self.starts, n, side="right")) - 1
        return _piece_counts(self.pieces[k], n - self.pieces[k].start)

    def counts_list(self, n: int) -> list[int]:
        """:meth:`counts` as Python integers: what a loader's batch asks for twice, in
        Python arithmetic for one table that keeps every prefix (array calls cost more there
        than the numbers)."""
        x = self.last.x
        if len(self.pieces) == 1 and x.prefix is not None:
            full, o = divmod(n, x.q)
            return [full * a + c for a, c in zip(x.a_list, x.prefix[o].tolist(), strict=True)]
        return self.counts(n).tolist()

    def target(self, n: int) -> np.ndarray:
        """What :meth:`counts` is held to: the pieces' weights summed over the first ``n``
        positions (``(K,)`` float): within one record of the counts in a piece of one table,
        within 2.5 in a transition."""
        k = int(np.searchsorted(self.starts, n, side="right")) - 1
        p = self.pieces[k]
        t = n - p.start
        if p.y is None:
            return p.c0 + p.x.a * (t / p.x.q)
        assert p.length is not None
        second = t * t / (2 * p.length)
        return p.c0 + p.x.a * ((t - second) / p.x.q) + p.y.a * (second / p.y.q)

    def weights_at(self, n: int) -> np.ndarray:
        """The weights in force at position ``n`` (``(K,)`` float, summing to 1)."""
        k = int(np.searchsorted(self.starts, n, side="right")) - 1
        p = self.pieces[k]
        wx = p.x.a / p.x.q
        if p.y is None:
            return wx
        assert p.length is not None
        share = (n - p.start) / p.length
        return wx * (1 - share) + (p.y.a / p.y.q) * share


def _piece_counts(p: Piece, t: int) -> np.ndarray:
    if p.y is None:
        return p.c0 + p.x.counts(t)
    assert p.length is not None
    second = int(_second_share(np.array([t]), p.length)[0])
    return p.c0 + p.x.counts(t - second) + p.y.counts(second)


def build_pieces(rows: Sequence[int], tables: Sequence[Table], linear: bool) -> list[Piece]:
    """The pieces of a schedule whose milestone ``k`` starts at position ``rows[k]`` (``rows[0]
    == 0``) with the order ``tables[k]``: held until the next milestone, or (``linear``)
    moving to the next one's over the positions between; the last one endless."""
    k = tables[0].k
    pieces: list[Piece] = []
    c0 = np.zeros(k, dtype=np.int64)
    for i, (start, table) in enumerate(zip(rows, tables, strict=True)):
        last = i == len(rows) - 1
        length = None if last else rows[i + 1] - start
        following = None if last or not linear else tables[i + 1]
        if following is not None and following.a.tolist() == table.a.tolist():
            following = None  # a transition between equal weights is one table
        if following is not None and length is not None and length > MAX_TRANSITION:
            raise LoaderxValueError(
                f"a transition of {length} positions is longer than {MAX_TRANSITION}; "
                "use shorter transitions between milestones (or transition='step')")
        piece = Piece(start, length, table, following, c0.copy())
        piece.c0.setflags(write=False)
        pieces.append(piece)
        if length is not None:
            c0 = _piece_counts(piece, length)
    return pieces


# -- per-pass permutations -------------------------------------------------------------------


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, elementwise on uint64 (wrapping)."""
    x = x ^ (x >> _U64(30))
    x = x * _U64(0xBF58476D1CE4E5B9)
    x ^= x >> _U64(27)
    x *= _U64(0x94D049BB133111EB)
    x ^= x >> _U64(31)
    return x


def source_bases(seed_key: int, k: int) -> np.ndarray:
    """Each source's key (uint64) under the mixture's seed."""
    s = np.arange(1, k + 1, dtype=_U64) * _U64(0x9E3779B97F4A7C15)
    return _mix64(_mix64(s) ^ np.full(k, seed_key, dtype=_U64))


def draw_keys(bases: np.ndarray, src: np.ndarray, passes: np.ndarray) -> np.ndarray:
    """The permutation key of each draw: its source's key and the pass over that source (array
    arithmetic on uint64 wraps without a warning)."""
    key = passes.astype(_U64)
    key *= _U64(0xD6E8FEB86659FD93)
    key ^= bases[src]
    return key


def radix(n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two digits' ranges ``A, B`` of each length's permutation domain ``[0, A*B)``: near
    ``sqrt(n)`` each (within a factor of 2), with as few points past ``n`` as found (few
    permutations walk past ``n`` then)."""
    out_a, out_b = [], []
    for length in np.asarray(n, dtype=np.int64).reshape(-1).tolist():
        root = math.isqrt(max(length, 1))
        best = (root + 1) * (root + 1) - length, root + 1
        for a in range(max(1, root // 2), 2 * root + 2):
            waste = a * -(-length // a) - length
            if waste < best[0] or (waste == best[0] and abs(a - root) < abs(best[1] - root)):
                best = waste, a
            if best[0] == 0 and a > root:
                break
        a = best[1]
        out_a.append(a)
        out_b.append(-(-length // a))
    return np.array(out_a, dtype=_U64), np.array(out_b, dtype=_U64)


_ROUND = [_U64(c) for c in (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                            0x27D4EB2F165667C5)]


_SHIFT = _U64(29)


def _feistel(x: np.ndarray, a: np.ndarray, b: np.ndarray, key: np.ndarray) -> np.ndarray:
    """A keyed bijection of ``[0, a*b)`` (elementwise): four rounds of a Feistel network on
    the digits ``(x // b, x % b)``, each adding a hash of the other digit modulo its range.
    In place on temporaries: a batch's cost is the number of NumPy calls."""
    hi, lo = np.divmod(x, b)
    t = np.empty_like(lo)
    for r, c in enumerate(_ROUND):
        this, other, modulus = (hi, lo, a) if r % 2 == 0 else (lo, hi, b)
        np.bitwise_xor(other, key, out=t)
        np.multiply(t, c, out=t)
        np.right_shift(t, _SHIFT, out=t)
        np.add(this, t, out=this)
        np.remainder(this, modulus, out=this)
    np.multiply(hi, b, out=hi)
    hi += lo
    return hi


#: Sources of at most this many records are permuted by sorting hashes (a Feistel network on
#: two digits of so few values would make few distinct orders).
SMALL = 64


def small_orders(keys: np.ndarray, n: int) -> np.ndarray:
    """The permutation of ``range(n)`` (``n <= SMALL``) of each key: ``range(n)`` sorted by a
    keyed hash of each element, one row per key (uint64, ``(len(keys), n)``)."""
    h = _mix64(keys.astype(_U64)[:, None] ^ (np.arange(1, n + 1, dtype=_U64)
                                             * _U64(0x9E3779B97F4A7C15))[None, :])
    return np.argsort(h, axis=1, kind="stable").astype(_U64)


def permute(k: np.ndarray, n: Any, a: Any, b: Any, key: np.ndarray) -> np.ndarray:
    """Element ``k`` of the keyed permutation of ``range(n)`` (uint64, elementwise; ``n, a,
    b`` arrays or one uint64 for all, ``a, b`` from :func:`radix`): the Feistel bijection of
    ``[0, a*b)``, walked until it lands in ``range(n)`` (rarely twice: ``a*b - n < a``). One
    ``n`` for all is much faster (NumPy divides by one number with shifts)."""
    y = _feistel(k, a, b, key)
    out = y >= n
    if out.any():
        todo = np.flatnonzero(out)
        one = np.ndim(n) == 0
        while len(todo):
            z = _feistel(y[todo], a if one else a[todo], b if one else b[todo], key[todo])
            y[todo] = z
            todo = todo[z >= (n if one else n[todo])]
    return y
