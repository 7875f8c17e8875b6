"""A batch as a worker sends it: the transform's output with every array replaced by a
reference to where it lies in shared memory, and back on the consumer's side.

The worker walks the output -- dicts, lists, tuples (named ones too), NumPy arrays, CPU torch
tensors. An array that already lies in the batch's segment (what the gather wrote, or a view
of it: the identity transform, an in-place transform, a slice) is sent as its segment, offset,
shape, strides and dtype, without a copy. Any other array (what a transform computed) is
copied once, in the worker, into a second segment of the same batch. Everything else --
strings, numbers, object arrays, other containers -- is pickled with the skeleton. What the
thread loader would hand over as it is comes back alike: a read-only array stays read-only
(the reference says so), and a list or dict that the output holds twice, or that holds itself,
is one object on the consumer's side too (the walks keep a memo of the containers they made).

The consumer rebuilds each array over a lease that keeps the batch's :class:`Loan` alive, as
:mod:`loaderx._views.recycle` does for the thread loader: every view keeps its lease, so the loan
ends -- and the segments return to the worker -- only when no array of the batch can be seen
any more.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from loaderx.workers.arena import Arena, BatchMemory, Segment
from loaderx.workers.dtypes import dtype_of, dtype_spec
from loaderx.workers.mapping import Mapping

__all__ = ["Flat", "Loan", "Opaque", "Ref", "decode", "decode_flat", "encode"]


#: Bits of a :class:`Ref`'s ``kind``: the array was a torch tensor; it was a read-only array.
TORCH = 1
READ_ONLY = 2


def kind_of(array: np.ndarray, torch: bool) -> int:
    """The ``kind`` bits of ``array`` (a torch tensor's NumPy view is always writable)."""
    return TORCH if torch else (0 if array.flags.writeable else READ_ONLY)


class Ref:
    """Where one array of the batch lies, and its ``kind`` (:data:`TORCH`, :data:`READ_ONLY`).
    The dtype travels as its string when that names it exactly (every plain numeric dtype:
    cheaper to send and to look up than a pickled dtype), else as the dtype itself."""

    __slots__ = ("dtype", "kind", "offset", "segment", "shape", "strides")

    def __init__(self, segment: int, offset: int, shape: tuple[int, ...],
                 strides: tuple[int, ...], dtype: np.dtype[Any] | str, kind: int) -> None:
        self.segment, self.offset, self.shape = segment, offset, shape
        self.strides, self.kind = strides, kind
        self.dtype = dtype_spec(dtype) if isinstance(dtype, np.dtype) else dtype

    def fields(self) -> tuple[Any, ...]:
        """Its fields in the order of the constructor's arguments."""
        return (self.segment, self.offset, self.shape, self.strides, self.dtype, self.kind)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Ref, self.fields())


