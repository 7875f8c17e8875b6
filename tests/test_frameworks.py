"""PyTorch and JAX integration. Each test skips when its framework is not installed."""

from __future__ import annotations

import numpy as np
import pytest

from loaderx.converter import from_iterator, from_numpy
from loaderx.dataloader import DataLoader
from loaderx.dataset import DenseDataset, RaggedDataset, pad
from loaderx.frameworks import Zip, prefetch_to_device, to_torch, torch_batches

N = 200
DATA = np.arange(N * 8, dtype=np.float32).reshape(N, 8) * 0.25


@pytest.fixture(scope="module")
def dense_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("fw") / "x"
    from_numpy(path, DATA, codec="zstd")
    return path


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_torch_dataloader_with_worker_processes(dense_path, context):
    torch = pytest.importorskip("torch")
    ds = DenseDataset(dense_path)
    ds[np.arange(N)]  # the parent has used the native pool before the workers fork
    loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=False, num_workers=2,
                                         collate_fn=torch.from_numpy,
                                         multiprocessing_context=context)
    batches = list(loader)
    assert [b.shape[0] for b in batches] == [32] * 6 + [8]
    assert all(isinstance(b, torch.Tensor) and b.dtype == torch.float32 for b in batches)
    np.testing.assert_array_equal(torch.cat(batches).numpy(), DATA)
    # Shuffled, every record exactly once per epoch.
    gen = torch.Generator().manual_seed(0)
    shuffled = torch.utils.data.DataLoader(ds, batch_size=50, shuffle=True, generator=gen,
                                           num_workers=2, collate_fn=torch.from_numpy,
                                           multiprocessing_context=context)
    rows = torch.cat(list(shuffled)).numpy()
    np.testing.assert_array_equal(rows[np.argsort(rows[:, 0])], DATA)
    np.testing.assert_array_equal(ds[7], DATA[7])  # the parent still works


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_torch_images_with_labels(dense_path, tmp_path, context):
    torch = pytest.importorskip("torch")
    labels = np.arange(N) % 7
    from_numpy(tmp_path / "labels", labels)
    pairs = Zip(DenseDataset(dense_path), DenseDataset(tmp_path / "labels"))
    gen = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(pairs, batch_size=32, shuffle=True, generator=gen,
                                         num_workers=2, collate_fn=to_torch,
                                         multiprocessing_context=context)
    images, targets = (torch.cat(t).numpy() for t in zip(*loader, strict=True))
    order = np.argsort(images[:, 0])
    np.testing.assert_array_equal(images[order], DATA)
    np.testing.assert_array_equal(targets[order], labels)


def test_zip_pairs_records_without_a_framework(dense_path, tmp_path):
    from_numpy(tmp_path / "labels", np.arange(N) % 7)
    pairs = Zip(DenseDataset(dense_path), DenseDataset(tmp_path / "labels"))
    x, y = pairs.__getitems__([5, 1, 9])
    np.testing.assert_array_equal(x, DATA[[5, 1, 9]])
    np.testing.assert_array_equal(y, np.array([5, 1, 9]) % 7)
    assert len(pairs) == N and pairs[3][1] == 3
    with pytest.raises(ValueError, match="one length"):
        Zip(DenseDataset(dense_path), DenseDataset(tmp_path / "labels").subset([0]))


def test_torch_ragged_recipe(tmp_path):
    torch = pytest.importorskip("torch")
    recs = [np.arange(n, dtype=np.int64) for n in (3, 1, 4, 1, 5)]
    from_iterator(tmp_path / "r", recs)
    loader = torch.utils.data.DataLoader(
        RaggedDataset(tmp_path / "r"), batch_size=5,
        collate_fn=lambda rs: to_torch(pad(rs, pad_value=-1)))
    ((batch, lengths),) = list(loader)
    assert batch.shape == (5, 5) and batch[2].tolist() == [0, 1, 2, 3, -1]
    assert lengths.tolist() == [3, 1, 4, 1, 5]


def test_torch_batches_share_memory_with_the_loader(dense_path):
    torch = pytest.importorskip("torch")
    with DataLoader({"x": DenseDataset(dense_path)}, batch_size=16, seed=1) as loader:
        want = DATA[loader.batch_indices(0).astype(np.int64)]
        it = torch_batches(loader)
        first = next(it)
        assert isinstance(first["x"], torch.Tensor)
        np.testing.assert_array_equal(first["x"].numpy(), want)
        # Later batches must not overwrite the memory a live tensor uses.
        for _ in range(30):
            next(it)
        np.testing.assert_array_equal(first["x"].numpy(), want)
    t = to_torch({"a": np.ones(3), "b": [np.zeros(2, np.int32)]})
    assert t["a"].dtype == torch.float64 and t["b"][0].dtype == torch.int32


_JAX_SCRIPT = """
import sys
import numpy as np
import jax
from loaderx.dataloader import DataLoader
from loaderx.dataset import DenseDataset
from loaderx.frameworks import prefetch_to_device

path, n = sys.argv[1], int(sys.argv[2])
data = np.arange(n * 8, dtype=np.float32).reshape(n, 8) * 0.25
with DataLoader({"x": DenseDataset(path)}, batch_size=10, seed=2) as loader:
    want = [data[loader.batch_indices(s).astype(np.int64)] for s in range(6)]
    it = prefetch_to_device(loader, size=3)
    got = [next(it) for _ in range(6)]
for g, w in zip(got, want):
    assert isinstance(g["x"], jax.Array)
    np.testing.assert_array_equal(np.asarray(g["x"]), w)
sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
out = list(prefetch_to_device(iter([{"a": np.arange(4)}, {"a": np.arange(4) + 1}]),
                              size=5, sharding=sharding))
assert [np.asarray(o["a"]).tolist() for o in out] == [[0, 1, 2, 3], [1, 2, 3, 4]]
try:
    next(prefetch_to_device(iter([]), size=0))
except ValueError as e:
    assert "size" in str(e)
else:
    raise AssertionError("size=0 accepted")
print("ok")
"""


def test_jax_prefetch_to_device(dense_path):
    """Runs in a subprocess: JAX starts threads at import, and other tests fork."""
    import subprocess
    import sys

    if subprocess.run([sys.executable, "-c", "import jax"], capture_output=True).returncode:
        pytest.skip("JAX is not installed")
    p = subprocess.run([sys.executable, "-c", _JAX_SCRIPT, str(dense_path), str(N)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


def test_helpers_name_the_missing_framework(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_frameworks(name, *args, **kwargs):
        if name.split(".")[0] in ("torch", "jax"):
            raise ImportError(f"no module named {name}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_frameworks)
    with pytest.raises(ImportError, match="PyTorch"):
        to_torch(np.ones(2))
    with pytest.raises(ImportError, match="JAX"):
        next(prefetch_to_device(iter([np.ones(2)])))
