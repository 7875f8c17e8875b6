"""Programs the JAX and Orbax tests run in processes of their own: JAX starts threads at import
(other tests fork), a resume has to happen in a new process, and ``jax.distributed`` needs one
process per host. ``python framework_children.py NAME ARG...``; each prints one JSON line.

The data is that of ``make_data``: record ``i`` of ``x`` is ``[8 i, ..., 8 i + 7] / 4``.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

BATCH = 10


def make_data(n: int) -> np.ndarray:
    return np.arange(n * 8, dtype=np.float32).reshape(n, 8) * 0.25


def loader_for(path: str, **kwargs):
    from loaderx import DataLoader, DenseDataset

    return DataLoader({"x": DenseDataset(path)}, batch_size=BATCH, seed=2, num_workers=2,
                      **kwargs)


def as_lists(batches) -> list:
    return [np.asarray(b["x"]).tolist() for b in batches]


def take(iterator, k: int) -> list:
    return [next(iterator) for _ in range(k)]


def prefetch_values(path: str, n: str) -> dict:
    """prefetch_to_device yields the loader's batches as jax.Arrays, in order."""
    import jax

    from loaderx import LoaderxError, prefetch_to_device

    data = make_data(int(n))
    with loader_for(path) as loader:
        want = [data[loader.batch_indices(s).astype(np.int64)] for s in range(6)]
        got = take(prefetch_to_device(loader, size=3), 6)
    for g, w in zip(got, want, strict=True):
        assert isinstance(g["x"], jax.Array)
        np.testing.assert_array_equal(np.asarray(g["x"]), w)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    out = list(prefetch_to_device(iter([{"a": np.arange(4)}, {"a": np.arange(4) + 1}]),
                                  size=5, sharding=sharding))
    assert [np.asarray(o["a"]).tolist() for o in out] == [[0, 1, 2, 3], [1, 2, 3, 4]]
    try:
        prefetch_to_device(iter([]), size=0)
    except LoaderxError as e:
        assert "size" in str(e)
    else:
        raise AssertionError("size=0 accepted")
    return {"ok": True}


def train(path: str, k: str, size: str) -> dict:
    """Trains k steps through prefetch_to_device(size=...), then checkpoints as a user would:
    ``loader.state_dict()``; also returns the prefetcher's state and an uninterrupted run."""
    from loaderx import prefetch_to_device

    k_, size_ = int(k), int(size)
    with loader_for(path) as loader:
        batches = prefetch_to_device(loader, size=size_)
        trained = as_lists(take(batches, k_))
        state, via_prefetcher = loader.state_dict(), batches.state_dict()
    with loader_for(path) as whole:
        reference = as_lists(take(prefetch_to_device(whole, size=size_), 2 * k_))
    return {"trained": trained, "state": state, "via_prefetcher": via_prefetcher,
            "reference": reference}


def resume(path: str, k: str, size: str, state: str) -> dict:
    from loaderx import prefetch_to_device

    with loader_for(path) as loader:
        loader.load_state_dict(json.loads(state))
        return {"resumed": as_lists(take(prefetch_to_device(loader, size=int(size)), int(k)))}


def orbax_save(path: str, k: str, directory: str) -> dict:
    """Trains k steps through the prefetcher and saves {"loader", "params"} with Orbax's
    StandardCheckpointer (StandardSave)."""
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    from loaderx import prefetch_to_device

    with loader_for(path) as loader:
        batches = prefetch_to_device(loader, size=2)
        trained = take(batches, int(k))
        params = {"w": sum(b["x"].sum(axis=0) for b in trained), "steps": jnp.int32(int(k))}
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(pathlib.Path(directory).absolute(),
                          {"loader": batches.state_dict(), "params": params})
        checkpointer.wait_until_finished()
    with loader_for(path) as whole:
        reference = as_lists(take(whole, 2 * int(k)))
    return {"trained": as_lists(trained), "reference": reference,
            "w": np.asarray(params["w"]).tolist()}


