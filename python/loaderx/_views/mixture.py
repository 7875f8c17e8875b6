"""The implementation behind :mod:`loaderx.mixture`, the public module, whose documentation
says what this does and why."""

from __future__ import annotations

import hashlib
import math
import numbers
import os
import threading
import uuid
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Literal, overload

import numpy as np

from loaderx import _native
from loaderx._views.concat import check_class_maps, class_names_of
from loaderx._views.dataset import pinned_to
from loaderx._views.gather import _indices, _one_index, _ragged_layout, _ragged_views
from loaderx._views.mix_plan import (
    MAX_TRANSITION,
    MIX_LENGTH,
    SMALL,
    MixPlan,
    Table,
    build_pieces,
    draw_keys,
    permute,
    quantize,
    radix,
    schedule_period,
    small_orders,
    source_bases,
)
from loaderx._views.source import is_dense_source, is_ragged_source
from loaderx.errors import (
    LimitExceededError,
    LoaderxIndexError,
    LoaderxTypeError,
    LoaderxValueError,
)
from loaderx.sampler import Mode, _integer, normalize_seed

__all__ = ["mix", "Mixture", "ordered_streams", "MIX_LENGTH", "MAX_SOURCES"]

#: Most sources one mixture takes (a source's number is 16 bits in its tables).
MAX_SOURCES = 0xFFFF

Transition = Literal["linear", "step"]

_U64 = np.dtype(np.uint64)
_I64 = np.dtype(np.int64)
#: Pass views of a source that re-packs per pass kept at once (the pass being read, the next).
_KEPT_PASSES = 2
#: Mixtures built in this process, by token: the streams of one dict mixture unpickled in a
#: worker share one order again.
_CORES: weakref.WeakValueDictionary[str, _Core] = weakref.WeakValueDictionary()
_CORES_LOCK = threading.Lock()


# -- what was given ----------------------------------------------------------------------------


def _where(i: int, ds: Any) -> str:
    path = getattr(ds, "path", None)
    return f"source {i} ({path})" if isinstance(path, str) and path else \
        f"source {i} ({type(ds).__name__})"


def _check_stream(i: int, name: str | None, ds: Any) -> None:
    what = _where(i, ds) + (f", stream {name!r}" if name else "")
    if isinstance(ds, (str, os.PathLike)):
        raise LoaderxTypeError(f"{what} is a path; open it first: DenseDataset(path), "
                               "RaggedDataset(path) or loaderx.pack(RaggedDataset(path), ...)")
    if isinstance(ds, Mixture):
        raise LoaderxTypeError(f"{what} is itself a mixture; mix the sources directly (weights "
                               "multiply: mix([a, b, c], [w * u, w * v, x]))")
    if not (is_dense_source(ds) or is_ragged_source(ds)):
        raise LoaderxTypeError(f"{what} is a {type(ds).__name__}; a source is a DenseDataset or "
                               "RaggedDataset, a ConcatDataset, Subset or packed view of one, or "
                               "a dict of such aligned streams")
    if len(ds) == 0:
        raise LoaderxValueError(f"{what} is empty (0 records); leave it out or give it records")


def _schema(ds: Any) -> tuple[Any, ...]:
    names = tuple(ds.companion_names("x")) if callable(getattr(ds, "companion_names", None)) \
        else ()
    return (ds.kind, np.dtype(ds.dtype), tuple(ds.item_shape), names)


def _check_alike(i: int, name: str | None, ds: Any, first: Any) -> None:
    what = _where(i, ds) + (f", stream {name!r}" if name else "")
    there = _where(0, first)
    if ds.kind != first.kind:
        raise LoaderxTypeError(f"{what} is {ds.kind}, {there} {first.kind}; a mixture's sources "
                               "are of one kind (all dense, all ragged, or all packed)")
    s, f = getattr(ds, "seq_len", None), getattr(first, "seq_len", None)
    if s is not None and f is not None and s != f:
        raise LoaderxValueError(f"{what} packs rows of {s} tokens, {there} of {f}; pack every "
                                "source with one seq_len")
    if (np.dtype(ds.dtype), tuple(ds.item_shape)) != (np.dtype(first.dtype),
                                                       tuple(first.item_shape)):
        raise LoaderxValueError(
            f"{what} holds {np.dtype(ds.dtype)}{tuple(ds.item_shape)} records, {there} "
            f"{np.dtype(first.dtype)}{tuple(first.item_shape)}; a mixture's sources hold one "
            "dtype and item shape (cast or reshape when converting)")
    if _schema(ds)[3] != _schema(first)[3]:
        raise LoaderxValueError(
            f"{what} adds the arrays {list(_schema(ds)[3])} to a batch, {there} "
            f"{list(_schema(first)[3])}; mix sources of one kind (packed views with packed "
            "views, plain datasets with plain datasets)")


def _weights(value: Any, k: int, what: str) -> list[int | float]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (Sequence, np.ndarray)):
        raise LoaderxTypeError(f"{what} must be a list of {k} numbers, one per source, got "
                               f"{type(value).__name__}")
    vals = list(value)
    if len(vals) != k:
        raise LoaderxValueError(f"{what} has {len(vals)} weight{'s' * (len(vals) != 1)} for {k} "
                                f"source{'s' * (k != 1)}; give one per source, in their order")
    out: list[int | float] = []
    for i, w in enumerate(vals):
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Real):
            raise LoaderxTypeError(f"{what}: the weight of source {i} is {w!r}, not a number")
        v: int | float = int(w) if isinstance(w, numbers.Integral) else float(w)
        if isinstance(v, float) and not math.isfinite(v):
            raise LoaderxValueError(f"{what}: the weight of source {i} is {v}; weights are "
                                    "finite numbers")
        if v < 0:
            raise LoaderxValueError(f"{what}: the weight of source {i} is {v}; weights are 0 or "
                                    "positive (0 leaves the source out)")
        out.append(v)
    if not any(out):
        raise LoaderxValueError(f"{what}: every weight is 0; give some source a positive weight")
    return out


