"""Multi-host sharding: every process loads its contiguous slice of the same global batch.

Shard counts 1-4 x worker counts 1-4 each run as separate processes (one per shard), including a
run that checkpoints on one shard count and resumes on another; the concatenated slices must be
bit-equal to the unsharded run.
"""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

from loaderx.converter import from_numpy
from loaderx.dataloader import DataLoader
from loaderx.dataset import DenseDataset
from loaderx.sampler import Sampler

N = 96          # divisible by the global batch: cyclic cycles are exact
BATCH = 12      # divisible by 1, 2, 3 and 4 shards
STEPS = 20
DATA = np.arange(N * 5, dtype=np.float64).reshape(N, 5) / 3
LABEL = (np.arange(N) * 7 % 13).astype(np.int32)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    from_numpy(root / "x", DATA, codec="zstd")
    from_numpy(root / "y", LABEL, codec="raw")
    return root


def open_streams(root) -> dict[str, DenseDataset]:
    return {"x": DenseDataset(root / "x"), "y": DenseDataset(root / "y")}


def unsharded(root, steps: range) -> list[dict[str, np.ndarray]]:
    with DataLoader(open_streams(root), batch_size=BATCH, num_workers=2, seed=5,
                    start_step=steps.start) as loader:
        return [next(loader) for _ in steps]


def _run_shard(root, index: int, count: int, workers: int, steps: range, state, out: str):
    """One host: loads its slices of `steps` (resuming from `state` when given) into `out`."""
    loader = DataLoader(open_streams(root), batch_size=BATCH, num_workers=workers, seed=5,
                        shard_index=index, shard_count=count, start_step=steps.start)
    if state is not None:
        loader.load_state_dict(state)
    batches = [next(loader) for _ in steps]
    final = loader.state_dict()
    loader.close()
    np.savez(out, x=np.stack([b["x"] for b in batches]), y=np.stack([b["y"] for b in batches]),
             step=final["step"])


