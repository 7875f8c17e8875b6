"""The loader layer against the formats a Parquet user would pick instead: random batches of
256 rows (a 12 KiB float32 column and an int64 label) handed to a training loop, each format
through the loader it ships or documents, on the same rows in the same run.

``python scripts/bench.py contender-loaders [--repeats N] [--rows N]`` (also a part of
``scripts/bench.py loader``). The data is ``bench_contenders``'s (one Parquet file, zstd), each
format written by its own converter as there. Loaders, every one shuffling, batch 256, both
columns per batch, 2 workers where the loader has workers (this machine has 2 cores):

* loaderx -- ``DataLoader(open_dataset(dst), batch_size=256, num_workers=2)`` (threads), and
  ``num_workers=0``;
* Hugging Face -- ``torch.utils.data.DataLoader`` over ``load_from_disk(dst).with_format("numpy")``
  (map-style; torch fetches a batch with its ``__getitems__``), ``shuffle=True``, 2 worker
  processes, and 0;
* Lance -- ``torch.utils.data.DataLoader`` over a map-style dataset whose ``__getitems__`` is
  one ``dataset.take(indices)`` of both columns (Lance's own ``LanceDataset`` reads fragments in
  order: no shuffle), 2 worker processes;
* Mosaic -- ``streaming.StreamingDataLoader`` over ``StreamingDataset(local=dst, shuffle=True)``,
  2 worker processes;
* LitData -- ``litdata.StreamingDataLoader`` over ``StreamingDataset(dst, shuffle=True)``, 2
  worker processes.

Each figure is batches per second over a fixed number of batches after a warm-up (which also
starts the workers), the median of ``--repeats`` runs; contenders that do not import are
skipped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_common as common
import bench_contenders as bc

ROWS, BATCH, WORKERS = 20_000, 256, 2
WARM = 5


def _batches(it: Iterator[Any], n: int) -> float:
    """Batches per second of ``n`` batches of ``it`` after :data:`WARM` of them."""
    return n / common.time_next(it, n, WARM)


def _loaderx(dst: str, workers: int) -> Callable[[int], float]:
    from loaderx import DataLoader, open_dataset

    def run(n: int) -> float:
        with DataLoader(open_dataset(dst), batch_size=BATCH, num_workers=workers,
                        seed=0) as loader:
            return _batches(loader, n)
    return run


def _as_fetched(batch: Any) -> Any:
    """torch's collate step, left out: every loader hands its batch over as it fetched it."""
    return batch


def _torch_loader(dataset: Any, workers: int) -> Iterator[Any]:
    import torch

    loader = torch.utils.data.DataLoader(
        dataset, batch_size=BATCH, shuffle=True, num_workers=workers, drop_last=True,
        persistent_workers=workers > 0, collate_fn=_as_fetched)
    yield from common.endless(loader)


def _huggingface(dst: str, workers: int) -> Callable[[int], float]:
    def run(n: int) -> float:
        import datasets
        ds = datasets.load_from_disk(dst).with_format("numpy")
        return _batches(_torch_loader(ds, workers), n)
    return run


class _LanceRows:
    """Map-style rows of a Lance dataset: a batch is one ``take`` of both columns."""

    def __init__(self, dst: str) -> None:
        self.dst = dst
        self.ds: Any = None

    def __len__(self) -> int:
        import lance
        return lance.dataset(self.dst).count_rows()

    def __getitem__(self, i: int) -> Any:
        return self.__getitems__([i])

    def __getitems__(self, idx: list[int]) -> Any:
        import lance
        if self.ds is None:  # opened in the worker that reads
            self.ds = lance.dataset(self.dst)
        table = self.ds.take(sorted(idx), columns=["x", "label"])
        x = table.column("x").combine_chunks().flatten().to_numpy().reshape(len(idx), -1)
        return x, table.column("label").to_numpy()


def _lance(dst: str, workers: int) -> Callable[[int], float]:
    return lambda n: _batches(_torch_loader(_LanceRows(dst), workers), n)


def _mosaic(dst: str, workers: int) -> Callable[[int], float]:
    def run(n: int) -> float:
        from streaming import StreamingDataLoader, StreamingDataset
        ds = StreamingDataset(local=dst, remote=None, shuffle=True, batch_size=BATCH)
        loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers,
                                     drop_last=True, persistent_workers=workers > 0)
        try:
            return _batches(common.endless(loader), n)
        finally:
            bc._MOSAIC.clear()
    return run


def _litdata(dst: str, workers: int) -> Callable[[int], float]:
    def run(n: int) -> float:
        import litdata
        ds = litdata.StreamingDataset(dst, shuffle=True)
        loader = litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers,
                                             drop_last=True)
        return _batches(common.endless(loader), n)
    return run


# name, module, converter name in bench_contenders, runner, batches per run
LOADERS: list[tuple[str, str, str, Callable[[str, int], Callable[[int], float]], int, int]] = [
    ("loaderx, num_workers=2 (threads)", "loaderx", "loaderx", _loaderx, WORKERS, 300),
    ("loaderx, num_workers=0", "loaderx", "loaderx", _loaderx, 0, 300),
    ("Hugging Face datasets, torch DataLoader, 2 processes", "datasets", "huggingface",
     _huggingface, WORKERS, 40),
    ("Hugging Face datasets, torch DataLoader, in process", "datasets", "huggingface",
     _huggingface, 0, 40),
    ("Lance take, torch DataLoader, 2 processes", "lance", "lance", _lance, WORKERS, 40),
    ("Mosaic StreamingDataLoader, 2 processes", "streaming", "mosaic", _mosaic, WORKERS, 40),
    ("LitData StreamingDataLoader, 2 processes", "litdata", "litdata", _litdata, WORKERS, 40),
]


def main(repeats: int = 3, rows: int = ROWS) -> None:
    if not bc._available("pyarrow") or not bc._available("torch"):
        print("\n## Contender loaders: not available (pyarrow and torch are needed)")
        return
    loaders = [entry for entry in LOADERS if bc._available(entry[1])]
    converters = {c[0]: c[3] for c in bc.CONVERTERS}
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "source.parquet")
        mib = bc._write_parquet(src, rows) / 2**20
        made = set()
        for _, _, fmt, _, _, _ in loaders:
            if fmt not in made:
                converters[fmt](src, os.path.join(tmp, fmt))
                made.add(fmt)
        rates = common.interleaved(
            {name: partial(lambda r, dst, w, n: r(dst, w)(n), runner, os.path.join(tmp, fmt),
                           workers, n) for name, _, fmt, runner, workers, n in loaders}, repeats)
    m = statistics.median
    base = m(rates[loaders[0][0]])
    print(f"\n## Loaders over the formats a Parquet user would pick -- {rows:,} rows (12 KiB "
          f"float32 + int64 label, {mib:,.0f} MiB), random batches of {BATCH}, warm, medians "
          f"of {repeats}\n")
    print(common.head("loader", "batches/s", "MiB/s", "loaderx (2 threads) vs it"))
    for name, *_ in loaders:
        rate = m(rates[name])
        print(common.row(name, f"{rate:,.1f}", f"{rate * BATCH * (bc.DIM * 4 + 8) / 2**20:,.0f}",
                         f"{base / rate:,.2f}x"))
    common.skipped([e[0] for e in LOADERS if e not in loaders])


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=ROWS)
    a = parser.parse_args(argv)
    main(a.repeats, a.rows)


if __name__ == "__main__":
    common.standalone(cli)
