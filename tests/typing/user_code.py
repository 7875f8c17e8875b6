"""Code as a user writes it, checked with ``mypy --strict`` by tests/test_typing.py."""

from __future__ import annotations

import numpy as np

from loaderx import DataLoader, DenseDataset, Mode, Zrecord, from_numpy, split


def train(path: str) -> float:
    from_numpy(path, np.zeros((64, 3), np.float32), codec="zstd_dict", overwrite=True)
    ds = DenseDataset(path)
    rows: np.ndarray = ds[2:4]
    total_rows = float(rows.sum()) + float(ds[[0, 1]].mean())
    train_part, val_part = split(ds, [0.75, 0.25], seed=0)
    total = total_rows
    with DataLoader({"x": train_part}, batch_size=8, mode="iid", num_workers=0) as loader:
        batch = next(loader)
        total += float(batch["x"].sum())
    with DataLoader({"x": val_part}, batch_size=8, mode=Mode.SEQUENTIAL) as loader:
        for b in loader.epoch():
            total += float(b["x"].sum())
    with Zrecord(path + "-raw", codec="raw") as z:
        z.append(b"abc", [0], codec="zstd")
    return total
