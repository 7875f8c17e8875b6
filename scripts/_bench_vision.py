"""The torchvision transform of the workers benchmark's start-up table, as a training script
keeps one: in a module of its own that imports torch and torchvision at the top, so that what a
worker process must import first is what a real one must (``bench_workers.py``'s own
transforms import torch lazily, inside the functions)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torchvision.transforms import v2

CROP = 56
PIPELINE = v2.Compose([v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip(),
                       v2.ToDtype(torch.float32, scale=True)])


def augment(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """loaderx's transform: the pipeline per image of the batch, stacked."""
    images = torch.from_numpy(batch["image"]).permute(0, 3, 1, 2)
    return {"image": torch.stack([PIPELINE(img) for img in images]),
            "label": torch.from_numpy(batch["label"])}


class Items(torch.utils.data.Dataset):
    """torch's map-style dataset over the same stores: one image per item."""

    def __init__(self, root: str) -> None:
        from loaderx.dataset import DenseDataset

        self.image = DenseDataset(os.path.join(root, "tv-image"))
        self.label = DenseDataset(os.path.join(root, "tv-label"))

    def __len__(self) -> int:
        return len(self.image)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        img = torch.from_numpy(np.array(self.image[i])).permute(2, 0, 1)
        return PIPELINE(img), int(self.label[i])
