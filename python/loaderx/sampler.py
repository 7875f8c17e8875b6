"""Batch index sampler: every batch is a pure function of (seed, step).

``Sampler(length, batch_size, mode, seed=42)`` yields, endlessly, uint64 NumPy arrays of
``batch_size`` indices into ``range(length)``. There is no epoch state: ``seek(k)`` followed by
``next()`` gives exactly the batch a fresh sampler gives at step ``k``, so a training run resumes
by saving one integer (see ``state_dict``). Each batch is one native call that writes straight into
a new NumPy array.

Modes (``Sampler.Mode``, also accepted by name, case-insensitive, or as 0, 1, 2):

``SEQUENTIAL`` (0)
    Batch ``k`` is ``[(k * batch_size + j) % length for j in range(batch_size)]``: a window
    sliding over the index space taken as a circular queue, so the tail never truncates.
``IID`` (1)
    Uniform draws with replacement, exactly unbiased (Lemire's multiply-shift with rejection),
    from a counter-based generator keyed by (seed, step).
``CYCLIC`` (2)
    Without replacement. Cycle ``c`` walks a fresh pseudo-random permutation of
    ``range(length)`` (a keyed Feistel network with cycle-walking; nothing the size of the
    dataset is built). Every batch holds ``batch_size`` distinct indices; a cycle is
    ``length // batch_size`` batches, and when ``batch_size`` does not divide ``length`` the
    remaining ``length % batch_size`` positions of each cycle are dropped (different indices each
    cycle, so every record is reached over time). Requires ``batch_size <= length``.

Lengths from 1 to ``2**64 - 1`` work. The sequences are part of the public contract and are
frozen by known-answer vectors (``tests/sampler_vectors.json``).

Seeds
-----
Any integer is a seed (a Python ``int`` or anything with ``__index__``, such as NumPy integers;
``bool`` is refused). The native generator is keyed by an unsigned 64-bit value, obtained by
``normalize_seed``:

* a seed in ``[-2**63, 2**64)`` maps to ``seed % 2**64``, i.e. its 64-bit two's-complement bit
  pattern: ``-1`` and ``2**64 - 1`` are the same seed, as are ``np.int64(-5)`` and
  ``np.uint64(2**64 - 5)``;
* any other seed maps to the 64-bit BLAKE2b digest (``digest_size=8``,
  ``person=b"loaderx.sampler"``) of its minimal little-endian two's-complement bytes
  (``seed.to_bytes((seed.bit_length() + 8) // 8, "little", signed=True)``), read as a
  little-endian unsigned integer. So ``2**64`` and ``0`` are different seeds.

``Sampler.seed`` and ``state_dict()`` keep the integer as given.
"""

from __future__ import annotations

import enum
import hashlib
import operator
from typing import Any, Literal

import numpy as np

from . import _native
from .errors import LoaderxValueError

__all__ = ["Mode", "ModeLike", "Sampler", "normalize_seed"]

_U64_LIMIT = 1 << 64
_MAX_BATCH = int(np.iinfo(np.intp).max)
_UINT64 = np.dtype(np.uint64)
_STATE_KEYS = ("length", "batch_size", "mode", "seed", "step")


class Mode(enum.IntEnum):
    """Sampling mode; ``Mode("cyclic")``, ``Mode("IID")`` and ``Mode(2)`` all work."""

    SEQUENTIAL = 0
    IID = 1
    CYCLIC = 2

    @classmethod
    def _missing_(cls, value: object) -> Mode | None:
        if isinstance(value, str):
            return cls.__members__.get(value.strip().upper())
        return None


#: What a ``mode=`` argument may be: a :class:`Mode`, its name, or its integer (the
#: reference's). Type checkers then flag ``mode="shuffle"``.
ModeLike = Mode | Literal["sequential", "iid", "cyclic", "SEQUENTIAL", "IID", "CYCLIC", 0, 1, 2]


def _integer(value: Any, what: str) -> int:
    """``value`` as a Python int, or a ValueError naming ``what``."""
    if isinstance(value, bool):
        raise LoaderxValueError(f"{what} must be an integer, got a bool ({value!r})")
    try:
        return operator.index(value)
    except TypeError:
        raise LoaderxValueError(
            f"{what} must be an integer, got {type(value).__name__} ({value!r})"
        ) from None


# The class attribute Sampler.Mode shadows the name inside the class body.
_Mode = Mode


def _mode(value: Any) -> Mode:
    if isinstance(value, Mode):
        return value
    key: object = value
    if not isinstance(value, str):
        try:
            key = _integer(value, "mode")
        except ValueError:
            key = None
    try:
        return Mode(key)  # type: ignore[arg-type]  # any value; Mode refuses what it is not
    except ValueError:
        pass
    raise LoaderxValueError(
        f"mode must be 'sequential', 'iid' or 'cyclic' (or 0, 1, 2), got {value!r}"
    )


def _u64(value: Any, what: str, low: int) -> int:
    v = _integer(value, what)
    if not low <= v < _U64_LIMIT:
        raise LoaderxValueError(f"{what} must be in [{low}, 2**64 - 1], got {v}")
    return v