def run_hosts(root, tmp_path, count: int, workers: int, steps: range, state=None):
    """Runs `count` shard processes; returns the global batches they form together, per step."""
    ctx = mp.get_context("fork")
    outs = [str(tmp_path / f"c{count}w{workers}s{steps.start}-{i}.npz") for i in range(count)]
    procs = [ctx.Process(target=_run_shard, args=(root, i, count, workers, steps, state, o))
             for i, o in enumerate(outs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0, f"shard process failed with exit code {p.exitcode}"
    parts = [np.load(o) for o in outs]
    assert all(int(p["step"]) == steps.stop for p in parts)
    return [{"x": np.concatenate([p["x"][k] for p in parts]),
             "y": np.concatenate([p["y"][k] for p in parts])} for k in range(len(steps))]


def assert_same(got, want, what):
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g["x"].tobytes() == w["x"].tobytes(), f"{what}: step {k} x"
        assert g["y"].tobytes() == w["y"].tobytes(), f"{what}: step {k} y"


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_shards_in_separate_processes_form_the_unsharded_batches(root, tmp_path, count):
    want = unsharded(root, range(STEPS))
    for workers in (1, 2, 3, 4):
        got = run_hosts(root, tmp_path, count, workers, range(STEPS))
        assert_same(got, want, f"{count} shards x {workers} workers")


def test_resume_on_another_shard_count_and_worker_count(root, tmp_path):
    want = unsharded(root, range(STEPS))
    half = STEPS // 2
    first = run_hosts(root, tmp_path, 4, 1, range(half))
    with DataLoader(open_streams(root), batch_size=BATCH, seed=5, shard_index=1,
                    shard_count=4) as loader:
        loader.seek(half)
        state = loader.state_dict()  # a checkpoint written by any one host
    assert "shard_count" not in state and "num_workers" not in state
    second = run_hosts(root, tmp_path, 3, 2, range(half, STEPS), state)
    assert_same(first + second, want, "4 shards, resumed on 3")
    third = run_hosts(root, tmp_path, 1, 4, range(half, STEPS), state)
    assert_same(first + third, want, "4 shards, resumed on 1")


def test_slices_are_disjoint_and_cover_each_cycle_once(root):
    count = 4
    loaders = [DataLoader(open_streams(root), batch_size=BATCH, num_workers=1, seed=9,
                          shard_index=i, shard_count=count) for i in range(count)]
    per_cycle = N // BATCH
    for cycle in range(3):
        seen = []
        for _ in range(per_cycle):
            step_rows = [loader.batch_indices(loader.step) for loader in loaders]
            batches = [next(loader) for loader in loaders]
            flat = np.concatenate(step_rows)
            assert len(set(flat.tolist())) == BATCH, "shards of one step overlap"
            for rows, b in zip(step_rows, batches, strict=True):
                np.testing.assert_array_equal(b["y"], LABEL[rows.astype(np.int64)])
                assert b["x"].shape == (BATCH // count, 5)
            seen.extend(flat.tolist())
        assert sorted(seen) == list(range(N)), f"cycle {cycle} is not a permutation"
    for loader in loaders:
        loader.close()


def test_shard_indices_match_the_sampler(root):
    with DataLoader(open_streams(root), batch_size=BATCH, seed=3, mode="iid", shard_index=2,
                    shard_count=3) as loader:
        sampler = Sampler(N, BATCH, "iid", 3)
        for step in range(5):
            np.testing.assert_array_equal(loader.global_batch_indices(step), sampler.batch(step))
            np.testing.assert_array_equal(loader.batch_indices(step), sampler.batch(step)[8:12])
        assert (loader.shard_index, loader.shard_count) == (2, 3)
        assert "shard=2/3" in repr(loader)


def test_bad_shard_arguments_are_clear_errors(root):
    streams = open_streams(root)
    with pytest.raises(ValueError, match="does not divide into 5 shards"):
        DataLoader(streams, batch_size=BATCH, shard_count=5)
    with pytest.raises(ValueError, match=r"shard_index must be in \[0, 4\)"):
        DataLoader(streams, batch_size=BATCH, shard_index=4, shard_count=4)
    with pytest.raises(ValueError, match="shard_count"):
        DataLoader(streams, batch_size=BATCH, shard_count=0)
    with pytest.raises(ValueError, match="shard_index must be an integer"):
        DataLoader(streams, batch_size=BATCH, shard_index=0.5, shard_count=2)


def test_framework_helpers_import_lazily_and_refuse_to_guess():
    import subprocess
    import sys

    code = ("import sys, loaderx.sharding, loaderx.dataloader; "
            "print('torch' in sys.modules, 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=dict(os.environ)).stdout
    assert out.split() == ["False", "False"]
    from loaderx import sharding

    assert sharding.single_process() == (0, 1)
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="PyTorch"):
            sharding.torch_process_shard()
    else:
        with pytest.raises(RuntimeError, match="not initialized"):
            sharding.torch_process_shard()
    # JAX starts threads at import, which makes later fork()s in this process unsafe: ask it in
    # a subprocess.
    probe = subprocess.run([sys.executable, "-c", "import jax"], capture_output=True)
    code = ("from loaderx import sharding\n"
            "try:\n    print(sharding.jax_process_shard())\n"
            "except ImportError as e:\n    print('ImportError', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    if probe.returncode == 0:
        assert out == "(0, 1)"
    else:
        assert out.startswith("ImportError") and "JAX" in out


@pytest.mark.parametrize("count", [1, 2, 3, 4])
@pytest.mark.parametrize("length", [91, 96, 5])
def test_a_padded_pass_gives_every_shard_the_same_shapes(root, count, length):
    """epoch(pad=True) on `count` hosts: every batch of every shard has BATCH // count rows
    (the global arrays a multi-host step builds have one shape everywhere), the mask marks
    the real rows, and the real rows of the shards, concatenated, are the whole pass in order.
    (Without pad, the last batch of 91 records split 6/5 rows across two hosts.)"""
    streams = {k: ds.subset(range(length)) for k, ds in open_streams(root).items()}
    steps = -(-length // BATCH)
    shards = []
    for index in range(count):
        with DataLoader(streams, batch_size=BATCH, shard_index=index, shard_count=count,
                        num_workers=index % 3, seed=1) as loader:
            p = loader.epoch(pad=True)
            assert len(p) == steps
            shards.append(list(p))
    for batches in shards:
        assert len(batches) == steps
        for b in batches:
            assert sorted(b) == ["mask", "x", "y"]
            assert b["x"].shape == (BATCH // count, 5) and b["y"].shape == (BATCH // count,)
            assert b["mask"].shape == (BATCH // count,) and b["mask"].dtype == np.bool_
    real = np.concatenate([b["y"][b["mask"]] for k in range(steps) for b in
                           (s[k] for s in shards)])
    np.testing.assert_array_equal(real, LABEL[:length])
    whole = np.concatenate([np.concatenate([s[k]["x"] for s in shards]) for k in range(steps)])
    mask = np.concatenate([np.concatenate([s[k]["mask"] for s in shards]) for k in range(steps)])
    positions = np.arange(steps * BATCH)
    np.testing.assert_array_equal(mask, positions < length)
    # Padding rows are real records, repeated from the start of the data.
    np.testing.assert_array_equal(whole, DATA[positions % length])
