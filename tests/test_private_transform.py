"""Thread workers on a free-threaded interpreter run an imported transform from a private copy
of its module made in their own thread (loaderx._loader.private_transform): the same batches
as one thread, ``ctx`` augmentation included; module state per thread; nothing changes on a
GIL build or with ``LOADERX_PRIVATE_TRANSFORM=0``; library modules and ``__main__`` are never
copied."""

from __future__ import annotations

import importlib
import pathlib
import sys

import numpy as np
import pytest

from loaderx import DataLoader, DenseDataset, from_numpy
from loaderx._loader import private_transform as pt
from loaderx._loader.host import gil_enabled

MODULE = '''
import numpy as np
SEEN = set()

def tag(batch):
    SEEN.add(__name__)
    return {"x": batch["x"] * 2, "where": __name__}

def augment(batch, ctx):
    rng = ctx.rng
    return {"x": batch["x"] + rng.integers(0, 1000, size=batch["x"].shape)}
'''


@pytest.fixture
def module(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
    name = f"lx_private_probe_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module(name)
    yield mod
    sys.modules.pop(name, None)


@pytest.fixture
def streams(tmp_path: pathlib.Path):
    from_numpy(tmp_path / "x", np.arange(400, dtype=np.int64))
    with DenseDataset(tmp_path / "x") as x:
        yield {"x": x}


def _run(streams, transform, workers: int, steps: int = 12) -> list:
    with DataLoader(streams, batch_size=16, seed=5, num_workers=workers, transform=transform,
                    worker_mode="thread") as loader:
        return [next(loader) for _ in range(steps)]


def test_workers_run_their_own_copy_where_the_gil_is_off(streams, module, monkeypatch):
    monkeypatch.delenv("LOADERX_PRIVATE_TRANSFORM", raising=False)
    one = _run(streams, module.tag, 0)
    two = _run(streams, module.tag, 2)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a["x"], b["x"])
    names = {b["where"] for b in two}
    if gil_enabled():
        assert names == {module.__name__}  # nothing changes on a GIL build
    else:
        assert module.__name__ not in names and all(n.startswith("_loaderx_private_")
                                                      for n in names)
        assert module.SEEN == {module.__name__}  # the copies keep their state apart


def test_ctx_augmentation_gives_the_same_batches(streams, module):
    one = _run(streams, module.augment, 0)
    two = _run(streams, module.augment, 2)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a["x"], b["x"])


def test_copies_can_be_turned_off(streams, module, monkeypatch):
    monkeypatch.setenv("LOADERX_PRIVATE_TRANSFORM", "0")
    assert pt.private_transform(module.tag) is None
    assert {b["where"] for b in _run(streams, module.tag, 2)} == {module.__name__}


def test_only_the_projects_own_module_functions_are_copied(module, monkeypatch):
    monkeypatch.setattr(pt, "copies_enabled", lambda: True)
    copy = pt.private_transform(module.tag)
    assert copy is not None and copy is not module.tag
    assert copy.__module__.startswith("_loaderx_private_")
    import json

    from loaderx.dataloader import _identity

    for fn in (json.dumps, np.asarray, _identity, lambda b: b):
        assert pt.private_transform(fn) is None
