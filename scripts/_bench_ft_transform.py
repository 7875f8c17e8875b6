"""The per-sample transform of ``bench_freethreaded.py``, in a module of its own: a training
script imports its transform (``from mytransforms import augment``), and on a free-threaded
interpreter where a function is defined can change how it scales across threads (see that
script's docstring). The same code as ``bench_freethreaded.augment`` and
``bench_loader.augment``."""

from __future__ import annotations

from typing import Any


def augment(batch: dict[str, Any]) -> dict[str, Any]:
    """A Python-bound per-sample loop: the kind of transform the GIL serializes."""
    out = []
    for img in batch["data"]:
        v = img[::16]
        out.append(float(v.sum()) / (1 + len(v)))
    return {"data": batch["data"], "label": batch["label"], "score": out}


def pure(batch: dict[str, Any]) -> dict[str, Any]:
    """A pure-Python per-sample transform: integer arithmetic over ``tolist()`` of each sample
    (no NumPy call per value), the kind the interpreter itself runs."""
    total = 0
    for img in batch["data"]:
        for x in img[::64].tolist():
            total = (total * 31 + x) % 1_000_003
    return {"data": batch["data"], "label": batch["label"], "score": total}
