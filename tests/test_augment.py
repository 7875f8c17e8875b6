"""Random augmentation that resumes: a transform taking ``ctx`` gets generators derived from
(seed, step, row position) alone, so worker counts, checkpoints (resumed in a new process) and
shard counts change nothing in the augmented batches."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from loaderx.context import BatchContext
from loaderx.converter import from_numpy
from loaderx.dataloader import DataLoader
from loaderx.dataset import DenseDataset

N = 90
BATCH = 12
X = np.arange(N * 4, dtype=np.float64).reshape(N, 4)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    path = tmp_path_factory.mktemp("augment") / "x"
    from_numpy(path, X)
    return path


def augment(batch, *, ctx):
    """Per-record noise from the record's own generator, a batch-wide flip from ctx.rng."""
    noise = np.stack([g.normal(size=4) for g in ctx.record_rngs()])
    flip = bool(ctx.rng.integers(2))
    x = batch["x"] + noise
    return {"x": x[:, ::-1] if flip else x, "seeds": ctx.record_seeds.copy(),
            "rows": ctx.rows.copy(), "indices": ctx.indices.copy(), "step": ctx.step}


def run(path, steps, **kw):
    with DataLoader({"x": DenseDataset(path)}, batch_size=BATCH, seed=11, transform=augment,
                    **kw) as loader:
        return [next(loader) for _ in steps]


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g["x"].tobytes() == w["x"].tobytes() and (g["seeds"] == w["seeds"]).all()


def test_the_context_describes_the_batch(path):
    with DataLoader({"x": DenseDataset(path)}, batch_size=BATCH, seed=11, transform=augment,
                    shard_index=1, shard_count=3, start_step=4) as loader:
        b = next(loader)
        assert b["step"] == 4
        np.testing.assert_array_equal(b["rows"], np.arange(4, 8))
        np.testing.assert_array_equal(b["indices"], loader.batch_indices(4))
        assert len(set(b["seeds"].tolist())) == 4
    ctx = BatchContext(step=0, seed=1, pass_id=None, shard_index=0, shard_count=1,
                       rows=np.arange(3), indices=np.arange(3, dtype=np.uint64))
    with pytest.raises(AttributeError):
        ctx.step = 1
    with pytest.raises(ValueError):
        ctx.rows[0] = 5  # read-only
    assert ctx.rng is ctx.rng and "endless" in repr(ctx)


@pytest.mark.parametrize("workers", [1, 4])
def test_the_same_augmentation_for_any_worker_count(path, workers):
    assert_same(run(path, range(10), num_workers=workers), run(path, range(10), num_workers=0))


def test_a_checkpoint_resumed_in_a_new_process_augments_alike(path, tmp_path):
    """A loader resumed from state_dict() in another process delivers the augmented batches of
    the uninterrupted run (the docs' exact resume reaches through the transform)."""
    want = run(path, range(10), num_workers=2)
    with DataLoader({"x": DenseDataset(path)}, batch_size=BATCH, seed=11,
                    transform=augment) as first:
        for _ in range(6):
            next(first)
        state = first.state_dict()
    code = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        from loaderx.dataloader import DataLoader
        from loaderx.dataset import DenseDataset
        sys.path.insert(0, {__file__.rsplit('/', 1)[0]!r})
        from test_augment import augment
        with DataLoader({{"x": DenseDataset({str(path)!r})}}, batch_size={BATCH}, seed=11,
                        transform=augment, num_workers=3) as loader:
            loader.load_state_dict(json.loads(sys.argv[1]))
            batches = [next(loader) for _ in range(4)]
        np.savez(sys.argv[2], x=np.stack([b["x"] for b in batches]),
                 seeds=np.stack([b["seeds"] for b in batches]))
    """)
    out = tmp_path / "resumed.npz"
    r = subprocess.run([sys.executable, "-c", code, json.dumps(state), str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = np.load(out)
    assert_same([{"x": got["x"][k], "seeds": got["seeds"][k]} for k in range(4)], want[6:])


@pytest.mark.parametrize("count", [2, 3])
def test_each_record_augments_alike_on_any_shard_count(path, count):
    whole = run(path, range(8), num_workers=2)
    shards = [run(path, range(8), num_workers=index, shard_index=index, shard_count=count)
              for index in range(count)]
    joined = [{"x": np.concatenate([s[k]["x"] for s in shards]),
               "seeds": np.concatenate([s[k]["seeds"] for s in shards])} for k in range(8)]
    assert_same(joined, whole)


def test_passes_have_their_own_numbers(path):
    """A pass draws numbers distinct from the endless loader's; one pass_id repeats its
    numbers (repeatable evaluation), another changes them; shards of a padded pass augment
    as the unsharded pass does."""
    with DataLoader({"x": DenseDataset(path)}, batch_size=BATCH, seed=11, transform=augment,
                    num_workers=2) as loader:
        endless = next(loader)
        first, again = list(loader.epoch()), list(loader.epoch())
        other = list(loader.epoch(pass_id=1))
    assert not np.array_equal(first[0]["seeds"], endless["seeds"])
    assert_same(again, first)
    assert not np.array_equal(other[0]["seeds"], first[0]["seeds"])
    parts = []
    for index in range(2):
        with DataLoader({"x": DenseDataset(path)}, batch_size=BATCH, seed=11,
                        transform=augment, shard_index=index, shard_count=2) as loader:
            parts.append(list(loader.epoch(pad=True)))
    for k, batch in enumerate(first):
        n = len(batch["x"])
        joined = np.concatenate([p[k]["x"] for p in parts])[:n]
        assert joined.tobytes() == batch["x"].tobytes(), f"batch {k}"


def test_only_a_parameter_named_ctx_asks_for_it(path):
    seen = []

    def positional(batch, ctx):
        seen.append(type(ctx).__name__)
        return batch

    def keywords(batch, **extra):
        seen.append(sorted(extra))
        return batch

    for transform in (positional, keywords, len):
        with DataLoader({"x": DenseDataset(path)}, batch_size=BATCH, num_workers=0,
                        transform=transform) as loader:
            next(loader)
    assert seen == ["BatchContext", []]
