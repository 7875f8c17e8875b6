"""Heavy loops over issue 19's critical and high findings, for ``scripts/stress.py --only
edges``: the suite runs each scenario a few times, this runs it many.

* ``overwrite_kill_loop``: a child replaces one dataset with ``from_numpy(...,
  overwrite=True)`` over and over (half the rounds through the two-rename fallback, as on a file
  system without ``RENAME_EXCHANGE``) and is killed at a random moment; the path must hold one
  generation whole, and the next conversion must leave nothing else beside it.
* ``fork_exit_loop``: children forked while a parent thread is inside a native append exit
  normally (their exit hook must not wait for the parent's call).
* ``prefetch_resume_loop``: checkpoints taken through a prefetcher of every size resume at the
  first batch the loop never trained.
* ``sharded_pass_loop``: padded passes over random lengths, batch sizes and shard counts give
  every shard the same shapes, and the shards' real rows are the whole pass once.
"""

from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np

OVERWRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from loaderx import _native
    from loaderx.converter import from_numpy
    path, first, fallback = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    if fallback:
        def refuse(a, b):
            raise OSError(22, "not supported on this file system")
        _native.rename_exchange = refuse
    print("ready", flush=True)
    g = first
    while True:
        n = 50 + g % 97
        from_numpy(path, np.full((n, 3), g, np.int64), overwrite=True, chunk_bytes=400,
                   progress=False)
        g += 1
""")


def _generation(path: pathlib.Path) -> int:
    """The one generation the dataset at ``path`` holds, whole (else an AssertionError)."""
    from loaderx.dataset import DenseDataset
    with DenseDataset(path) as ds:
        data = ds[:]
    g = int(data[0, 0])
    assert data.shape == (50 + g % 97, 3) and (data == g).all(), f"generation {g} is not whole"
    return g


def _leftovers(path: pathlib.Path) -> list[str]:
    return [e for e in os.listdir(path.parent) if e != path.name and path.name in e]


def overwrite_kill_loop(tmp: str, kills: int, seed: int) -> dict[str, int]:
    from loaderx.converter import from_numpy
    rng = random.Random(seed)
    path = pathlib.Path(tmp) / "ds"
    from_numpy(path, np.full((50, 3), 0, np.int64), progress=False)
    seen: set[int] = set()
    first = 1
    for i in range(kills):
        child = subprocess.Popen([sys.executable, "-c", OVERWRITER, str(path), str(first),
                                  str(i % 2)], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.4))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        g = _generation(path)
        seen.add(g)
        first = g + 1000  # the next child's generations are new ones
        from_numpy(path, np.full((50 + first % 97, 3), first, np.int64), overwrite=True,
                   progress=False)
        assert _generation(path) == first
        assert _leftovers(path) == [], _leftovers(path)
        first += 1
    return {"kills": kills, "distinct_generations_found": len(seen)}


def fork_exit_loop(tmp: str, caught: int, tests_dir: pathlib.Path) -> dict[str, int]:
    """The suite's scenario (tests/test_engine_edges.py), catching ``caught`` forks."""
    sys.path.insert(0, str(tests_dir))
    from test_engine_edges import FORK_AT_EXIT
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(tests_dir), os.environ.get("PYTHONPATH", "")) if p)}
    r = subprocess.run([sys.executable, "-c", FORK_AT_EXIT, f"{tmp}/fork", str(caught)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    _, got, _, forks = r.stdout.split()  # "caught N of M"
    return {"forks": int(forks), "inside_a_native_call": int(got), "hung": 0}


def prefetch_resume_loop(tmp: str, rounds: int, seed: int) -> dict[str, int]:
    from loaderx import DataLoader, DenseDataset, from_numpy
    from loaderx.prefetch import Prefetcher
    rng = random.Random(seed)
    from_numpy(f"{tmp}/pf", np.arange(997, dtype=np.int64), progress=False)
    streams = {"x": DenseDataset(f"{tmp}/pf")}
    for _ in range(rounds):
        size, trained, bs = rng.randint(1, 6), rng.randint(0, 40), rng.randint(1, 64)
        with DataLoader(streams, batch_size=bs, seed=seed, num_workers=rng.randint(0, 3)) as ld:
            expected = [next(ld)["x"].copy() for _ in range(trained + 1)][trained]
        with DataLoader(streams, batch_size=bs, seed=seed, num_workers=2) as ld:
            batches = Prefetcher(ld, lambda b: b, size)
            for _ in range(trained):
                next(batches)
            state = ld.state_dict()
            assert state == batches.state_dict()
        with DataLoader(streams, batch_size=bs, seed=seed, num_workers=1) as resumed:
            resumed.load_state_dict(state)
            assert (next(resumed)["x"] == expected).all(), (size, trained, bs)
    return {"rounds": rounds}


def sharded_pass_loop(tmp: str, rounds: int, seed: int) -> dict[str, int]:
    from loaderx import DataLoader, DenseDataset, from_numpy
    rng = random.Random(seed)
    checked = 0
    for r in range(rounds):
        n = rng.randint(1, 500)
        from_numpy(f"{tmp}/sp{r}", np.arange(n, dtype=np.int64), progress=False)
        streams = {"x": DenseDataset(f"{tmp}/sp{r}")}
        count = rng.randint(1, 5)
        bs = count * rng.randint(1, 40)
        rows: list[np.ndarray] = []
        shapes = set()
        for i in range(count):
            with DataLoader(streams, batch_size=bs, shard_index=i, shard_count=count,
                            num_workers=rng.randint(0, 2)) as ld:
                for b in ld.epoch(pad=True):
                    shapes.add(b["x"].shape)
                    rows.append(b["x"][b["mask"]])
        assert shapes == {(bs // count,)}, shapes
        assert sorted(np.concatenate(rows).tolist()) == list(range(n))
        checked += 1
    return {"passes": checked}