class Opaque:
    """A part of the output with no array in it, which the consumer need not walk."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (Opaque, (self.value,))


#: Leaves that hold no array: passed over at once (a transform may return long lists of them).
_PLAIN = frozenset({int, float, str, bytes, bool, type(None), complex})

def _span(a: np.ndarray) -> tuple[int, int, int]:
    """The address of ``a``'s first element, and the lowest and one past the highest byte
    address ``a`` reads."""
    start: int = a.__array_interface__["data"][0]
    if a.flags.c_contiguous:
        return start, start, start + a.nbytes
    lo = hi = start
    for n, stride in zip(a.shape, a.strides, strict=True):
        if stride < 0:
            lo += (n - 1) * stride
        else:
            hi += (n - 1) * stride
    return start, lo, hi + a.itemsize


def _as_array(value: Any) -> tuple[np.ndarray | None, bool]:
    """``value`` as a NumPy array sharing its memory, and whether it was a torch tensor;
    (None, False) for a value that must be pickled."""
    if type(value) is np.ndarray:  # subclasses (masked arrays, memmaps, ...) are pickled
        if value.dtype.hasobject or value.size == 0:
            return None, False
        return value, False
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type != "cpu" or value.layout != torch.strided or value.requires_grad \
                or value.is_conj() or value.is_neg():
            return None, False
        try:
            return value.numpy(), True  # no NumPy dtype (e.g. bfloat16): pickled
        except (TypeError, RuntimeError):
            return None, False
    return None, False


def _rebuilt(value: tuple[Any, ...], items: list[Any]) -> tuple[Any, ...]:
    kind = type(value)
    return kind(*items) if hasattr(kind, "_fields") else tuple(items)


class _Encoder:
    """One walk over a transform's output (an object, not a recursive closure, which would be
    a reference cycle holding the batch until the garbage collector ran)."""

    def __init__(self, own: Segment | None) -> None:
        self.own = own
        self.low, self.high = (own.address, own.address + own.size) if own else (0, 0)
        self.copies: list[tuple[np.ndarray, Ref]] = []
        self.extra_bytes = 0
        self.used_own = False
        # id of a list or dict of the output -> its walked copy: one object held twice (or
        # holding itself) stays one object, and a cycle ends the walk instead of recursing.
        self.memo: dict[int, Any] = {}

    def in_own(self, array: np.ndarray, torch: bool) -> Ref | None:
        """Where ``array`` lies in the batch's own segment, or None when it does not."""
        own = self.own
        start, lo, hi = _span(array)
        if own is None or not (self.low <= lo and hi <= self.high):
            return None
        self.used_own = True
        return Ref(own.ident, start - own.address, array.shape, array.strides, array.dtype,
                   kind_of(array, torch))

    def walk(self, value: Any) -> Any:
        kind = type(value)
        if kind in _PLAIN:
            return value
        if (kind is list or kind is tuple) and _PLAIN.issuperset(map(type, value)):
            return Opaque(value)  # e.g. a list of per-sample floats: nothing to look into
        if kind is dict or kind is list:
            walked = self.memo.get(id(value))
            if walked is not None:
                return walked
            if kind is dict:
                into: dict[Any, Any] = {}
                self.memo[id(value)] = into
                for k, v in value.items():
                    into[k] = self.walk(v)
                return into
            items: list[Any] = []
            self.memo[id(value)] = items
            items.extend([self.walk(v) for v in value])
            return items
        if kind is tuple or (isinstance(value, tuple) and hasattr(kind, "_fields")):
            return _rebuilt(value, [self.walk(v) for v in value])
        array, torch = _as_array(value)
        if array is None:
            return value
        ref = self.in_own(array, torch)
        if ref is not None:
            return ref
        # Computed by the transform: copied later into one extra segment, C-contiguous (the
        # segment and the strides are filled in then).
        ref = Ref(-1, self.extra_bytes, array.shape, (), array.dtype, kind_of(array, torch))
        self.copies.append((array, ref))
        self.extra_bytes = -(-(self.extra_bytes + array.nbytes) // 64) * 64
        return ref


def _flat_in(out: dict[Any, Any], encoder: _Encoder,
             known: dict[int, tuple[np.ndarray, tuple[Any, ...]]]) -> list[tuple[Any, ...]] | None:
    """The entries of a :class:`Flat` for a dict whose values are plain NumPy arrays that lie
    in the batch's own segment -- what the gather wrote, the identity or an in-place
    transform -- or plain values (numbers, strings, lists or tuples of them: per-sample
    scores, names), with at least one array: most batches. None for anything else, which
    the full walk then handles. The arrays the gather made themselves are looked up in
    ``known`` (see :class:`BatchMemory`)."""
    refs = []
    arrays = 0
    for value in out.values():
        mine = known.get(id(value))
        if mine is not None and mine[0] is value and value.flags.writeable:
            refs.append(mine[1])
            arrays += 1
            continue
        kind = type(value)
        if kind in _PLAIN or ((kind is list or kind is tuple)
                              and _PLAIN.issuperset(map(type, value))):
            refs.append((value,))
            continue
        if kind is not np.ndarray or value.dtype.hasobject or value.size == 0:
            return None
        ref = encoder.in_own(value, False)
        if ref is None:
            return None
        refs.append(ref.fields())
        arrays += 1
    return refs if arrays else None


def encode(out: Any, memory: BatchMemory, arena: Arena) -> tuple[Any, list[Segment]]:
    """``out`` as a skeleton of :class:`Ref` s, and the segments it names (lent from now on;
    the batch's own segment is given back if nothing lies in it)."""
    encoder = _Encoder(memory.segment)
    own = memory.segment
    if type(out) is dict and out and own is not None:
        refs = _flat_in(out, encoder, memory.known)
        if refs is not None:  # the common case, without the walk
            arena.lend(own)
            return Flat(tuple(out), refs), [own]
    skeleton = encoder.walk(out)
    lent: list[Segment] = []
    if encoder.copies:
        extra = arena.take(encoder.extra_bytes)
        for array, ref in encoder.copies:
            dst = extra.array[ref.offset:ref.offset + array.nbytes].view(array.dtype)
            dst = dst.reshape(array.shape)
            np.copyto(dst, array)
            ref.segment, ref.strides = extra.ident, dst.strides
        lent.append(extra)
    own = memory.segment
    if own is not None:
        if encoder.used_own:
            lent.insert(0, own)
        else:
            arena.give(own)
    for segment in lent:
        arena.lend(segment)
    if type(skeleton) is dict and all(type(v) in _FLAT for v in skeleton.values()):
        # A dict of arrays and plain values, as plain tuples: what pickle reads fastest.
        return Flat(tuple(skeleton), [_entry(v) for v in skeleton.values()]), lent
    return skeleton, lent


#: What a value of a :class:`Flat` may be once walked: an array's place, or a plain value.
_FLAT = frozenset({Ref, Opaque}) | _PLAIN


def _entry(value: Any) -> tuple[Any, ...]:
    """A walked value as an entry of a :class:`Flat`: an array's :meth:`Ref.fields`, else the
    value in a 1-tuple."""
    if type(value) is Ref:
        return value.fields()
    return (value.value,) if type(value) is Opaque else (value,)


class Flat:
    """A dict of arrays and plain values: its keys and, in order, an entry for each value --
    where the array lies (a :meth:`Ref.fields` 6-tuple), or the plain value in a 1-tuple. The
    worker sends the two as they are, in a reply of its own kind (plain tuples are what pickle
    writes and reads fastest); :func:`decode_flat` rebuilds the dict."""

    __slots__ = ("keys", "refs")

    def __init__(self, keys: tuple[Any, ...], refs: list[tuple[Any, ...]]) -> None:
        self.keys, self.refs = keys, refs


class Loan:
    """The consumer's hold on one batch's segments: every array of the batch keeps it alive
    (through its lease). The consumer watches it with a weak reference whose callback is a C
    callable -- a list's ``append`` -- so that its end runs no Python code: a ``__del__``
    would be a place where Ctrl-C could land and be lost ("Exception ignored in ...")."""

    __slots__ = ("__weakref__",)


class _Lease:
    """The owner of the consumer's view of one segment for one batch: exposes the segment's
    memory and keeps the batch's loan alive (the batch's arrays are views of it)."""

    __slots__ = ("__array_interface__", "_keep", "_loan")

    def __init__(self, loan: Loan, keep: Mapping) -> None:
        self._loan = loan
        self._keep = keep  # the segment's mapping, alive as long as this lease
        self.__array_interface__: dict[str, Any] = keep.interface


#: The consumer's map of one worker's segments: ident -> its mapping.
Maps = dict[int, Mapping]


def decode(skeleton: Any, maps: Maps, loan: Loan) -> Any:
    """The batch the skeleton of a ``"batch"`` reply describes, its arrays over the
    consumer's ``maps`` of the worker's segments (a :class:`Flat` travels as a ``"flat"``
    reply instead: see :func:`decode_flat`)."""
    return _decode(skeleton, maps, loan, {}, {})


def decode_flat(keys: tuple[Any, ...], refs: list[tuple[Any, ...]], maps: Maps,
                loan: Loan) -> dict[Any, Any]:
    """The dict a :class:`Flat` describes: each entry an array's place, or a plain value in a
    1-tuple."""
    regions: dict[int, np.ndarray] = {}
    return {key: entry[0] if len(entry) == 1 else _array(entry, maps, loan, regions)
            for key, entry in zip(keys, refs, strict=True)}


def _array(ref: tuple[Any, ...], maps: Maps, loan: Loan, regions: dict[int, np.ndarray]) -> Any:
    """The array at ``ref`` (a :meth:`Ref.fields` tuple), over the batch's one lease of its
    segment (made on first use)."""
    segment, offset, shape, strides, dtype, kind = ref
    region = regions.get(segment)
    if region is None:
        region = regions[segment] = np.asarray(_Lease(loan, maps[segment]))
    array = np.ndarray(shape, dtype_of(dtype), buffer=region, offset=offset, strides=strides)
    if kind:
        if kind & TORCH:
            import torch as module

            return module.from_numpy(array)
        array.flags.writeable = False  # READ_ONLY
    return array


def _decode(value: Any, maps: Maps, loan: Loan, regions: dict[int, np.ndarray],
            memo: dict[int, Any]) -> Any:
    # A module function, not a closure over itself: a recursive closure is a reference cycle
    # that would keep the loan -- and the batch's segments -- until the garbage collector ran.
    # `memo`, as the encoder's: a list or dict held twice, or holding itself, stays one.
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is Opaque:
        return value.value
    if kind is Ref:
        return _array(value.fields(), maps, loan, regions)
    if kind is dict or kind is list:
        done = memo.get(id(value))
        if done is not None:
            return done
        if kind is dict:
            into: dict[Any, Any] = {}
            memo[id(value)] = into
            for k, v in value.items():
                into[k] = _decode(v, maps, loan, regions, memo)
            return into
        items: list[Any] = []
        memo[id(value)] = items
        items.extend([_decode(v, maps, loan, regions, memo) for v in value])
        return items
    if kind is tuple or (isinstance(value, tuple) and hasattr(kind, "_fields")):
        return _rebuilt(value, [_decode(v, maps, loan, regions, memo) for v in value])
    return value