def _table(w: list[int | float], divides: int | None, what: str,
           tables: dict[tuple[int, ...], Table]) -> Table:
    a, exact = quantize(w, divides)
    total = float(sum(w))
    for i, (x, n) in enumerate(zip(w, a.tolist(), strict=True)):
        if x > 0 and n == 0:
            if divides is not None and divides < 1 / (x / total):
                # The schedule's milestones bound the period: they are the cause.
                raise LoaderxValueError(
                    f"{what}: source {i}'s weight is {x / total:.3g} of the total, but the "
                    f"schedule's milestones allow an order of at most {divides} rows (every "
                    "milestone's row, step x batch_size -- and half of each linear "
                    f"transition -- must be a multiple of it), so it gets no row: place the "
                    f"milestones at steps whose rows share a larger factor (at least "
                    f"{math.ceil(total / x)} rows), or raise the weight")
            raise LoaderxValueError(
                f"{what}: source {i}'s weight is {x / total:.3g} of the total, below the "
                f"1/{int(a.sum())} this mixture resolves; raise it or leave the source out")
    if not exact:
        worst = max(abs(n / a.sum() - x / total) / (x / total)
                    for x, n in zip(w, a.tolist(), strict=True) if x > 0)
        if worst > 0.01:
            warnings.warn(f"{what}: weights rounded to multiples of 1/{int(a.sum())} (the "
                          f"longest period that divides the schedule's milestones' rows), "
                          f"{worst:.1%} off for one source; put the milestones at steps whose "
                          "rows (step * batch_size) share more factors", stacklevel=4)
    key = tuple(a.tolist())
    table = tables.get(key)
    if table is None:
        table = tables[key] = Table(a)
    return table


# -- the order ---------------------------------------------------------------------------------


class _Resolved:
    """One batch's positions resolved, its rows grouped by source (each source's rows in their
    mixed order): ``groups`` are ``(source, pass, lo, hi, records)`` for the rows ``[lo, hi)``
    of each (source, pass) -- of a run, made when first asked for (``run``: the core and each
    source's draws before the run); ``take`` each source's row count; ``src`` and ``records``
    per row on demand."""

    __slots__ = ("_groups", "take", "_src", "_records", "_src32", "_run")

    def __init__(self, groups: list[tuple[int, int, int, int, np.ndarray]] | None,
                 take: list[int], src: np.ndarray | None = None,
                 records: np.ndarray | None = None, run: tuple[Any, list[int]] | None = None,
                 src32: np.ndarray | None = None) -> None:
        self._groups = groups
        self.take = take
        self._src = src
        self._records = records
        self._src32 = src32
        self._run = run

    @property
    def groups(self) -> list[tuple[int, int, int, int, np.ndarray]]:
        if self._groups is None:
            assert self._run is not None and self._records is not None
            core, c0 = self._run
            self._groups = core.run_groups(c0, self.take, self._records)
        return self._groups

    @property
    def src(self) -> np.ndarray:
        if self._src is None:
            self._src = np.repeat(np.arange(len(self.take), dtype=np.int64), self.take)
        return self._src

    @property
    def src32(self) -> np.ndarray:
        if self._src32 is None:
            self._src32 = self._src.astype(np.int32) if self._src is not None else \
                np.repeat(np.arange(len(self.take), dtype=np.int32), self.take)
        return self._src32

    @property
    def records(self) -> np.ndarray:
        if self._records is None:
            parts = [g[4] for g in self.groups]
            self._records = parts[0] if len(parts) == 1 else \
                np.concatenate(parts) if parts else np.empty(0, np.uint64)
        return self._records


class _Local(threading.local):
    key: bytes = b""
    value: _Resolved | None = None


#: Draws per block of a source's records computed at once (and kept: a few blocks a source).
_DRAW_BLOCK = 4096
_KEPT_BLOCKS = 4
_KEPT_COUNTS = 16


