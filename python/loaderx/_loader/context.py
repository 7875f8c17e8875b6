"""The implementation behind :mod:`loaderx.context`, the public module, whose documentation
says what this does and why."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from loaderx.errors import LoaderxValueError
from loaderx.sampler import normalize_seed

__all__ = ["BatchContext", "mark_worker_process"]

#: Whether this process is a loader worker process (``worker_mode="process"``), whose
#: process-global generators are its own: set there by :func:`mark_worker_process`.
_in_worker_process = [False]


def mark_worker_process() -> None:
    """Called by a worker process as it starts (see ``BatchContext.seed_torch``)."""
    _in_worker_process[0] = True

_STREAM_ENDLESS = 0
_STREAM_PASS = 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@dataclass(frozen=True, eq=False)
class BatchContext:
    """The batch a transform is building; see the module documentation.

    * ``step`` -- the batch's step (the endless loader's step, or the batch's index in a pass);
    * ``seed`` -- the loader's seed, as given;
    * ``pass_id`` -- ``None`` for the endless loader, the ``pass_id`` of a finite pass;
    * ``shard_index``, ``shard_count`` -- this process's shard;
    * ``rows`` -- each row's position in the global batch (int64; this shard's rows);
    * ``indices`` -- each row's record index (uint64; what ``batch_indices`` says).
    """

    step: int
    seed: int
    pass_id: int | None
    shard_index: int
    shard_count: int
    rows: np.ndarray
    indices: np.ndarray

    def __post_init__(self) -> None:
        for name in ("rows", "indices"):
            array = np.array(getattr(self, name))  # a private, read-only copy
            array.setflags(write=False)
            object.__setattr__(self, name, array)

    @functools.cached_property
    def _key(self) -> np.random.SeedSequence:
        stream, pass_id = ((_STREAM_ENDLESS, 0) if self.pass_id is None
                           else (_STREAM_PASS, self.pass_id))
        return np.random.SeedSequence([normalize_seed(self.seed), stream, pass_id, self.step])

    @functools.cached_property
    def rng(self) -> np.random.Generator:
        """The batch's generator, the same on every shard (one per context: drawing from it
        advances it)."""
        return np.random.default_rng(self._key)

    @functools.cached_property
    def record_seeds(self) -> np.ndarray:
        """One uint64 seed per row, from ``(seed, step, rows[i])`` (read-only)."""
        start = self._key.generate_state(1, np.uint64)[0]
        z = start + (self.rows.astype(np.uint64) + np.uint64(1)) * _GOLDEN  # wraps mod 2**64
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        seeds = z ^ (z >> np.uint64(31))
        seeds.setflags(write=False)
        return seeds

    def record_rngs(self) -> list[np.random.Generator]:
        """One fresh generator per row, ``np.random.default_rng(record_seeds[i])``."""
        return [np.random.default_rng(int(s)) for s in self.record_seeds]

    @functools.cached_property
    def torch_seed(self) -> int:
        """The batch's torch seed, from ``(seed, step)`` (see the module documentation)."""
        key = np.random.SeedSequence(self._key.entropy, spawn_key=(1,))
        return int(key.generate_state(1, np.uint64)[0]) % (1 << 63)

    def torch_generator(self, device: str = "cpu") -> Any:
        """A fresh ``torch.Generator`` on ``device`` seeded with :attr:`torch_seed`: for
        draws that take a generator (``torch.rand(..., generator=g)``, ``torch.randperm``),
        exact in thread and process workers alike."""
        import torch

        generator = torch.Generator(device=device)
        generator.manual_seed(self.torch_seed)
        return generator

    def seed_torch(self) -> None:
        """Seeds torch's process-global generator with :attr:`torch_seed`, so that the random
        transforms of ``torchvision.transforms.v2`` -- which draw from that generator -- give
        the same augmentation of this batch whichever worker builds it, on resume too. Call it
        at the start of the transform, then run the pipeline over the batch's samples in order.

        Only in a worker process (``worker_mode="process"``): in thread workers and with
        ``num_workers=0`` that generator is shared with the training loop and every other
        worker, and this refuses (LoaderxValueError)."""
        if not _in_worker_process[0]:
            raise LoaderxValueError(
                "ctx.seed_torch() seeds torch's process-global generator, which in thread "
                "workers (and with num_workers=0) the training loop and every other worker "
                "share: no seeding can make their draws exact there, and it would reseed the "
                "training loop's own. Use worker_mode='process', or draw the augmentation's "
                "parameters from ctx.rng / ctx.record_rngs() (or ctx.torch_generator()) and "
                "apply them with torchvision.transforms.v2.functional")
        import torch

        torch.manual_seed(self.torch_seed)

    def __repr__(self) -> str:
        where = "endless" if self.pass_id is None else f"pass {self.pass_id}"
        return (f"BatchContext(step={self.step}, seed={self.seed}, {where}, "
                f"shard={self.shard_index}/{self.shard_count}, rows={len(self.rows)})")
