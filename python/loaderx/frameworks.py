"""Handing batches to PyTorch and JAX. Neither is a dependency: each helper imports its
framework when called.

PyTorch, our loader feeding a training loop (zero-copy: the tensor shares the batch's memory
and keeps it out of the buffer pool for as long as it lives)::

    for batch in torch_batches(loader):        # {name: torch.Tensor}
        loss = model(batch["x"]).loss(batch["y"])

PyTorch's own ``DataLoader`` over our datasets (worker processes, fork or spawn; the dataset
pickles by path and each worker reopens it). ``DenseDataset.__getitems__`` gathers a whole batch
in one call, so pass ``collate_fn=torch.from_numpy``::

    torch.utils.data.DataLoader(DenseDataset(path), batch_size=256, shuffle=True,
                                num_workers=4, collate_fn=torch.from_numpy)

Images with their labels for PyTorch's ``DataLoader``: :class:`Zip` pairs datasets record by
record (one gather per dataset per batch), and ``to_torch`` turns the tuple into tensors::

    torch.utils.data.DataLoader(Zip(DenseDataset(images), DenseDataset(labels)),
                                batch_size=256, shuffle=True, num_workers=4,
                                collate_fn=to_torch)          # (images, labels) tensors

JAX, batches put on the devices a few steps ahead of the step that needs them::

    for batch in prefetch_to_device(loader, size=2, sharding=sharding):
        state = train_step(state, batch)
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from typing import Any

from loaderx.errors import LoaderxValueError

__all__ = ["Zip", "prefetch_to_device", "to_torch", "torch_batches"]


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


def to_torch(batch: Any) -> Any:
    """``torch.from_numpy`` applied to every array of a batch (a dict, list, tuple or array);
    no copy is made."""
    try:
        import torch
    except ImportError as e:
        raise ImportError("to_torch needs PyTorch (pip install torch)") from e
    return _map_arrays(batch, torch.from_numpy)


def torch_batches(batches: Iterable[Any]) -> Iterator[Any]:
    """Yields each batch of ``batches`` (e.g. a :class:`~loaderx.dataloader.DataLoader`) with
    its arrays as torch tensors, zero-copy."""
    for batch in batches:
        yield to_torch(batch)


def prefetch_to_device(
    batches: Iterable[Any], size: int = 2, sharding: Any = None
) -> Iterator[Any]:
    """Yields the batches of ``batches`` as JAX arrays, keeping ``size`` of them in flight to
    the devices ahead of the consumer (``jax.device_put`` is asynchronous, so the copies overlap
    the training step).

    ``sharding`` (a ``jax.sharding.Sharding``) places each array; without it arrays go to the
    default device. In a multi-process job where each process loads its own shard of the global
    batch (``DataLoader(shard_index=..., shard_count=...)``), the arrays are assembled into
    global arrays with ``jax.make_array_from_process_local_data``.
    """
    if size < 1:
        raise LoaderxValueError(f"size must be at least 1, got {size}")
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

    queue: collections.deque[Any] = collections.deque()
    iterator = iter(batches)
    while True:
        while len(queue) < size:
            try:
                batch = next(iterator)
            except StopIteration:
                break
            queue.append(_map_arrays(batch, put))
        if not queue:
            return
        yield queue.popleft()


def _map_arrays(batch: Any, fn: Any) -> Any:
    if isinstance(batch, dict):
        return {k: _map_arrays(v, fn) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map_arrays(v, fn) for v in batch)
    return fn(batch)