class _Core:
    """What the streams of one mixture share: the sources, the order and the permutations."""

    def __init__(self, sources: list[dict[str, Any]], plan: MixPlan, seed: Any,
                 batch_size: int | None, config: tuple[Any, ...], token: str) -> None:
        self.sources = sources
        self.plan = plan
        self.seed = seed
        self.batch_size = batch_size
        self.config = config
        self.token = token
        self.k = len(sources)
        first = [next(iter(s.values())) for s in sources]
        self.lengths = np.array([len(ds) for ds in first], dtype=np.int64)
        self.length_of = [len(ds) for ds in first]
        self.lengths_u = self.lengths.astype(np.uint64)
        self.ra, self.rb = radix(self.lengths)
        self.bases = source_bases(normalize_seed(seed), self.k)
        # Each source's permutation as the native draws take it: digits and key.
        self._orders = [(int(a), int(b), int(base))
                        for a, b, base in zip(self.ra, self.rb, self.bases, strict=True)]
        # One table for the whole run (no schedule): a run of positions is one native call
        # (zsampler::mixture: the counts at its two ends and every source's draws).
        self._mixed_run: Any = None
        if len(plan.pieces) == 1 and self.k <= 0xFFFF:
            self._mixed_run = _native.MixedRun(
                plan.last.x.src.astype(np.uint16),
                [(n, *o) for n, o in zip(self.length_of, self._orders, strict=True)])
        self._local = _Local()
        self._lock = threading.Lock()
        self._passes: dict[tuple[int, str], OrderedDict[int, Any]] = {}
        # Caches shared by threads: plain dicts (single operations on them are atomic, on a
        # free-threaded interpreter too), emptied when full.
        self._blocks: dict[tuple[int, int], np.ndarray] = {}
        self._counts: dict[int, list[int]] = {}
        self._fillers: dict[tuple[int, str, int], Any] = {}

    def positions(self, idxs: Any) -> np.ndarray:
        """``idxs`` as int64 positions, checked."""
        pos = idxs.view(np.int64) if isinstance(idxs, np.ndarray) and idxs.dtype == _U64 \
            else np.asarray(idxs, dtype=np.int64)
        if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= MIX_LENGTH):
            bad = int(np.asarray(idxs)[(pos < 0) | (pos >= MIX_LENGTH)][0])
            raise LoaderxIndexError(f"position {bad} is out of range for a mixture "
                                    f"({MIX_LENGTH} positions)")
        return pos

    def records(self, src: np.ndarray, draw: np.ndarray) -> np.ndarray:
        """Each draw's record: its source's permutation, for the draw's pass, at the draw."""
        passes, k = np.divmod(draw, self.lengths[src])
        keys = draw_keys(self.bases, src, passes)
        small = self.lengths[src] <= SMALL
        if not small.any():
            return permute(k.view(np.uint64), self.lengths_u[src], self.ra[src], self.rb[src],
                           keys)
        out = np.empty(len(src), dtype=np.uint64)
        for s in np.unique(src[small]).tolist():
            here = np.flatnonzero(src == s)
            rows = small_orders(keys[here], int(self.lengths[s]))
            out[here] = np.take_along_axis(rows, k[here, None], axis=1)[:, 0]
        large = ~small
        if large.any():
            s = src[large]
            out[large] = permute(k[large].view(np.uint64), self.lengths_u[s], self.ra[s],
                                 self.rb[s], keys[large])
        return out

    def draw_block(self, s: int, j: int) -> np.ndarray:
        """Records of source ``s``'s draws ``j * _DRAW_BLOCK`` on (kept: read-only): one
        native call (``zsampler::draws``, the same orders as :meth:`records`)."""
        key = (s, j)
        block = self._blocks.get(key)
        if block is not None:
            return block
        block = np.empty(_DRAW_BLOCK, dtype=np.uint64)
        _native.mix_draws(block, j * _DRAW_BLOCK, self.length_of[s], *self._orders[s])
        block.setflags(write=False)
        if len(self._blocks) >= _KEPT_BLOCKS * self.k:
            self._blocks.clear()
        self._blocks[key] = block
        return block

    def draws(self, s: int, d0: int, d1: int) -> np.ndarray:
        """Records of source ``s``'s draws ``d0`` to ``d1`` (uint64)."""
        j0, j1 = d0 // _DRAW_BLOCK, (d1 - 1) // _DRAW_BLOCK
        if j0 == j1:
            return self.draw_block(s, j0)[d0 - j0 * _DRAW_BLOCK:d1 - j0 * _DRAW_BLOCK]
        parts = [self.draw_block(s, j) for j in range(j0, j1 + 1)]
        parts[0] = parts[0][d0 - j0 * _DRAW_BLOCK:]
        parts[-1] = parts[-1][:d1 - j1 * _DRAW_BLOCK]
        return np.concatenate(parts)

    def counts(self, n: int) -> list[int]:
        """Every source's count among the first ``n`` positions (a few kept: one batch's end
        is the next one's start)."""
        c = self._counts.get(n)
        if c is None:
            c = self.plan.counts_list(n)
            if len(self._counts) >= _KEPT_COUNTS:
                self._counts.clear()
            self._counts[n] = c
        return c

    def locate(self, idxs: Any) -> tuple[np.ndarray, np.ndarray]:
        """Each position's source and record, in the positions' order."""
        src, draw = self.plan.locate(self.positions(idxs))
        return src.astype(np.int64), self.records(src, draw)

    def resolve(self, idxs: np.ndarray) -> _Resolved:
        """A batch of positions, rows grouped by source (kept per thread for the streams and
        calls of one batch). A run of positions -- what a loader asks for -- is each source's
        consecutive draws between the counts at its two ends: no per-position work."""
        if idxs.dtype != _U64 and idxs.dtype != _I64:  # the key is bytes: one meaning each
            idxs = self.positions(idxs)
        key = idxs.tobytes()
        local = self._local
        if local.value is not None and local.key == key:
            return local.value
        n = len(idxs)
        first = int(idxs[0]) if n else 0
        # A run is first, first + 1, ...: its bytes are those of the range (a compare of the
        # bytes already taken costs less than any arithmetic on the array).
        if n and 0 <= first and first + n <= MIX_LENGTH and (
                n == 1 or key == np.arange(first, first + n, dtype=idxs.dtype).tobytes()):
            value = self._run(first, n)
        else:
            value = self._scattered(self.positions(idxs))
        local.key, local.value = key, value
        return value

    def _run(self, p0: int, n: int) -> _Resolved:
        native = self._mixed_run
        if native is not None:  # the records of the whole run, grouped by source, at once
            every = np.empty(n, dtype=_U64)
            c0, take = native.run(p0, every)
            return _Resolved(None, take, None, every, (self, c0))
        c0, c1 = self.counts(p0), self.counts(p0 + n)
        take = [b - a for a, b in zip(c0, c1, strict=True)]
        parts = [self.draws(s, d0, d0 + m) if m else None
                 for s, (d0, m) in enumerate(zip(c0, take, strict=True))]
        return _Resolved(self.run_groups(c0, take, parts), take)

    def run_groups(self, c0: list[int], take: list[int], records: Any
                   ) -> list[tuple[int, int, int, int, np.ndarray]]:
        """The groups of a run: source ``s``'s ``take[s]`` draws from its draw ``c0[s]`` on,
        their records either one array of every source's in turn or a list of one per source
        (None where the source has no rows)."""
        groups: list[tuple[int, int, int, int, np.ndarray]] = []
        lo = 0
        whole = isinstance(records, np.ndarray)
        for s, m in enumerate(take):
            if not m:
                continue
            d0 = c0[s]
            mine = records[lo:lo + m] if whole else records[s]
            length = self.length_of[s]
            first, last = d0 // length, (d0 + m - 1) // length
            if first == last:
                groups.append((s, first, lo, lo + m, mine))
            else:  # a pass over the source ends inside the batch: one group per pass
                for p in range(first, last + 1):
                    a = max(d0, p * length) - d0
                    b = min(d0 + m, (p + 1) * length) - d0
                    groups.append((s, p, lo + a, lo + b, mine[a:b]))
            lo += m
        return groups

    def keep(self, idxs: np.ndarray, value: _Resolved) -> None:
        """``value`` as this thread's resolution of ``idxs`` (see :meth:`resolve`)."""
        local = self._local
        local.key, local.value = idxs.tobytes(), value

    def _scattered(self, pos: np.ndarray) -> _Resolved:
        src, draw = self.plan.locate(pos)
        order = np.argsort(src, kind="stable")
        src, draw = src[order], draw[order]
        take = np.bincount(src, minlength=self.k).tolist()
        records = self.records(src, draw)
        groups: list[tuple[int, int, int, int, np.ndarray]] = []
        lo = 0
        for s in range(self.k):
            m = take[s]
            if not m:
                continue
            d = draw[lo:lo + m]
            length = int(self.lengths[s])
            passes = d // length
            if passes[0] == passes[-1]:
                groups.append((s, int(passes[0]), lo, lo + m, records[lo:lo + m]))
            else:
                cuts = np.flatnonzero(np.diff(passes)) + 1
                edges = [0, *cuts.tolist(), m]
                groups.extend((s, int(passes[a]), lo + a, lo + b, records[lo + a:lo + b])
                              for a, b in zip(edges[:-1], edges[1:], strict=True))
            lo += m
        return _Resolved(groups, take, src, records)

    def order(self, idxs: np.ndarray) -> np.ndarray:
        """Row ``r`` of a batch of positions ``idxs`` is position ``idxs[order[r]]``."""
        src, _ = self.plan.locate(self.positions(idxs))
        return np.argsort(src, kind="stable")

    def filler(self, s: int, name: str, p: int, ds: Any) -> Any:
        """The bound native batch call of source ``s``'s packed stream (see
        ``PackedDataset._filler``; per pass view when it re-packs), or None."""
        key = (s, name, p if getattr(ds, "repacks", False) or ds is not self.sources[s][name]
               else -1)
        fill = self._fillers.get(key, False)
        if fill is False:
            make = getattr(ds, "_filler", None)
            fill = make() if callable(make) else None
            if len(self._fillers) > 4 * self.k * _KEPT_PASSES:
                self._fillers.clear()
            self._fillers[key] = fill
        return fill

    def stream(self, s: int, name: str, p: int) -> Any:
        """Source ``s``'s stream ``name`` for its pass ``p`` (the pass's own packing when the
        stream re-packs per pass)."""
        ds = self.sources[s][name]
        if not getattr(ds, "repacks", False):
            return ds
        with self._lock:
            kept = self._passes.setdefault((s, name), OrderedDict())
            view = kept.get(p)
            if view is not None:
                kept.move_to_end(p)
                return view
        view = ds.pass_view(p)  # outside the lock: planning a pass takes a while
        with self._lock:
            kept[p] = view
            while len(kept) > _KEPT_PASSES:
                kept.popitem(last=False)
        return view


