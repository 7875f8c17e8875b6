"""PyTorch, JAX and Orbax integration. In CI (CI=true) a missing framework fails these tests
(tests/frameworks_required.py); elsewhere they skip. JAX runs only in child processes
(tests/framework_children.py): it starts threads at import, and other tests fork."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import frameworks_required
from frameworks_required import need, need_installed
from loaderx.converter import from_iterator, from_numpy
from loaderx.dataloader import DataLoader
from loaderx.dataset import DenseDataset, RaggedDataset
from loaderx.errors import LoaderxValueError
from loaderx.frameworks import (
    Zip,
    pad_collate,
    prefetch_to_device,
    prefetch_to_torch,
    to_torch,
    torch_batches,
)

N = 200
DATA = np.arange(N * 8, dtype=np.float32).reshape(N, 8) * 0.25
CHILDREN = pathlib.Path(__file__).with_name("framework_children.py")
ROOT = pathlib.Path(__file__).resolve().parent.parent
# The README and the guide: examples that need a framework are fenced ```python torch /
# ```python jax, and run here as scripts of their own (as a user pastes them, spawn workers and
# all), not by test_docs, which runs plain ```python blocks inside the test process.
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FRAMEWORK_EXAMPLE = re.compile(r"^```python (torch|jax)\n(.*?)^```$", re.S | re.M)


@pytest.fixture(scope="module")
def dense_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("fw") / "x"
    from_numpy(path, DATA, codec="zstd")
    return path


@pytest.fixture(scope="module")
def labels_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("fw") / "labels"
    from_numpy(path, np.arange(N) % 7)
    return path


def child(*args, timeout=300):
    """Runs framework_children.py in a new process; its last stdout line, parsed."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    p = subprocess.run([sys.executable, str(CHILDREN), *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


# -- PyTorch ------------------------------------------------------------------------------------


def iterate_pinned(torch, loader):
    """``list(loader)`` of a torch DataLoader made with ``pin_memory=True``. Without an
    accelerator torch warns that it cannot pin (and does not); exactly that warning is
    expected then, any other still fails the test."""
    if torch.accelerator.is_available():
        return list(loader)
    with pytest.warns(UserWarning, match="'pin_memory' argument is set as true but no "
                                         "accelerator is found"):
        return list(loader)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_torch_dataloader_with_worker_processes(dense_path, context):
    torch = need("torch")
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
def test_torch_images_with_labels_pinned(dense_path, labels_path, context):
    torch = need("torch")
    pairs = Zip(DenseDataset(dense_path), DenseDataset(labels_path))
    gen = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(pairs, batch_size=32, shuffle=True, generator=gen,
                                         num_workers=2, collate_fn=to_torch, pin_memory=True,
                                         multiprocessing_context=context)
    batches = iterate_pinned(torch, loader)
    assert all(isinstance(b, tuple) and len(b) == 2 for b in batches)
    pinned = torch.accelerator.is_available()
    assert all(t.is_pinned() == pinned for b in batches for t in b)
    images, targets = (torch.cat(t).numpy() for t in zip(*batches, strict=True))
    order = np.argsort(images[:, 0])
    np.testing.assert_array_equal(images[order], DATA)
    np.testing.assert_array_equal(targets[order], np.arange(N) % 7)


def test_zip_pairs_records_without_a_framework(dense_path, labels_path):
    pairs = Zip(DenseDataset(dense_path), DenseDataset(labels_path))
    x, y = pairs.__getitems__([5, 1, 9])
    np.testing.assert_array_equal(x, DATA[[5, 1, 9]])
    np.testing.assert_array_equal(y, np.array([5, 1, 9]) % 7)
    assert len(pairs) == N and pairs[3][1] == 3
    with pytest.raises(LoaderxValueError, match="one length"):
        Zip(DenseDataset(dense_path), DenseDataset(labels_path).subset([0]))
    with pytest.raises(LoaderxValueError, match="at least one"):
        Zip()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_torch_ragged_recipe_with_worker_processes(tmp_path, context):
    """pad_collate pickles, so spawn workers take it (a lambda collate_fn does not)."""
    torch = need("torch")
    recs = [np.arange(n, dtype=np.int64) for n in (3, 1, 4, 1, 5)]
    from_iterator(tmp_path / "r", recs)
    loader = torch.utils.data.DataLoader(
        RaggedDataset(tmp_path / "r"), batch_size=5, num_workers=1,
        collate_fn=pad_collate(pad_value=-1), multiprocessing_context=context)
    ((batch, lengths),) = list(loader)
    assert batch.shape == (5, 5) and batch[2].tolist() == [0, 1, 2, 3, -1]
    assert lengths.tolist() == [3, 1, 4, 1, 5]


