"""Where this process stands in a multi-host job, read from the job's own framework.

loaderx brings no cluster of its own: the distributed runtime is the user's (JAX multi-process,
``torch.distributed``). These helpers return ``(shard_index, shard_count)`` for
:class:`~loaderx.dataloader.DataLoader`; each imports its framework only when called.

>>> from loaderx.sharding import single_process
>>> single_process()
(0, 1)

With JAX::

    index, count = jax_process_shard()   # jax.process_index(), jax.process_count()
    loader = DataLoader(streams, batch_size=1024, shard_index=index, shard_count=count)

With PyTorch, after ``torch.distributed.init_process_group(...)``::

    index, count = torch_process_shard()  # get_rank(), get_world_size()
"""

from __future__ import annotations

from loaderx.errors import LoaderxError

__all__ = ["jax_process_shard", "single_process", "torch_process_shard"]


def single_process() -> tuple[int, int]:
    """The shard of a job that runs in one process: ``(0, 1)``."""
    return 0, 1


def jax_process_shard() -> tuple[int, int]:
    """``(jax.process_index(), jax.process_count())``. Call it after
    ``jax.distributed.initialize()`` on multi-host jobs (a single process gets ``(0, 1)``)."""
    try:
        import jax
    except ImportError as e:
        raise ImportError("jax_process_shard needs JAX (pip install jax)") from e
    return int(jax.process_index()), int(jax.process_count())


def torch_process_shard() -> tuple[int, int]:
    """``(rank, world_size)`` of the default ``torch.distributed`` process group. Refuses to
    guess when no group is initialized: every process would then load the same data."""
    try:
        import torch.distributed as dist
    except ImportError as e:
        raise ImportError("torch_process_shard needs PyTorch (pip install torch)") from e
    if not dist.is_available() or not dist.is_initialized():
        raise LoaderxError(
            "torch.distributed is not initialized: call torch.distributed.init_process_group() "
            "first, or pass shard_index/shard_count yourself (single_process() for one process)")
    return int(dist.get_rank()), int(dist.get_world_size())