#: How a source's rows are read: plain, then its companions(), or with its segment ids.
_PLAIN, _COMPANIONS, _SEGMENTS = 0, 1, 2


class _Gathered(threading.local):
    """The companion arrays of the batch a thread gathered last, and that batch's resolution
    (the thread's own :meth:`_Core.resolve` gives the same object for the same positions
    while it keeps it: a later call for them finds the arrays by identity, not by
    comparing the positions again)."""

    of: _Resolved | None = None
    arrays: dict[str, np.ndarray] | None = None


# -- the stream ----------------------------------------------------------------------------------


class Mixture:
    """One stream of a mixture (see the module docs; made by :func:`mix`): record ``n`` is the
    mixed order's position ``n``. Implements :mod:`loaderx.source` (dense or ragged, like its
    sources) and ``defines_order``: the loader reads its positions in turn."""

    #: The loader reads this stream's positions in order (see :func:`ordered_streams`).
    defines_order = True

    def __init__(self, core: _Core, name: str, emit_source: bool) -> None:
        self._core = core
        self._name = name
        self._emit_source = emit_source
        first = core.sources[0][name]
        self.kind: str = first.kind
        self._dtype = np.dtype(first.dtype)
        self._item_shape = tuple(first.item_shape)
        self._row_items = math.prod(self._item_shape)  # (a packed row's tokens)
        if self.kind == "dense":
            self.record_bytes = int(first.record_bytes)
        self._companion_suffixes: tuple[str, ...] = ()
        if callable(getattr(first, "companion_names", None)):
            names = tuple(first.companion_names(""))
            self._companion_suffixes = names
        self._has_companions = callable(getattr(first, "companions", None))
        check = getattr(first, "_check_batch", None)
        self._check = check if callable(check) else None
        # How each source's rows are read (decided once: the batch path asks per group).
        self._how = [_SEGMENTS if callable(getattr(src[name], "gather_with_segments", None))
                     and len(self._companion_suffixes) == 2 else
                     _COMPANIONS if callable(getattr(src[name], "companions", None)) else _PLAIN
                     for src in core.sources]
        # A source that packs once reads through one view and one bound batch call, looked
        # up here instead of per batch (None: it re-packs per pass, see _Core.stream).
        self._fixed = [None if getattr(src[name], "repacks", False) else src[name]
                       for src in core.sources]
        self._fills = [core.filler(s, name, -1, ds)
                       if ds is not None and self._how[s] == _SEGMENTS else None
                       for s, ds in enumerate(self._fixed)]
        self._gathered = _Gathered()
        self._one_call = self._native_batches()
        # The order as the mixture resolved it (each piece's start, length and integer
        # weights), not the weights as written: [1, 1], [1.0, 1.0] and [0.5, 0.5] are one
        # mixture, and a checkpoint of one resumes on the others.
        resolved = [(p.start, p.length, p.x.a.tolist(), None if p.y is None else p.y.a.tolist())
                    for p in core.plan.pieces]
        digest = hashlib.sha1(repr((resolved, normalize_seed(core.seed), name, [
            (len(s[name]), getattr(s[name], "view_digest", ""), s[name].kind,
             np.dtype(s[name].dtype).str, tuple(s[name].item_shape)) for s in core.sources]))
            .encode()).hexdigest()[:16]
        self._digest = "mix-" + digest

    # -- what the mixture is -------------------------------------------------------------------

    @property
    def sources(self) -> list[Any]:
        """The sources of this stream, in the weights' order."""
        return [s[self._name] for s in self._core.sources]

    @property
    def seed(self) -> Any:
        return self._core.seed

    @property
    def batch_size(self) -> int | None:
        """The batch size a schedule's steps are counted in (None without a schedule)."""
        return self._core.batch_size

    @property
    def period(self) -> int:
        """The period of the order while the first weights hold: the weights are ``a_i /
        period`` for integers ``a_i``."""
        return self._core.plan.pieces[0].x.q

    @property
    def weights(self) -> list[float]:
        """The weights in force at the start, as the order keeps them (summing to 1): the
        weights given, normalized, or their rounding to multiples of ``1 / period``."""
        return [float(x) for x in self._core.plan.weights_at(0)]

    def weights_at(self, step: int) -> list[float]:
        """The weights in force at ``step`` (a schedule's; the same at every step without)."""
        step = _integer(step, "step")
        if step < 0:
            raise LoaderxValueError(f"step must be 0 or more, got {step}")
        rows = step * (self._core.batch_size or 1)
        return [float(x) for x in self._core.plan.weights_at(min(rows, MIX_LENGTH))]

    @property
    def plan_bytes(self) -> int:
        """Memory the order keeps (its tables: a period each, 3 bytes a position)."""
        return self._core.plan.nbytes

    def counts(self, positions: int) -> list[int]:
        """How many of the first ``positions`` positions each source has (exact)."""
        n = _integer(positions, "positions")
        if not 0 <= n <= MIX_LENGTH:
            raise LoaderxValueError(f"positions must be in [0, {MIX_LENGTH}], got {n}")
        return [int(x) for x in self._core.plan.counts(n)]

    def target(self, positions: int) -> list[float]:
        """What :meth:`counts` is held to: each source's weight summed over the first
        ``positions`` positions (counts are within one record of it, 2.5 in a transition)."""
        n = _integer(positions, "positions")
        return [float(x) for x in self._core.plan.target(n)]

    def stats(self, positions: int) -> list[dict[str, Any]]:
        """Per source, after ``positions`` positions (``loader.step * batch_size``): its
        ``weight`` now, its ``records``, the ``drawn`` count and the ``passes`` over it
        (``drawn / records``: a small source cycles more often)."""
        counts = self.counts(positions)
        weights = self._core.plan.weights_at(min(int(positions), MIX_LENGTH))
        return [{"source": i, "weight": float(weights[i]), "records": int(n), "drawn": c,
                 "passes": c / int(n)}
                for i, (n, c) in enumerate(zip(self._core.lengths, counts, strict=True))]

    def locate(self, positions: Any) -> tuple[np.ndarray, np.ndarray]:
        """Each position's source (int64) and record in that source (uint64)."""
        return self._core.locate(_indices(positions, MIX_LENGTH).reshape(-1))

    def batch_order(self, positions: Any) -> np.ndarray:
        """The positions of a loader batch's rows: ``positions`` (a batch's, e.g.
        ``loader.batch_indices(step)``) grouped by source, each source's in their order."""
        idx = _indices(positions, MIX_LENGTH).reshape(-1)
        return idx[self._core.order(idx)]

    def _native_batches(self) -> Any:
        """The whole batch in one native call (``_native.MixedBatch``: the run resolved and
        every source's rows read in one parallel job) when one table serves the whole run (no
        schedule) and every source reads natively with one plan: all dense datasets, or all
        packed views that pack once; else None."""
        core = self._core
        if self.kind != "dense" or core._mixed_run is None:
            return None
        dense = all(h == _PLAIN for h in self._how)
        if not dense and any(h != _SEGMENTS for h in self._how):
            return None
        args = []
        for ds in self._fixed:
            get = getattr(ds, "_native_source", None)
            one = get() if callable(get) else None
            if one is None:
                return None
            args.append(one)
        row_items, itemsize = (self.record_bytes, 1) if dense else \
            (self._row_items, self._dtype.itemsize)
        return _native.MixedBatch(
            core.plan.last.x.src.astype(np.uint16),
            [(n, *o) for n, o in zip(core.length_of, core._orders, strict=True)], dense, args,
            row_items, itemsize, MIX_LENGTH)

    def _stream(self, s: int, p: int) -> Any:
        """Source ``s``'s view for its pass ``p``: the one view of a source that packs once
        (kept at construction), else that pass's own packing (see :meth:`_Core.stream`)."""
        ds = self._fixed[s]
        return ds if ds is not None else self._core.stream(s, self._name, p)

    # -- the stream protocol (loaderx.source) --------------------------------------------------

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def item_shape(self) -> tuple[int, ...]:
        return self._item_shape

    def __len__(self) -> int:
        return MIX_LENGTH

    @property
    def view_digest(self) -> str:
        """A digest of the mixture: its weights or schedule, seed, and each source's length and
        view, so that a checkpoint of one mixture is refused on another."""
        return self._digest

    @property
    def recently_cold(self) -> bool:
        return any(getattr(s, "recently_cold", False) for s in self.sources)

    def prefetch(self, idxs: Any) -> bool:
        flat = np.asarray(idxs, dtype=np.uint64).reshape(-1)
        flat = flat[flat < MIX_LENGTH]
        if not len(flat):
            return False
        asked = False
        for s, p, _, _, records in self._core.resolve(flat).groups:
            asked |= bool(self._stream(s, p).prefetch(records))
        return asked

    def gather_rows(self, idxs: np.ndarray, dst: np.ndarray, shards: int | None = None,
                    rows: np.ndarray | None = None) -> None:
        """Dense mixtures, as the loader reads them: the records of positions ``idxs`` into
        the rows of the uint8 buffer ``dst`` grouped by source (see :meth:`batch_order`), each
        source's rows in one gather straight into their rows (``rows``: row ``i`` goes to
        ``rows[i]`` instead); a packed source's segment ids and positions are written at once,
        for :meth:`companions`."""
        if self.kind != "dense":
            raise LoaderxTypeError("gather_rows() is for dense mixtures; this one is ragged")
        n = len(idxs)
        if not n:
            return
        if self._check is not None:
            self._check(n)  # a packed view's refusal of a batch past its limits
        core = self._core
        native = self._one_call
        if native is not None and rows is None and idxs.dtype == _U64 and \
                idxs.flags.c_contiguous:
            packed = bool(self._companion_suffixes)
            seg = np.empty(n * self._row_items, dtype=np.int32) if packed else None
            pos = np.empty(n * self._row_items, dtype=np.int32) if packed else None
            src = np.empty(n, dtype=np.int32) if self._emit_source else None
            every = np.empty(n, dtype=_U64)
            got = native.fill(idxs, dst, seg, pos, src, every, shards)
            if got is not None:  # a run: resolved, read and its companions written at once
                resolved = _Resolved(None, got[1], None, every, (core, got[0]), src)
                core.keep(idxs, resolved)
                g = self._gathered
                g.of = resolved
                if seg is not None and pos is not None:
                    shape = (n, *self._item_shape)
                    suffixes = self._companion_suffixes
                    g.arrays = {suffixes[0]: seg.reshape(shape),
                                suffixes[1]: pos.reshape(shape)}
                else:
                    g.arrays = None
                return
        name = self._name
        rb = self.record_bytes
        extra: dict[str, np.ndarray] | None = None
        # A packed source's segment ids and positions, flat: a source's rows are one slice.
        flat: tuple[np.ndarray, np.ndarray] | None = None
        width, suffixes = self._row_items, self._companion_suffixes
        resolved = core.resolve(idxs)
        for s, p, lo, hi, local in resolved.groups:
            ds = self._stream(s, p)
            how = self._how[s]
            if rows is not None:
                ds.gather_rows(local, dst, shards, np.ascontiguousarray(rows[lo:hi],
                                                                         dtype=np.uint64))
            elif how == _SEGMENTS:  # a packed view: tokens, segment ids, positions at once
                if flat is None:
                    flat = (np.empty(n * width, dtype=np.int32),
                            np.empty(n * width, dtype=np.int32))
                    if extra is None:
                        extra = {}
                    extra[suffixes[0]] = flat[0].reshape(n, *self._item_shape)
                    extra[suffixes[1]] = flat[1].reshape(n, *self._item_shape)
                seg_flat, pos_flat = flat
                fill = self._fills[s] if self._fixed[s] is not None else core.filler(s, name, p, ds)
                a, b = lo * width, hi * width
                if fill is not None:
                    fill(local, dst[lo * rb:hi * rb], seg_flat[a:b], pos_flat[a:b], shards)
                else:
                    shape = (hi - lo, *self._item_shape)
                    ds.gather_with_segments(local, dst[lo * rb:hi * rb],
                                            seg_flat[a:b].reshape(shape),
                                            pos_flat[a:b].reshape(shape), shards)
                continue
            else:
                ds.gather_rows(local, dst[lo * rb:hi * rb], shards)
            if how != _PLAIN:
                if extra is None:
                    extra = {}
                _place(extra, ds.companions("", local), lo, hi, n)
        if extra is not None:
            g = self._gathered
            g.of, g.arrays = resolved, extra

    def companions(self, name: str, idxs: np.ndarray) -> dict[str, np.ndarray]:
        """``name_source`` (int32: each row's source index) and the sources' own companion
        arrays for the rows of positions ``idxs`` (see :mod:`loaderx.source`)."""
        out: dict[str, np.ndarray] = {}
        r = self._core.resolve(idxs)
        if self._has_companions:
            g = self._gathered
            arrays = g.arrays
            if arrays is None or g.of is not r:
                arrays = {}
                for s, p, lo, hi, local in r.groups:
                    ds = self._stream(s, p)
                    _place(arrays, ds.companions("", local), lo, hi, len(idxs))
            else:
                g.arrays = None
            for suffix, arr in arrays.items():
                out[name + suffix] = arr
        if self._emit_source:
            out[name + "_source"] = r.src32
        return out

    def companion_names(self, name: str) -> tuple[str, ...]:
        own = tuple(name + s for s in self._companion_suffixes)
        return own + ((name + "_source",) if self._emit_source else ())

    def record_nbytes(self, idxs: np.ndarray) -> np.ndarray:
        """Ragged mixtures, as the loader reads them: the byte length of each row's record,
        rows grouped by source (uint64)."""
        if self.kind != "ragged":
            raise LoaderxTypeError("record_nbytes() is for ragged mixtures; this one is dense")
        out = np.empty(len(idxs), dtype=np.uint64)
        for s, p, lo, hi, local in self._core.resolve(idxs).groups:
            out[lo:hi] = self._stream(s, p).record_nbytes(local)
        return out

    def gather_at(self, idxs: np.ndarray, dst: np.ndarray, offsets: np.ndarray) -> None:
        """Ragged mixtures: row ``i``'s record (rows grouped by source) into ``dst`` at byte
        ``offsets[i]``."""
        if self.kind != "ragged":
            raise LoaderxTypeError("gather_at() is for ragged mixtures; this one is dense")
        for s, p, lo, hi, local in self._core.resolve(idxs).groups:
            self._stream(s, p).gather_at(
                local, dst, np.ascontiguousarray(offsets[lo:hi]))

    # -- reading outside a loader ------------------------------------------------------------

    def __getitem__(self, idx: Any) -> Any:
        """``mixture[n]``: position ``n``'s record; a list, array or slice (with an end): an
        array of records (dense) or a list of them (ragged), in the positions' order."""
        if isinstance(idx, slice) and idx.stop is None:
            raise LoaderxIndexError("a mixture is endless: slice it with an end, mixture[a:b]")
        one = _one_index(idx, MIX_LENGTH)
        flat = _indices(np.array([one]) if one is not None else idx, MIX_LENGTH).reshape(-1)
        back = np.argsort(self._core.order(flat)) if self._core.k > 1 else None
        if self.kind == "dense":
            out = np.empty(len(flat) * self.record_bytes, dtype=np.uint8)
            self.gather_rows(flat, out)
            self._gathered.arrays = None
            arr = out.view(self._dtype).reshape((len(flat), *self._item_shape))
            if back is not None:
                arr = arr[back]
            return arr[0] if one is not None else arr
        nbytes = self.record_nbytes(flat)
        offsets, total = _ragged_layout(nbytes)
        buf = np.empty(total, dtype=np.uint8)
        if len(flat):
            self.gather_at(flat, buf, offsets)
        records = _ragged_views(buf, offsets, nbytes, self._dtype, self._item_shape)
        if back is not None:
            records = [records[int(i)] for i in back]
        return records[0] if one is not None else records

    def close(self) -> None:
        for s in self.sources:
            s.close()

    def __reduce__(self) -> tuple[Any, ...]:
        c = self._core
        return (_rebuild, (c.token, c.sources, c.config, c.seed, c.batch_size, self._name,
                           self._emit_source, list(c.length_of)))

    def __repr__(self) -> str:
        ws = ", ".join(f"{w:.4g}" for w in self.weights)
        sched = "" if len(self._core.plan.pieces) == 1 else \
            f", schedule of {len(self._core.plan.pieces)} pieces"
        return (f"Mixture({self._core.k} {self.kind} sources, weights [{ws}]{sched}, "
                f"seed={self.seed!r})")