def test_torch_batches_share_memory_with_the_loader(dense_path):
    torch = need("torch")
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
        # Nothing is taken ahead: the loader's checkpoint is the loop's position.
        assert loader.state_dict()["step"] == it.step == it.state_dict()["step"] == 31
    t = to_torch({"a": np.ones(3), "b": [np.zeros(2, np.int32)], "n": 3, "s": "name"})
    assert t["a"].dtype == torch.float64 and t["b"][0].dtype == torch.int32
    assert t["n"] == 3 and t["s"] == "name"


def test_torch_batches_over_a_transform_returning_tensors(dense_path):
    """Was ``TypeError: expected np.ndarray (got Tensor)``: tensors pass through."""
    torch = need("torch")

    def to_tensors(batch):
        return {"x": torch.from_numpy(batch["x"]) * 2, "raw": batch["x"].copy()}

    with DataLoader({"x": DenseDataset(dense_path)}, batch_size=8, seed=3,
                    transform=to_tensors) as loader:
        want = [DATA[loader.batch_indices(s).astype(np.int64)] for s in range(4)]
        got = [next(it) for it in [torch_batches(loader)] for _ in range(4)]
    for g, w in zip(got, want, strict=True):
        assert isinstance(g["x"], torch.Tensor) and isinstance(g["raw"], torch.Tensor)
        np.testing.assert_array_equal(g["x"].numpy(), w * 2)
        np.testing.assert_array_equal(g["raw"].numpy(), w)


def test_prefetch_to_torch_on_the_cpu(dense_path):
    need("torch")
    with DataLoader({"x": DenseDataset(dense_path)}, batch_size=8, seed=4) as loader:
        want = [DATA[loader.batch_indices(s).astype(np.int64)] for s in range(5)]
        batches = prefetch_to_torch(loader, "cpu", size=3)
        got = [next(batches) for _ in range(5)]
        # On the CPU nothing is copied, so nothing is taken ahead.
        assert loader.step == batches.step == loader.state_dict()["step"] == 5
    for g, w in zip(got, want, strict=True):
        assert g["x"].device.type == "cpu"
        np.testing.assert_array_equal(g["x"].numpy(), w)


