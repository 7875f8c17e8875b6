"""Resumable augmentation with torchvision: the recipes of the guide's augmentation section
(docs/guide/loading.md, "Augmentation with torchvision") give bit-identical batches when a run is
resumed at a step, on another worker count, in the worker modes each is made for
(tests/_torchvision_recipes.py)."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest

from frameworks_required import need

torch = need("torch")
need("torchvision")

import _torchvision_recipes as recipes  # noqa: E402  (after the framework checks)
from loaderx import DataLoader, DenseDataset, from_numpy  # noqa: E402
from loaderx.errors import LoaderxValueError  # noqa: E402

STEPS = 8


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("torchvision")
    rng = np.random.default_rng(0)
    from_numpy(out / "image", rng.integers(0, 256, size=(96, 3, 24, 24), dtype=np.uint8))
    from_numpy(out / "label", rng.integers(0, 17, size=96, dtype=np.int64))
    return out


def streams(root: pathlib.Path) -> dict[str, Any]:
    return {"image": DenseDataset(root / "image"), "label": DenseDataset(root / "label")}


def run(root: pathlib.Path, transform: Any, start: int = 0, **kw: Any) -> list[bytes]:
    with DataLoader(streams(root), batch_size=8, seed=11, transform=transform,
                    start_step=start, **kw) as loader:
        out = []
        for _ in range(STEPS - start):
            batch = next(loader)
            out.append(b"".join(np.ascontiguousarray(v.numpy() if torch.is_tensor(v) else v)
                                .tobytes() for v in batch.values()))
        return out


def test_seed_torch_resumes_torchvision_in_process_workers(root):
    """torchvision's own random transforms, seeded per batch by ctx.seed_torch(): a run
    resumed at step 5 on one worker gives steps 5.. bit for bit as the run on two did."""
    whole = run(root, recipes.global_generator, num_workers=2, worker_mode="process")
    resumed = run(root, recipes.global_generator, start=5, num_workers=1,
                  worker_mode="process")
    assert resumed == whole[5:]
    assert len(set(whole)) == STEPS  # and the augmentation does change from step to step


@pytest.mark.parametrize("kw", [{"num_workers": 0}, {"num_workers": 2}],
                            ids=["in-process", "threads"])
def test_seed_torch_refuses_where_the_generator_is_shared(root, kw):
    with pytest.raises(LoaderxValueError, match="worker_mode='process'"):
        run(root, recipes.global_generator, **kw)


def test_functional_recipe_resumes_in_every_worker_mode(root):
    """Parameters drawn from ctx and applied with the functional API: the same batches with
    threads, in the consumer's thread and in processes, and resumed at a step."""
    want = run(root, recipes.from_ctx, num_workers=0)
    assert run(root, recipes.from_ctx, num_workers=2) == want
    assert run(root, recipes.from_ctx, num_workers=2, worker_mode="process") == want
    assert run(root, recipes.from_ctx, start=3, num_workers=2) == want[3:]
    assert len(set(want)) == STEPS


def test_torch_generator_is_exact_in_every_worker_mode(root):
    want = run(root, recipes.generator_noise, num_workers=0)
    assert run(root, recipes.generator_noise, num_workers=2) == want
    assert run(root, recipes.generator_noise, num_workers=2, worker_mode="process") == want
    assert run(root, recipes.generator_noise, start=4, num_workers=1) == want[4:]