def _place(into: dict[str, np.ndarray], part: Mapping[str, Any], lo: int, hi: int,
           n: int) -> None:
    """A source's companion arrays for rows ``[lo, hi)`` into the batch's (``n`` rows)."""
    for key, value in part.items():
        arr = np.asarray(value)
        full = into.get(key)
        if full is None:
            if hi - lo == n:
                into[key] = arr
                continue
            full = into[key] = np.empty((n, *arr.shape[1:]), dtype=arr.dtype)
        full[lo:hi] = arr


def _rebuild(token: str, sources: list[dict[str, Any]], config: tuple[Any, ...], seed: Any,
             batch_size: int | None, name: str, emit_source: bool,
             lengths: list[int] | None = None) -> Mixture:
    with _CORES_LOCK:
        core = _CORES.get(token)
    if core is None:
        if lengths is not None:  # every source as long as the mixture was built on
            sources = [{k: pinned_to(ds, n, f"source {i}'s stream {k!r}")
                        for k, ds in s.items()}
                       for i, (s, n) in enumerate(zip(sources, lengths, strict=True))]
        weights, schedule, transition = config
        core = _build(sources, weights, seed, schedule, transition, batch_size, token)
    return Mixture(core, name, emit_source)


# -- making one --------------------------------------------------------------------------------