def test_prefetch_to_torch_on_a_gpu(dense_path):
    """The pinned, side-stream path; runs where CUDA is (not in CI, which has no GPU)."""
    torch = need("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (CI has none; run this test on a GPU machine)")
    with DataLoader({"x": DenseDataset(dense_path)}, batch_size=8, seed=4) as loader:
        want = [DATA[loader.batch_indices(s).astype(np.int64)] for s in range(12)]
        batches = prefetch_to_torch(loader, "cuda", size=3)
        got = []
        for _ in range(6):
            b = next(batches)
            got.append((b["x"] * 1).cpu().numpy())  # used on the current stream
        assert batches.step == loader.state_dict()["step"] == 6 and loader.step == 8
        state = batches.state_dict()
    with DataLoader({"x": DenseDataset(dense_path)}, batch_size=8, seed=4) as resumed:
        resumed.load_state_dict(state)
        got += [b["x"].cpu().numpy() for b, _ in zip(prefetch_to_torch(resumed, "cuda"),
                                                     range(6), strict=False)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_torch_save_round_trip_of_the_checkpoint(dense_path, tmp_path):
    torch = need("torch")
    with DataLoader({"x": DenseDataset(dense_path)}, batch_size=8, seed=6) as loader:
        batches = torch_batches(loader)
        [next(batches) for _ in range(3)]
        torch.save({"loader": batches.state_dict(), "params": torch.zeros(3)}, tmp_path / "c")
        after = next(batches)["x"].numpy().copy()
    state = torch.load(tmp_path / "c", weights_only=True)
    with DataLoader({"x": DenseDataset(dense_path)}, batch_size=8, seed=6) as resumed:
        resumed.load_state_dict(state["loader"])
        np.testing.assert_array_equal(next(torch_batches(resumed))["x"].numpy(), after)


# -- JAX and Orbax (child processes) -----------------------------------------------------------


def test_jax_prefetch_to_device(dense_path):
    need_installed("jax")
    assert child("prefetch_values", dense_path, N) == {"ok": True}


@pytest.mark.parametrize("size", [1, 3])
def test_jax_prefetch_checkpoint_resumes_in_a_new_process(dense_path, size):
    """The finding: with size=k, loader.state_dict() inside the loop was k-1 steps ahead of the
    step being trained, and the resumed run skipped batches that were never trained."""
    need_installed("jax")
    k = 5
    first = child("train", dense_path, k, size)
    assert first["state"]["step"] == k and first["via_prefetcher"] == first["state"]
    second = child("resume", dense_path, k, size, json.dumps(first["state"]))
    assert first["trained"] + second["resumed"] == first["reference"]


def test_orbax_standard_checkpoint_of_loader_and_params(dense_path, tmp_path):
    """{"loader": state_dict(), "params": ...} through Orbax's StandardCheckpointer (was
    ``Unsupported type: str for key ('loader', 'mode')``), restored in a new process, with and
    without an abstract target, resumes exactly."""
    need_installed("jax", "orbax.checkpoint")
    k = 4
    saved = child("orbax_save", dense_path, k, tmp_path / "ckpt")
    restored = child("orbax_restore", dense_path, k, tmp_path / "ckpt")
    for name in ("untargeted", "targeted"):
        assert saved["trained"] + restored[name] == saved["reference"], name
    assert restored["w"] == saved["w"] and restored["steps"] == k


def test_readme_framework_examples_run_as_pasted(tmp_path):
    """Every ```python torch / ```python jax block of the README and the guide, wherever it is,
    runs as a script of its own from a fresh directory of its page (``-W error``)."""
    examples = [(page, kind, code) for page in DOC_PAGES
                for kind, code in FRAMEWORK_EXAMPLE.findall(page.read_text())]
    assert {kind for _, kind, _ in examples} == {"torch", "jax"}, \
        "the README and the guide have a ```python torch and a ```python jax example"
    for i, (page, kind, code) in enumerate(examples):
        if kind == "torch":
            need("torch")
        else:
            need_installed("jax", "orbax.checkpoint")
        where = f"{page.relative_to(ROOT)}, {kind} example {i}"
        cwd = tmp_path / page.stem
        cwd.mkdir(exist_ok=True)
        script = cwd / f"example_{i}_{kind}.py"
        script.write_text(code)
        p = subprocess.run([sys.executable, "-W", "error", str(script)], cwd=cwd,
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "JAX_PLATFORMS": "cpu"})
        assert p.returncode == 0, f"{where}:\n{code}\n{p.stdout}{p.stderr}"


# -- Without the frameworks ---------------------------------------------------------------------


def test_import_loaderx_imports_no_framework():
    code = ("import sys, loaderx\n"
            "from loaderx import Zip, prefetch_to_device, prefetch_to_torch, torch_batches\n"
            "from loaderx import jax_process_shard, pad_collate, to_torch, Prefetcher\n"
            "print(sorted(m for m in ('torch', 'jax', 'orbax') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_helpers_name_the_missing_framework(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_frameworks(name, *args, **kwargs):
        if name.split(".")[0] in ("torch", "jax"):
            raise ImportError(f"no module named {name}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_frameworks)
    for call in (lambda: to_torch(np.ones(2)), lambda: torch_batches([]),
                 lambda: prefetch_to_torch([], "cpu")):
        with pytest.raises(ImportError, match="PyTorch"):
            call()
    with pytest.raises(ImportError, match="JAX"):
        prefetch_to_device(iter([np.ones(2)]))
    with pytest.raises(LoaderxValueError, match="size"):  # checked before the import
        prefetch_to_device([], size=0)


def test_a_missing_framework_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setattr(frameworks_required, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="CI=true must run this test"):
        need("no_such_framework_here")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        need_installed("jax", "no_such_framework_here.sub")
    monkeypatch.setattr(frameworks_required, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        need("no_such_framework_here")
