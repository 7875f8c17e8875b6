"""Sampler throughput: loaderx IID and cyclic against NumPy's generators, in one run.

For each batch size (256, 1024, 8192) over a 1M index space this times ``batches`` consecutive
batches of each contender with ``time.perf_counter`` and reports the median over ``repeats``
runs: microseconds per batch, indices per second, and the speed relative to
``np.random.default_rng().integers`` (above 1.0 is faster than NumPy). Each contender returns a
new array per batch, as a loader would consume it:

* ``loaderx iid`` / ``loaderx cyclic``: ``Sampler.next()``, one native call per batch;
* ``np.random.randint``: the legacy global generator;
* ``default_rng().integers``: NumPy's PCG64 generator.

Not a timed test: run ``python scripts/bench.py sampler [--repeats N] [--batches N]``.
``run()`` returns the figures, ``main()`` prints them.
The machine's load moves microsecond timings, hence the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import _bench_common as common
from loaderx.sampler import Sampler

LENGTH = 1_000_000
BATCH_SIZES = (256, 1024, 8192)
BASELINE = "default_rng().integers"


def _contenders(batch_size: int) -> dict[str, Callable[[], object]]:
    iid = Sampler(LENGTH, batch_size, "iid", seed=0)
    cyclic = Sampler(LENGTH, batch_size, "cyclic", seed=0)
    rng = np.random.default_rng(0)
    np.random.seed(0)
    return {
        "loaderx iid": iid.next,
        "loaderx cyclic": cyclic.next,
        "np.random.randint": lambda: np.random.randint(0, LENGTH, batch_size),
        BASELINE: lambda: rng.integers(0, LENGTH, batch_size),
    }


def _time_once(draw: Callable[[], object], batches: int) -> float:
    """Seconds per batch over ``batches`` consecutive draws."""
    start = time.perf_counter()
    for _ in range(batches):
        draw()
    return (time.perf_counter() - start) / batches


def run(repeats: int = 5, batches: int = 2000) -> list[dict]:
    """Measure every contender at every batch size; one dict per (batch_size, contender).

    Keys: ``batch_size``, ``name``, ``us_per_batch`` and ``indices_per_s`` (medians over
    ``repeats`` runs of ``batches`` batches), and ``vs_default_rng`` (the baseline's time per
    batch divided by this one's: above 1.0 is faster than ``default_rng().integers``).
    """
    if repeats < 1 or batches < 1:
        raise ValueError("repeats and batches must be at least 1")
    rows: list[dict] = []
    for batch_size in BATCH_SIZES:
        contenders = _contenders(batch_size)
        for draw in contenders.values():  # warm up: first calls, allocator, caches
            _time_once(draw, max(1, batches // 10))
        samples = common.interleaved(
            {name: lambda d=draw: _time_once(d, batches) for name, draw in contenders.items()},
            repeats)
        medians = {name: statistics.median(s) for name, s in samples.items()}
        for name, seconds in medians.items():
            rows.append(
                {
                    "batch_size": batch_size,
                    "name": name,
                    "us_per_batch": seconds * 1e6,
                    "indices_per_s": batch_size / seconds,
                    "vs_default_rng": medians[BASELINE] / seconds,
                }
            )
    return rows


def table(rows: list[dict]) -> str:
    """The rows of ``run`` as a Markdown table, with the cyclic/IID cost ratio per batch size."""
    lines = [common.table(
        ["batch", "sampler", "µs/batch", "indices/s", "vs default_rng"],
        [(r["batch_size"], r["name"], f"{r['us_per_batch']:.2f}",
          f"{r['indices_per_s'] / 1e6:.1f} M", f"{r['vs_default_rng']:.2f}x") for r in rows],
        align="rlrrr")]
    by = {(r["batch_size"], r["name"]): r["us_per_batch"] for r in rows}
    ratios = ", ".join(
        f"{bs}: {by[(bs, 'loaderx cyclic')] / by[(bs, 'loaderx iid')]:.2f}x"
        for bs in sorted({r["batch_size"] for r in rows})
    )
    lines += ["", f"cyclic time / iid time per batch: {ratios}"]
    return "\n".join(lines)


def main(repeats: int = 5, batches: int = 2000) -> None:
    print(
        f"\n## Sampler: {LENGTH:,} indices, one native call per batch (medians of {repeats} runs "
        f"of {batches} batches; vs default_rng = its time / this time)"
    )
    print(table(run(repeats, batches)))


def cli(argv: list[str] | None = None, prog: str | None = None) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per contender (median)")
    parser.add_argument("--batches", type=int, default=2000, help="batches timed per run")
    args = parser.parse_args(argv)
    main(args.repeats, args.batches)


if __name__ == "__main__":
    common.standalone(cli)
