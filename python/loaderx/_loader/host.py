"""What this machine and interpreter give the loader: the cores this process may run on, and
whether Python code runs one thread at a time. The loader's statistics judge a run by them and
the worker processes take their default count from them."""

from __future__ import annotations

import os
import sys

__all__ = ["gil_enabled", "usable_cores"]


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def gil_enabled() -> bool:
    """Whether this interpreter runs Python code one thread at a time: always on a GIL build;
    on a free-threaded one (3.13t, 3.14t) only once something turned the GIL on (``PYTHON_GIL=1``,
    or an extension module that does not declare itself free-threading safe)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())
