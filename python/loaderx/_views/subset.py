"""The implementation behind :mod:`loaderx.subset`, the public module, whose documentation
says what this does and why."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, overload

import numpy as np

from loaderx._views.gather import _dense_gather, _indices, _one_index
from loaderx.errors import LoaderxIndexError, LoaderxValueError

__all__ = ["Subset", "split"]


class Subset:
    """The records ``indices`` of ``dataset`` as a dataset of their own (see the module docs).

    ``indices`` is anything a dataset accepts as an index (an int array or list, a slice, a
    boolean mask); they are checked against the dataset's length now, and kept in the given
    order. Duplicates are allowed (a record then appears twice).
    """

    _base: Any
    _indices: np.ndarray

    def __init__(self, dataset: Any, indices: Any) -> None:
        if isinstance(dataset, Subset):  # a subset of a subset: one level of indirection
            indices = dataset._indices[_indices(indices, len(dataset)).reshape(-1)]
            dataset = dataset._base
        else:
            indices = _indices(indices, len(dataset)).reshape(-1)
        self._base = dataset
        self._indices = np.ascontiguousarray(indices, dtype=np.uint64)
        self._indices.setflags(write=False)
        self.kind: str = dataset.kind
        if self.kind == "dense":
            self.record_bytes = dataset.record_bytes
        # A stream's companion arrays (loaderx.source) follow it into its subsets, at the
        # records the subset maps to. A partial, not a bound method: no reference cycle.
        if callable(getattr(dataset, "companions", None)):
            self.companions = functools.partial(_mapped_companions, dataset.companions,
                                                self._indices)
            if callable(getattr(dataset, "companion_names", None)):
                self.companion_names = dataset.companion_names

    # -- what the datasets share ------------------------------------------------------------------

    @property
    def dataset(self) -> Any:
        """The dataset the records come from."""
        return self._base

    @property
    def indices(self) -> np.ndarray:
        """Each record's index in :attr:`dataset` (read-only uint64 array)."""
        return self._indices

    @functools.cached_property
    def digest(self) -> str:
        """A short digest of :attr:`indices` (computed once: they are read-only)."""
        return hashlib.sha1(self._indices.tobytes()).hexdigest()[:16]

    @property
    def dtype(self) -> np.dtype:
        return self._base.dtype

    @property
    def item_shape(self) -> tuple[int, ...]:
        return self._base.item_shape

    @property
    def path(self) -> str:
        return self._base.path

    @property
    def closed(self) -> bool:
        return self._base.closed

    @property
    def recently_cold(self) -> bool:
        return self._base.recently_cold

    def __len__(self) -> int:
        return len(self._indices)

    def close(self) -> None:
        """Closes the underlying dataset."""
        self._base.close()

    def __enter__(self) -> Subset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        return (Subset, (self._base, self._indices))

    def __repr__(self) -> str:
        return f"Subset({self._base!r}, {len(self)} of {len(self._base)} records)"


    # -- reading ---------------------------------------------------------------------------------

    def _map(self, idx: Any) -> np.ndarray:
        return self._indices[_indices(idx, len(self))]

    def __getitem__(self, idx: Any) -> Any:
        one = _one_index(idx, len(self))
        if one is not None:
            return self._base[int(self._indices[one])]
        return self._base[self._map(idx)]

    def __getitems__(self, idxs: Sequence[int]) -> Any:
        return self._base.__getitems__(self._map(idxs).reshape(-1))

    def gather(self, idxs: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Dense subsets: records ``idxs`` as one ``(len(idxs), *item_shape)`` array."""
        return _dense_gather(self, idxs, out)

    def subset(self, indices: Any) -> Subset:
        """The records ``indices`` of this subset, as a subset of the same dataset."""
        return Subset(self, indices)

    def prefetch(self, idxs: Any) -> bool:
        """Starts reading records ``idxs`` into the page cache without waiting."""
        flat = np.asarray(idxs, dtype=np.uint64).reshape(-1)
        return bool(self._base.prefetch(self._indices[flat[flat < len(self)]]))

    @property
    def view_digest(self) -> str:
        """Which records of its dataset this view holds (:attr:`digest`)."""
        return self.digest

    def gather_rows(self, idxs: np.ndarray, dst: np.ndarray, shards: int | None = None,
                    rows: np.ndarray | None = None) -> None:
        """Dense subsets: the loader's gather, through the index map (see
        :mod:`loaderx.source`)."""
        self._base.gather_rows(self._mapped(idxs), dst, shards, rows)


    def record_nbytes(self, idxs: np.ndarray) -> np.ndarray:
        """Ragged subsets: each record's byte length, through the index map (see
        :mod:`loaderx.source`)."""
        return self._base.record_nbytes(self._mapped(idxs))

    def gather_at(self, idxs: np.ndarray, dst: np.ndarray, offsets: np.ndarray) -> None:
        """Ragged subsets: the loader's gather, through the index map (see
        :mod:`loaderx.source`)."""
        self._base.gather_at(self._mapped(idxs), dst, offsets)

    def _mapped(self, idxs: np.ndarray) -> np.ndarray:
        """The base dataset's indices of the loader's ``idxs`` (uint64), checked."""
        if len(idxs) and int(idxs.max()) >= len(self):
            bad = int(idxs[idxs >= len(self)][0])
            raise LoaderxIndexError(
                f"index {bad} is out of range for a subset of {len(self)} records")
        return self._indices[idxs]


def _mapped_companions(companions: Any, indices: np.ndarray, name: str,
                       idxs: np.ndarray) -> Any:
    return companions(name, indices[idxs])


@overload
def split(dataset: Mapping[str, Any], fractions: Sequence[float], *,
          seed: int = 0) -> list[dict[str, Subset]]: ...
@overload
def split(dataset: Any, fractions: Sequence[float], *, seed: int = 0) -> list[Subset]: ...


def split(dataset: Any, fractions: Sequence[float], *, seed: int = 0) -> list[Any]:
    """Disjoint subsets of ``dataset`` of the given ``fractions`` of its records, drawn from a
    permutation seeded by ``seed`` (the same seed gives the same split), each subset's indices
    in ascending order. Fractions must be positive and add up to at most 1; the records left
    over by rounding go to the first subsets, one each, when they add up to 1.

    ``dataset`` may be a dict of aligned streams of one length (``{"x": images, "y":
    labels}``): each part is then a dict of subsets at the same indices, so images keep their
    labels -- ``[{"x": x_train, "y": y_train}, {"x": x_val, "y": y_val}]`` for
    ``[0.8, 0.2]`` -- the way to split data held in several datasets (two separate calls pair
    records wrongly unless both get the same seed)."""
    fr = [float(f) for f in fractions]
    if not fr or any(not f > 0 for f in fr) or sum(fr) > 1 + 1e-9:
        raise LoaderxValueError(
            f"fractions must be positive and add up to at most 1, got {fractions}")
    streams = dict(dataset) if isinstance(dataset, Mapping) else None
    if streams is not None:
        if not streams:
            raise LoaderxValueError("split() got an empty dict; pass {name: dataset, ...}")
        lengths = {name: len(ds) for name, ds in streams.items()}
        if len(set(lengths.values())) != 1:
            raise LoaderxValueError(
                f"the streams to split must have one length (they are split at the same "
                f"indices), got {lengths}")
        n = next(iter(lengths.values()))
    else:
        n = len(dataset)
    counts = [int(f * n) for f in fr]
    if abs(sum(fr) - 1) <= 1e-9:
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
    order = np.random.default_rng(seed).permutation(n)
    parts, start = [], 0
    for c in counts:
        parts.append(np.sort(order[start:start + c]).astype(np.uint64))
        start += c
    if streams is None:
        return [Subset(dataset, idx) for idx in parts]
    return [{name: Subset(ds, idx) for name, ds in streams.items()} for idx in parts]