def orbax_restore(path: str, k: str, directory: str) -> dict:
    """Restores the checkpoint (with an abstract target, and without) and trains on."""
    import jax
    import orbax.checkpoint as ocp

    from loaderx import prefetch_to_device

    checkpointer = ocp.StandardCheckpointer()
    restored = checkpointer.restore(pathlib.Path(directory).absolute())
    with loader_for(path) as probe:
        abstract = {"loader": probe.state_dict(),
                    "params": jax.tree.map(ocp.utils.to_shape_dtype_struct, restored["params"])}
    targeted = checkpointer.restore(pathlib.Path(directory).absolute(), abstract)
    out = {}
    for name, tree in (("untargeted", restored), ("targeted", targeted)):
        with loader_for(path) as loader:
            loader.load_state_dict(tree["loader"])
            out[name] = as_lists(take(prefetch_to_device(loader, size=2), int(k)))
    out["w"] = np.asarray(targeted["params"]["w"]).tolist()
    out["steps"] = int(targeted["params"]["steps"])
    return out


def distributed(port: str, process_id: str, path: str, n: str) -> dict:
    """One of two processes of a jax.distributed job on the CPU (gloo collectives): the sharding
    helpers, global arrays from each host's slice, and a padded, masked evaluation pass."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2,
                               process_id=int(process_id), initialization_timeout=120)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from loaderx import LoaderxError, jax_process_shard, prefetch_to_device

    index, count = jax_process_shard()
    assert (index, count) == (int(process_id), 2), (index, count)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    data = make_data(int(n))

    @jax.jit
    def total(x):
        return x.sum()

    @jax.jit
    def masked(x, mask):  # the sum of the real rows, and their count
        real = mask.astype(x.dtype)
        return (x.sum(axis=1) * real).sum(), real.sum()

    result: dict = {"index": index, "devices": jax.device_count()}
    with loader_for(path, shard_index=index, shard_count=count) as loader:
        batches = prefetch_to_device(loader, size=2, sharding=rows)
        steps = []
        for step in range(3):
            batch = next(batches)
            x = batch["x"]
            whole = data[loader.global_batch_indices(step).astype(np.int64)]
            steps.append({"shape": list(x.shape), "sum": float(total(x)),
                          "want": float(whole.sum())})
        result["steps"] = steps
        result["state"] = batches.state_dict()
        result["loader_state"] = loader.state_dict()

        try:  # n is not a multiple of the batch: the last batch would split unevenly
            loader.epoch()
        except LoaderxError as e:
            result["unpadded"] = type(e).__name__
        else:
            result["unpadded"] = "accepted"
        shapes, summed, real = [], 0.0, 0.0
        for batch in prefetch_to_device(loader.epoch(pad=True), size=2, sharding=rows):
            shapes.append(list(batch["x"].shape))
            s, m = masked(batch["x"], batch["mask"])
            summed, real = summed + float(s), real + float(m)
        result["eval"] = {"shapes": shapes, "sum": summed, "real": real,
                          "want_sum": float(data.sum()), "want_real": int(n)}
    jax.distributed.shutdown()
    return result


def torch_distributed(port: str, rank: str, path: str, n: str) -> dict:
    """One of two processes of a torch.distributed job (gloo, CPU): torch_process_shard, and
    the hosts' slices of each step gathered back into the global batch."""
    import torch
    import torch.distributed as dist

    from loaderx import torch_batches, torch_process_shard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(rank),
                            world_size=2)
    index, count = torch_process_shard()
    data = make_data(int(n))
    same = []
    with loader_for(path, shard_index=index, shard_count=count) as loader:
        batches = torch_batches(loader)
        for step in range(3):
            local = next(batches)["x"]
            parts = [torch.empty_like(local) for _ in range(count)]
            dist.all_gather(parts, local)
            whole = data[loader.global_batch_indices(step).astype(np.int64)]
            same.append(bool((torch.cat(parts).numpy() == whole).all()))
        state = batches.state_dict()
    dist.destroy_process_group()
    return {"shard": [index, count], "same": same, "step": state["step"]}


if __name__ == "__main__":
    name, *args = sys.argv[1:]
    print(json.dumps(globals()[name](*args)))