def _build(sources: list[dict[str, Any]], weights: Any, seed: Any, schedule: Any,
           transition: str, batch_size: int | None, token: str | None = None) -> _Core:
    k = len(sources)
    tables: dict[tuple[int, ...], Table] = {}
    if schedule is None:
        w = _weights(weights, k, "weights")
        pieces = build_pieces([0], [_table(w, None, "weights", tables)], False)
        config: tuple[Any, ...] = (tuple(w), None, None)
    else:
        assert batch_size is not None
        steps = [m[0] for m in schedule]
        ws = [m[1] for m in schedule]
        rows = [s * batch_size for s in steps]
        linear = transition == "linear"
        divides = schedule_period(rows, linear)
        # The last milestone of a step schedule holds for ever: no piece ends after it, so its
        # period divides nothing and its weights are kept as exactly as they can be.
        ts = [_table(w, None if not linear and i == len(ws) - 1 else divides,
                     f"schedule[{i}]", tables) for i, w in enumerate(ws)]
        for i in range(1, len(rows)):
            if linear and rows[i] - rows[i - 1] > MAX_TRANSITION and \
                    ts[i].a.tolist() != ts[i - 1].a.tolist():
                raise LoaderxValueError(
                    f"schedule[{i - 1}] to schedule[{i}] is a transition of "
                    f"{rows[i] - rows[i - 1]} rows, more than the {MAX_TRANSITION} a linear "
                    "transition spans; add milestones between")
        pieces = build_pieces(rows, ts, linear)
        config = (None, tuple((s, tuple(w)) for s, w in zip(steps, ws, strict=True)),
                  transition)
    plan = MixPlan(pieces, k)
    core = _Core(sources, plan, seed, batch_size, config, token or uuid.uuid4().hex)
    with _CORES_LOCK:
        _CORES[core.token] = core
    return core