def normalize_seed(seed: Any) -> int:
    """The unsigned 64-bit key for an integer seed; see the module documentation."""
    s = _integer(seed, "seed")
    if -(1 << 63) <= s < _U64_LIMIT:
        return s % _U64_LIMIT
    raw = s.to_bytes((s.bit_length() + 8) // 8, "little", signed=True)
    digest = hashlib.blake2b(raw, digest_size=8, person=b"loaderx.sampler").digest()
    return int.from_bytes(digest, "little")


class Sampler:
    """Endless batches of indices into ``range(length)``; see the module documentation.

    ``next()`` (and iteration) returns a new uint64 array of ``batch_size`` indices per call,
    ``batch(step)`` any batch without moving, ``seek(step)`` repositions, and ``step`` is the step
    of the batch ``next()`` returns next. Bad arguments raise ``ValueError``.
    """

    Mode = _Mode

    __slots__ = ("_native", "_next_into", "_fill", "_length", "_batch_size", "_mode", "_seed")

    def __init__(self, length: int, batch_size: int, mode: ModeLike, seed: Any = 42) -> None:
        length = _u64(length, "length", 1)
        batch_size = _u64(batch_size, "batch_size", 1)
        if batch_size > _MAX_BATCH:
            raise LoaderxValueError(f"batch_size must be at most {_MAX_BATCH}, got {batch_size}")
        mode = _mode(mode)
        key = normalize_seed(seed)
        self._native = _native.Sampler(length, batch_size, int(mode), key)
        self._next_into = self._native.next_into
        self._fill = self._native.fill
        self._length = length
        self._batch_size = batch_size
        self._mode = mode
        self._seed = _integer(seed, "seed")

    # -- batches -----------------------------------------------------------------------------

    def next(self) -> np.ndarray:
        """The batch at ``step`` as a new uint64 array; advances ``step`` by one."""
        out = np.empty(self._batch_size, _UINT64)
        self._next_into(out)
        return out

    __next__ = next

    def __iter__(self) -> Sampler:
        return self

    def batch(self, step: int) -> np.ndarray:
        """The batch at ``step`` as a new uint64 array, without moving the sampler."""
        if type(step) is not int or not 0 <= step < _U64_LIMIT:  # the loader's ints pass as is
            step = _u64(step, "step", 0)
        out = np.empty(self._batch_size, _UINT64)
        self._fill(step, out)
        return out

    def seek(self, step: int) -> None:
        """Make ``step`` the batch ``next()`` returns next."""
        self._native.seek(_u64(step, "step", 0))

    # -- properties --------------------------------------------------------------------------

    @property
    def step(self) -> int:
        """The step of the batch ``next()`` returns next."""
        return self._native.step

    @property
    def length(self) -> int:
        return self._length

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def mode(self) -> _Mode:
        return self._mode

    @property
    def seed(self) -> int:
        """The seed as given (``normalize_seed(seed)`` is what keys the generator)."""
        return self._seed

    @property
    def batches_per_cycle(self) -> int | None:
        """``length // batch_size`` in cyclic mode, ``None`` in the others."""
        return self._length // self._batch_size if self._mode is Mode.CYCLIC else None

    # -- state -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild this sampler at its current step (plain ints and str)."""
        return {
            "length": self._length,
            "batch_size": self._batch_size,
            "mode": self._mode.name.lower(),
            "seed": self._seed,
            "step": self.step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state["step"]``.

        The state must describe this sampler (same length, batch_size, mode and seed): a state
        from another configuration would silently give another sequence, so it is a ValueError.
        Use ``Sampler.from_state_dict`` to build a sampler from any state.
        """
        length, batch_size, mode, seed, step = self._parse_state(state)
        ours = (self._length, self._batch_size, self._mode, normalize_seed(self._seed))
        theirs = (length, batch_size, mode, normalize_seed(seed))
        if ours != theirs:
            names = ("length", "batch_size", "mode", "seed")
            def shown(v: Any) -> str:  # a mode by its name, as it is passed in
                return repr(v.name.lower()) if isinstance(v, Mode) else repr(v)

            diff = ", ".join(
                f"{n}: {shown(b)} in the state, {shown(a)} here"
                for n, a, b in zip(names, ours, theirs, strict=True)
                if a != b
            )
            raise LoaderxValueError(f"state_dict is for a different sampler ({diff})")
        self.seek(step)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Sampler:
        """A sampler built from ``state`` and positioned at its step."""
        length, batch_size, mode, seed, step = cls._parse_state(state)
        sampler = cls(length, batch_size, mode, seed)
        sampler.seek(step)
        return sampler

    @staticmethod
    def _parse_state(state: Any) -> tuple[int, int, _Mode, int, int]:
        if not isinstance(state, dict):
            raise LoaderxValueError(f"state_dict must be a dict, got {type(state).__name__}")
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise LoaderxValueError(f"state_dict is missing {', '.join(missing)}")
        return (
            _u64(state["length"], "length", 1),
            _u64(state["batch_size"], "batch_size", 1),
            _mode(state["mode"]),
            _integer(state["seed"], "seed"),
            _u64(state["step"], "step", 0),
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self).from_state_dict, (self.state_dict(),))

    def __repr__(self) -> str:
        return (
            f"Sampler(length={self._length}, batch_size={self._batch_size}, "
            f"mode={self._mode.name.lower()!r}, seed={self._seed}, step={self.step})"
        )
