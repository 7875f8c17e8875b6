"""The benchmark harness every ``bench_*.py`` layer shares: the machine block, timing (medians of
interleaved runs, per-repeat ratios), scratch directories and Markdown tables.

A layer measures its own data; what it times and how many times stays in the layer. This module
only owns how a figure is taken and printed, so that every table of ``scripts/bench.py`` is made
the same way. It imports nothing beyond the standard library at the top: worker processes and
fresh interpreters of the start-up rows import the layers, and must not pay for more.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# -- the machine -----------------------------------------------------------------------------------


def machine_block() -> str:
    """What the numbers were measured on."""
    import numpy as np

    def lscpu(field: str) -> str:
        try:
            out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        except OSError:
            return "?"
        for line in out.splitlines():
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
        return "?"

    mem = "?"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    try:
        import loaderx
        import loaderx._native

        lx = loaderx.__version__
        threads = loaderx._native.num_threads()
    except ImportError:
        lx, threads = "not installed", "?"
    rows = [
        ("CPU", f"{lscpu('Model name')}, {os.cpu_count()} logical CPUs"),
        ("caches", f"L1d {lscpu('L1d cache')}, L2 {lscpu('L2 cache')}, L3 {lscpu('L3 cache')}"),
        ("memory", mem),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("python", f"{platform.python_version()}, numpy {np.__version__}"),
        ("loaderx", f"{lx}, pool threads {threads}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def print_machine() -> None:
    print("## Machine\n")
    print(machine_block())


def standalone(cli: Callable[[list[str] | None], None]) -> None:
    """Runs a layer's ``cli`` as ``python scripts/bench_X.py`` does: the machine block first
    (not before a help text)."""
    if not {"-h", "--help"} & set(sys.argv[1:]):
        print_machine()
    cli(None)


# -- timing ----------------------------------------------------------------------------------------


def seconds(fn: Callable[[], Any]) -> float:
    """Wall seconds of one call of ``fn``."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def time_next(it: Iterator[Any], batches: int, warm: int = 0) -> float:
    """Wall seconds of ``batches`` ``next(it)`` after ``warm`` untimed ones (which also start a
    loader's workers)."""
    for _ in range(warm):
        next(it)
    t = time.perf_counter()
    for _ in range(batches):
        next(it)
    return time.perf_counter() - t


def endless(iterable: Iterable[T]) -> Iterator[T]:
    """``iterable`` over and over: a loader of a finite epoch as an endless stream."""
    while True:
        yield from iterable


def interleaved(runs: Mapping[str, Callable[[], T]], repeats: int) -> dict[str, list[T]]:
    """Each repeat runs every row once, in turn, so that a change of the machine's load hits all
    rows alike; returns each row's results, one per repeat."""
    got: dict[str, list[T]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            got[name].append(fn())
    return got


def median_of(fn: Callable[[], float | None], repeats: int) -> float | None:
    """The median of ``repeats`` calls of ``fn``; None as soon as one call gives None (a
    contender that cannot run here)."""
    got = []
    for _ in range(repeats):
        value = fn()
        if value is None:
            return None
        got.append(value)
    return statistics.median(got)


def paired(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """Per-repeat ratios ``num[r] / den[r]`` of two rows that ran back to back: a slow moment of
    the machine that spans both cancels out of their ratio."""
    return [a / b for a, b in zip(num, den, strict=True)]


def spread(ratios: Sequence[float]) -> str:
    """``ratios`` as their median and range: ``1.23x median, 1.10..1.31``."""
    s = sorted(ratios)
    return f"{statistics.median(s):.2f}x median, {s[0]:.2f}..{s[-1]:.2f}"


# -- scratch space ---------------------------------------------------------------------------------


@contextlib.contextmanager
def scratch(prefix: str, dir: str | None = None) -> Iterator[pathlib.Path]:
    """A temporary directory for a layer's stores, removed however the layer ends."""
    root = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir=dir))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- tables ----------------------------------------------------------------------------------------

_RULES = {"l": ":---", "r": "---:", "c": ":---:", "-": "---"}


def head(*columns: str, align: str = "") -> str:
    """A Markdown table's header and rule; ``align`` has one of ``l r c -`` per column (``-``,
    the default: the renderer's choice)."""
    rule = "|".join(_RULES[a] for a in align.ljust(len(columns), "-"))
    return "| " + " | ".join(columns) + f" |\n|{rule}|"


def row(*cells: object) -> str:
    """One row of a Markdown table."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(columns: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A whole Markdown table."""
    return "\n".join([head(*columns, align=align), *(row(*r) for r in rows)])


def skipped(missing: Sequence[str]) -> None:
    """The closing line of a layer whose contenders did not all import."""
    if missing:
        print(f"\nNot installed, skipped: {', '.join(missing)}.")


def available(module: str) -> str | None:
    """None when ``module`` imports, else why not (a contender that does not import is skipped,
    whatever the reason: a broken install too)."""
    try:
        __import__(module)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def absl_parsed() -> None:
    """Grain reads absl flags, which a program that is not an absl app never parses."""
    try:
        from absl import flags
    except ImportError:
        return
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
