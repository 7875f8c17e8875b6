"""The torchvision transform of the workers benchmark's start-up table, as a training script
keeps one: in a module of its own that imports torch and torchvision at the top, so that what a
worker process must import first is what a real one must (``bench_workers.py``'s own
transforms import torch lazily, inside the functions)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torchvision.transforms import v2

from _bench_tv_data import TV_CROP, TvItems

PIPELINE = v2.Compose([v2.RandomResizedCrop(TV_CROP, antialias=True), v2.RandomHorizontalFlip(),
                       v2.ToDtype(torch.float32, scale=True)])


def augment(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """loaderx's transform: the pipeline per image of the batch, stacked."""
    images = torch.from_numpy(batch["image"]).permute(0, 3, 1, 2)
    return {"image": torch.stack([PIPELINE(img) for img in images]),
            "label": torch.from_numpy(batch["label"])}


class Items(TvItems):
    """torch's map-style dataset over the same stores: one image per item."""

    copy = True

    def pipeline(self) -> Any:
        return PIPELINE
