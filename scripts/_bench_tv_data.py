"""The torchvision workload of the workers benchmark: 64x64x3 uint8 images (a gradient plus
noise) and int64 labels as two ``DenseDataset`` stores, and torch's map-style dataset over them.

Shared by ``bench_workers.py`` (whose transform imports torch lazily, inside the functions) and
``_bench_vision.py`` (the start-up table's transform, which imports torch and torchvision at the
top as a training script's module does). Imports only NumPy at the top, so that importing it adds
nothing a worker would not import anyway.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np

TV_N, TV_SIDE, TV_CROP, TV_BATCH = 4096, 64, 56, 128


def make_tv_data(root: pathlib.Path) -> None:
    from loaderx.converter import from_numpy

    rng = np.random.default_rng(22)
    y, x = np.mgrid[0:TV_SIDE, 0:TV_SIDE]
    base = np.stack([x * 4, y * 4, (x + y) * 2], axis=-1).astype(np.int16)
    noise = rng.integers(-20, 21, size=(TV_N, TV_SIDE, TV_SIDE, 3), dtype=np.int16)
    images = np.clip(base + noise, 0, 255).astype(np.uint8)
    from_numpy(root / "tv-image", images, codec="raw", progress=False)
    from_numpy(root / "tv-label", np.arange(TV_N, dtype=np.int64) % 100, codec="raw",
               progress=False)


class TvItems:
    """torch's map-style dataset over the two stores: one image per item, through the
    subclass's ``pipeline()``."""

    #: Whether each image is copied out of the store before torch wraps it (a writable array).
    copy = False

    def __init__(self, root: str) -> None:
        from loaderx.dataset import DenseDataset

        # DenseDatasets pickle by path: each torch worker reopens the stores.
        self.image = DenseDataset(os.path.join(root, "tv-image"))
        self.label = DenseDataset(os.path.join(root, "tv-label"))

    def __len__(self) -> int:
        return len(self.image)

    def pipeline(self) -> Callable[[Any], Any]:
        raise NotImplementedError

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import torch

        image = self.image[i]
        img = torch.from_numpy(np.array(image) if self.copy else image).permute(2, 0, 1)
        return self.pipeline()(img), int(self.label[i])
