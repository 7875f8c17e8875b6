"""Handing batches to PyTorch and JAX. Neither is a dependency: each helper imports its
framework when called, so ``import loaderx`` imports neither.

PyTorch, our loader feeding a training loop (zero-copy: the tensor shares the batch's memory
and keeps it out of the buffer pool for as long as it lives; tensors a transform returns pass
through as they are)::

    for batch in torch_batches(loader):        # {name: torch.Tensor}
        loss = model(batch["x"]).loss(batch["y"])

On a GPU, ``prefetch_to_torch(loader, "cuda", size=2)`` copies each batch from pinned memory on a
side stream, ``size`` batches ahead of the step that needs it.

PyTorch's own ``DataLoader`` over our datasets (worker processes, fork or spawn; the dataset
pickles by path and each worker reopens it). ``DenseDataset.__getitems__`` gathers a whole batch
in one call, so pass ``collate_fn=torch.from_numpy``::

    from torch.utils.data import DataLoader as TorchLoader
    TorchLoader(DenseDataset(path), batch_size=256, shuffle=True, num_workers=4,
                collate_fn=torch.from_numpy)

Images with their labels for PyTorch's ``DataLoader``: :class:`Zip` pairs datasets record by
record (one gather per dataset per batch), and ``to_torch`` turns the tuple into tensors::

    TorchLoader(Zip(DenseDataset(images), DenseDataset(labels)), batch_size=256, shuffle=True,
                num_workers=4, collate_fn=to_torch)          # (images, labels) tensors

Ragged records, padded per batch: ``collate_fn=pad_collate(pad_value=-1)`` (picklable, so it
works with spawn workers, which a lambda does not).

JAX, batches put on the devices a few steps ahead of the step that needs them::

    batches = prefetch_to_device(loader, size=2, sharding=sharding)
    for batch in batches:
        state = train_step(state, batch)
        checkpoint = batches.state_dict()      # or loader.state_dict(): the same

Both prefetchers are :class:`~loaderx.prefetch.Prefetcher` objects: their ``step`` and
``state_dict()`` (and the loader's ``state_dict()``) name the next batch the loop gets, not the
batches taken ahead, so a checkpoint resumes with the first batch that was not trained.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import numpy as np

from loaderx._loader.prefetch import Prefetcher
from loaderx._views.dataset import pad
from loaderx.errors import LoaderxValueError

__all__ = ["Zip", "pad_collate", "prefetch_to_device", "prefetch_to_torch", "to_torch",
           "torch_batches"]


class Zip:
    """Record ``i`` of several datasets of one length, as one map-style dataset of tuples:
    ``zip[i]`` is ``(a[i], b[i], ...)`` and ``zip.__getitems__(idxs)`` (what PyTorch's
    ``DataLoader`` calls for a batch) is one gather per dataset, ``(a[idxs], b[idxs], ...)``.
    Pickles as its datasets do (by path), so it travels to worker processes."""

    def __init__(self, *datasets: Any) -> None:
        if not datasets:
            raise LoaderxValueError("Zip needs at least one dataset")
        lengths = [len(d) for d in datasets]
        if len(set(lengths)) != 1:
            raise LoaderxValueError(f"Zip needs datasets of one length, got {lengths}")
        self.datasets = datasets

    def __len__(self) -> int:
        return len(self.datasets[0])

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return tuple(d[index] for d in self.datasets)

    def __getitems__(self, indices: Any) -> tuple[Any, ...]:
        return tuple(d.__getitems__(indices) for d in self.datasets)


def _torch(helper: str) -> Any:
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"{helper} needs PyTorch (pip install torch)") from e
    return torch


def to_torch(batch: Any) -> Any:
    """Every NumPy array of a batch (a dict, list, tuple or array) as a tensor sharing its
    memory (``torch.from_numpy``, no copy); tensors and other values are left as they are."""
    torch = _torch("to_torch")
    return _map_arrays(batch, functools.partial(_as_tensor, torch))


def _as_tensor(torch: Any, value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    return value


def torch_batches(batches: Iterable[Any]) -> Prefetcher:
    """Each batch of ``batches`` (e.g. a :class:`~loaderx.dataloader.DataLoader`) with its
    arrays as torch tensors, zero-copy (:func:`to_torch`). Takes nothing ahead: the loader's
    ``state_dict()`` stays the loop's position (and so is the returned iterator's)."""
    _torch("torch_batches")
    return Prefetcher(batches, to_torch, size=1)


def pad_collate(pad_value: Any = 0, max_len: int | None = None) -> Any:
    """A ``collate_fn`` for PyTorch's ``DataLoader`` over a
    :class:`~loaderx.dataset.RaggedDataset`: pads the batch's records
    (:func:`~loaderx.dataset.pad`) and returns ``(batch, lengths)`` tensors. It pickles (a
    ``functools.partial`` of a module function), so spawn workers can take it."""
    return functools.partial(_pad_to_torch, pad_value=pad_value, max_len=max_len)


def _pad_to_torch(records: Any, *, pad_value: Any, max_len: int | None) -> Any:
    return to_torch(pad(records, max_len=max_len, pad_value=pad_value))


def prefetch_to_device(batches: Iterable[Any], size: int = 2, sharding: Any = None) -> Prefetcher:
    """The batches of ``batches`` as JAX arrays, ``size`` of them in flight to the devices
    ahead of the consumer (``jax.device_put`` is asynchronous, so the copies overlap the
    training step).

    ``sharding`` (a ``jax.sharding.Sharding``) places each array; without it arrays go to the
    default device. In a multi-process job where each process loads its own shard of the global
    batch (``DataLoader(shard_index=..., shard_count=...)``), the arrays are assembled into
    global arrays with ``jax.make_array_from_process_local_data`` (every process must then give
    arrays of one shape: ``loader.epoch(pad=True)`` does for a finite pass).

    Returns a :class:`~loaderx.prefetch.Prefetcher`: checkpoint with its ``state_dict()`` (or
    the loader's; both name the next batch the loop gets, not the ones in flight).
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise LoaderxValueError(f"size must be an integer of at least 1, got {size!r}")
    try:
        import jax
    except ImportError as e:
        raise ImportError("prefetch_to_device needs JAX (pip install jax)") from e

    if sharding is not None and jax.process_count() > 1:
        def put(a: Any) -> Any:
            return jax.make_array_from_process_local_data(sharding, a)
    else:
        def put(a: Any) -> Any:
            return jax.device_put(a, sharding)

    return Prefetcher(batches, functools.partial(_map_arrays, fn=put), size)


def prefetch_to_torch(batches: Iterable[Any], device: Any, size: int = 2) -> Prefetcher:
    """The batches of ``batches`` as torch tensors on ``device`` (``"cuda"``, ``"cuda:1"``, a
    ``torch.device``), ``size`` of them copied ahead of the consumer.

    On CUDA each array is copied into pinned (page-locked) host memory and from there to the
    GPU with ``non_blocking=True`` on a side stream, so the copy overlaps the training step; the
    consumer's current stream waits for a batch's copy (an event, not a device sync) only when
    it takes the batch. On the CPU the tensors share the batches' memory (as
    :func:`torch_batches`) and nothing is taken ahead. Other devices get
    ``tensor.to(device, non_blocking=True)``.

    Returns a :class:`~loaderx.prefetch.Prefetcher` (checkpoint with its ``state_dict()`` or the
    loader's). Tensors a transform returns are moved as they are.
    """
    torch = _torch("prefetch_to_torch")
    device = torch.device(device)
    if device.type == "cpu":
        return Prefetcher(batches, to_torch, size=1)
    if device.type != "cuda":
        def move(value: Any) -> Any:
            # A blocking copy: a non-blocking one from pageable memory may still be reading
            # the batch's buffer when the loader takes it back for another batch (the CUDA
            # path below copies into pinned memory of its own first).
            tensor = _as_tensor(torch, value)
            return tensor.to(device) if torch.is_tensor(tensor) else tensor

        return Prefetcher(batches, functools.partial(_map_arrays, fn=move), size)
    return _CudaCopies(torch, device).prefetcher(batches, size)


class _CudaCopies:
    """Host-to-GPU copies on a side stream, one event per batch."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch = torch
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def prefetcher(self, batches: Iterable[Any], size: int) -> Prefetcher:
        return Prefetcher(batches, self.put, size, deliver=self.deliver)

    def _copy(self, value: Any) -> Any:
        tensor = _as_tensor(self.torch, value)
        if not self.torch.is_tensor(tensor):
            return tensor
        if tensor.device.type == "cpu" and not tensor.is_pinned():
            tensor = tensor.pin_memory()  # a copy into page-locked memory: async DMA needs it
        return tensor.to(self.device, non_blocking=True)

    def put(self, batch: Any) -> tuple[Any, Any]:
        with self.torch.cuda.stream(self.stream):
            moved = _map_arrays(batch, self._copy)
            done = self.torch.cuda.Event()
            done.record(self.stream)
        return moved, done

    def deliver(self, item: tuple[Any, Any]) -> Any:
        moved, done = item
        current = self.torch.cuda.current_stream(self.device)
        current.wait_event(done)

        def in_use_on_current(value: Any) -> Any:
            # Allocated on the side stream: tell the allocator the consumer's stream uses it,
            # so its memory is not reused while that stream may still read it.
            if self.torch.is_tensor(value) and value.is_cuda:
                value.record_stream(current)
            return value

        return _map_arrays(moved, in_use_on_current)


def _map_arrays(batch: Any, fn: Any) -> Any:
    if isinstance(batch, dict):
        return {k: _map_arrays(v, fn) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(_map_arrays(v, fn) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map_arrays(v, fn) for v in batch)
    return fn(batch)