def _schedule(schedule: Any, k: int) -> list[tuple[int, list[int | float]]]:
    if isinstance(schedule, (str, bytes, Mapping)) or not isinstance(schedule, Sequence) \
            or not schedule:
        raise LoaderxTypeError("schedule must be a non-empty list of (start_step, weights) "
                               f"milestones, got {type(schedule).__name__}")
    out: list[tuple[int, list[int | float]]] = []
    for i, m in enumerate(schedule):
        if isinstance(m, (str, bytes)) or not isinstance(m, Sequence) or len(m) != 2:
            raise LoaderxTypeError(f"schedule[{i}] must be a (start_step, weights) pair, got "
                                   f"{m!r}")
        step = _integer(m[0], f"schedule[{i}]'s start_step")
        if i == 0 and step != 0:
            raise LoaderxValueError(f"schedule[0] starts at step {step}; the first milestone "
                                    "starts at step 0 (the weights before any other)")
        if i and step <= out[-1][0]:
            raise LoaderxValueError(f"schedule[{i}] starts at step {step}, not after "
                                    f"schedule[{i - 1}]'s {out[-1][0]}; list the milestones "
                                    "in step order, each at its own step")
        out.append((step, _weights(m[1], k, f"schedule[{i}]")))
    return out


@overload
def mix(sources: Sequence[Mapping[str, Any]], weights: Sequence[float] | None = None, *,
        seed: Any = 0, schedule: Sequence[tuple[int, Sequence[float]]] | None = None,
        transition: Transition = "linear",
        batch_size: int | None = None) -> dict[str, Mixture]: ...
@overload
def mix(sources: Sequence[Any], weights: Sequence[float] | None = None, *, seed: Any = 0,
        schedule: Sequence[tuple[int, Sequence[float]]] | None = None,
        transition: Transition = "linear", batch_size: int | None = None) -> Mixture: ...


