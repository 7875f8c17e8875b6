"""loaderx Quick Start, end to end, in the current directory.

Writes a synthetic image set and its labels to ``.npy`` files, converts both into loaderx
datasets, and trains a pretend loop for 256 steps on batches from the endless DataLoader.
``bash scripts/demo.sh`` runs it in a fresh temporary directory. Everything printed on stdout is
deterministic (run it twice, get the same lines); the throughput line goes to stderr.
"""

import sys
import time
import zlib

import numpy as np

from loaderx.converter import from_numpy
from loaderx.dataloader import DataLoader
from loaderx.dataset import DenseDataset

# 1. Synthetic inputs: 16384 smooth 32x32 RGB images (12 KiB each) and their class labels.
rng = np.random.default_rng(0)
n = 16384
labels = rng.integers(0, 10, size=n).astype(np.int64)
ramp = np.linspace(0, 1, 32, dtype=np.float32)
images = np.empty((n, 32, 32, 3), dtype=np.uint8)
for start in range(0, n, 1024):
    k = labels[start:start + 1024, None, None, None].astype(np.float32)
    noise = rng.integers(0, 24, size=(len(k), 32, 32, 3), dtype=np.uint8)
    base = (ramp[:, None, None] * ramp[None, :, None] * 200 + k * 5).astype(np.uint8)
    images[start:start + 1024] = base[None] + noise
images[:, 0, 0, 0] = labels  # a label tag in the corner pixel, checked below
np.save("data.npy", images)
np.save("label.npy", labels)

# 2. Convert: one record per image, streamed from the memory-mapped .npy in bounded chunks.
from_numpy("train_data", np.load("data.npy", mmap_mode="r"), overwrite=True)
from_numpy("train_label", np.load("label.npy", mmap_mode="r"), overwrite=True)


# 3. Load: an endless loader; the transform (collate) runs on the prefetch threads.
def collate(batch):
    return {"image": batch["data"], "label": batch["label"]}


streams = {"data": DenseDataset("train_data"), "label": DenseDataset("train_label")}
checksum = 0
start = time.perf_counter()
with DataLoader(streams, batch_size=256, seed=42, transform=collate) as loader:
    for i, batch in enumerate(loader):
        if i >= 256:
            break
        # Each image's class is readable from its pixels: the loader kept images and labels aligned.
        assert (batch["image"][:, 0, 0, 0] == batch["label"]).all()
        checksum = zlib.crc32(batch["label"].tobytes(), checksum)
elapsed = time.perf_counter() - start

print("datasets:", {name: (len(ds), ds.dtype.str, ds.item_shape) for name, ds in streams.items()})
print("image batch:", batch["image"].shape, batch["image"].dtype)
print("label batch:", batch["label"].shape, batch["label"].dtype)
print(f"256 steps, label checksum {checksum:08x}")
mib = 256 * 256 * (images[0].nbytes + 8) / 2**20
print(f"throughput: {256 / elapsed:.0f} batches/s, {256 * 256 / elapsed:,.0f} samples/s, "
      f"{mib / elapsed:,.0f} MiB/s", file=sys.stderr)
