"""The guide's resumable torchvision augmentations (docs/guide/loading.md), as module-level
transforms (forkserver and spawn workers import them by name): one for process workers, which seeds
torch's global generator per batch (``ctx.seed_torch()``) and runs ``torchvision.transforms.v2`` as
usual, and one for any worker mode, which draws every parameter from ``ctx`` and applies it with
``torchvision.transforms.v2.functional``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from loaderx.context import BatchContext

#: What both recipes do: a random crop resized to 16x16, a flip, brightness and contrast.
PIPELINE = v2.Compose([v2.RandomResizedCrop(16, antialias=True), v2.RandomHorizontalFlip(),
                       v2.ColorJitter(brightness=0.4, contrast=0.4)])


def global_generator(batch: dict[str, Any], ctx: BatchContext) -> dict[str, Any]:
    """Process workers: torchvision's own random transforms, exact once seeded per batch."""
    ctx.seed_torch()
    images = torch.from_numpy(batch["image"])
    out = torch.stack([PIPELINE(image) for image in images])
    return {"image": out, "label": batch["label"]}


def from_ctx(batch: dict[str, Any], ctx: BatchContext) -> dict[str, Any]:
    """Any worker mode: each record's parameters from its own generator, applied with the
    functional API (no global generator touched)."""
    images = torch.from_numpy(batch["image"])
    out = []
    for image, rng in zip(images, ctx.record_rngs(), strict=True):
        h, w = image.shape[-2:]
        scale = rng.uniform(0.08, 1.0)
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        ch = int(min(h, round(np.sqrt(scale * h * w / ratio))))
        cw = int(min(w, round(np.sqrt(scale * h * w * ratio))))
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        image = F.resized_crop(image, top, left, ch, cw, [16, 16], antialias=True)
        if rng.random() < 0.5:
            image = F.horizontal_flip(image)
        image = F.adjust_brightness(image, float(rng.uniform(0.6, 1.4)))
        image = F.adjust_contrast(image, float(rng.uniform(0.6, 1.4)))
        out.append(image)
    return {"image": torch.stack(out), "label": batch["label"]}


def generator_noise(batch: dict[str, Any], ctx: BatchContext) -> dict[str, Any]:
    """Draws that take a generator: ``ctx.torch_generator()``, exact in every mode."""
    g = ctx.torch_generator()
    noise = torch.rand(batch["image"].shape, generator=g)
    return {"noise": noise, "label": batch["label"]}