def mix(sources: Sequence[Any], weights: Sequence[float] | None = None, *, seed: Any = 0,
        schedule: Sequence[tuple[int, Sequence[float]]] | None = None,
        transition: Transition = "linear", batch_size: int | None = None) -> Any:
    """The sources as one stream in exact proportions; see the module documentation.

    ``sources``: datasets or views of one kind (dense of one dtype and item shape, ragged, or
    packed views of one ``seq_len``), or dicts of aligned streams with the same keys (then a
    dict of mixtures in one order). ``weights``: one non-negative number per source (any
    scale; 0 leaves a source out); one source needs none. ``seed``: any int, the sources'
    permutations. ``schedule``: instead of ``weights``, ``[(0, w0), (step, w1), ...]``
    milestones, with ``transition`` ``"linear"`` (each milestone's weights move linearly to
    the next's) or ``"step"`` (they hold until the next), and ``batch_size`` the loader's
    global batch size (a step is that many positions)."""
    if isinstance(sources, (str, bytes, os.PathLike, Mapping)) or \
            not isinstance(sources, Sequence) or not len(sources):
        raise LoaderxTypeError("mix() needs a non-empty list of sources (datasets or views, or "
                               "dicts of aligned streams)")
    k = len(sources)
    if k > MAX_SOURCES:
        raise LimitExceededError(f"mix() of {k} sources: at most {MAX_SOURCES} (a source's "
                                 "number is 16 bits in the mixture's tables); concatenate "
                                 "sources of the same kind first (ConcatDataset) and mix fewer")
    as_dicts = [isinstance(s, Mapping) for s in sources]
    if any(as_dicts) and not all(as_dicts):
        i = as_dicts.index(not as_dicts[0])
        raise LoaderxTypeError(f"source {i} is {'a dict' if as_dicts[i] else 'a stream'}, "
                               f"source 0 {'a dict' if as_dicts[0] else 'a stream'}; give every "
                               "source as a dataset, or every one as a dict of the same streams")
    if as_dicts[0]:
        keys = list(sources[0])
        if not keys or not all(isinstance(key, str) for key in keys):
            raise LoaderxTypeError("source 0 must be a non-empty dict of {name: stream}")
        groups: list[dict[str, Any]] = []
        for i, s in enumerate(sources):
            if sorted(s) != sorted(keys):
                raise LoaderxValueError(f"source {i} has the streams {sorted(s)}, source 0 "
                                        f"{sorted(keys)}; every source needs the same names")
            groups.append({key: s[key] for key in keys})
    else:
        keys = [""]
        groups = [{"": s} for s in sources]
    for i, g in enumerate(groups):
        for key, ds in g.items():
            _check_stream(i, key or None, ds)
        lengths = {key: len(ds) for key, ds in g.items()}
        if len(set(lengths.values())) != 1:
            raise LoaderxValueError(f"source {i}'s streams have different lengths {lengths}; "
                                    "the streams of a source are aligned records")
    for key in keys:
        for i, g in enumerate(groups[1:], 1):
            _check_alike(i, key or None, g[key], groups[0][key])
        check_class_maps(
            [(f"source {i}" + (f"'s stream {key!r}" if key else ""), class_names_of(g[key]))
             for i, g in enumerate(groups)], "a mixture",
            "Convert the sources with one class list (the labels of one remapped onto the "
            "other's names), or leave the label stream out of the mixture")

    if transition not in ("linear", "step"):
        raise LoaderxValueError(f"transition must be 'linear' or 'step', got {transition!r}")
    sched = None
    if schedule is not None:
        if weights is not None:
            raise LoaderxValueError("give weights or a schedule, not both (the schedule's "
                                    "first milestone holds the starting weights)")
        sched = _schedule(schedule, k)
        if batch_size is None:
            raise LoaderxValueError("a schedule counts steps: pass batch_size= (the loader's "
                                    "global batch size) so that a step is that many positions")
    elif weights is None:
        if k != 1:
            raise LoaderxValueError(f"mix() of {k} sources needs weights (one per source) or a "
                                    "schedule")
        weights = [1]
    if batch_size is not None:
        batch_size = _integer(batch_size, "batch_size")
        if batch_size < 1:
            raise LoaderxValueError(f"batch_size must be positive, got {batch_size}")
    _integer(seed, "seed")
    core = _build(groups, weights, seed, sched, transition, batch_size)
    streams = {key: Mixture(core, key, emit_source=n == 0) for n, key in enumerate(keys)}
    return streams if as_dicts[0] else streams[""]


# -- the loader's side -----------------------------------------------------------------------------


def ordered_streams(streams: Mapping[str, Any], mode: Mode, batch_size: int) -> bool:
    """Whether a loader's ``streams`` define the order (mixtures, ``defines_order``), checked:
    then every stream must, the mode may not be ``"iid"``, and a schedule's batch size must be
    the loader's. A packed view that re-packs per pass is refused outside a mixture."""
    ordered = [name for name, ds in streams.items() if getattr(ds, "defines_order", False)]
    for name, ds in streams.items():
        if getattr(ds, "repacks", False) and name not in ordered:
            raise LoaderxValueError(
                f"stream {name!r} re-packs per pass (pack(..., repack=True)), which needs the "
                "order to say which pass a row is in: read it through a mixture, "
                f"loaderx.mix([rows]) (one source: pass after pass, each packed and shuffled "
                "anew), or pack without repack=True")
    if not ordered:
        return False
    plain = [name for name in streams if name not in ordered]
    if plain:
        raise LoaderxValueError(
            f"stream {ordered[0]!r} is a mixture, which is endless and sets the order, and "
            f"stream {plain[0]!r} is not; mix aligned streams together, "
            "loaderx.mix([{'x': xa, 'y': ya}, {'x': xb, 'y': yb}], weights)")
    if mode is Mode.IID:
        raise LoaderxValueError(
            "a mixture sets the order itself (each source without replacement, in a new "
            "permutation each pass, in exact proportions), so mode='iid' does not apply; leave "
            "mode at its default")
    for name in ordered:
        b = getattr(streams[name], "batch_size", None)
        if b is not None and b != batch_size:
            raise LoaderxValueError(
                f"stream {name!r}'s schedule counts steps of {b} rows (mix(..., "
                f"batch_size={b})), this loader's batch_size is {batch_size}; give both the "
                "same global batch size")
    return True
