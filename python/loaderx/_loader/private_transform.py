"""A thread worker's own copy of its transform on a free-threaded interpreter.

On CPython 3.13t, threads that run functions of one imported module take turns even with the
GIL off: the objects the import made (the module's globals dict, its functions, their code and
constants) are owned by the importing thread, and every other thread updates their reference
counts and reads their dicts through the slow, shared path -- atomic updates of the same cache
lines from every core. A transform defined in the script escapes this only by luck of who
created it. Measured (issue "free-threaded Python: imported transforms"): 2 threads ran an
imported pure-Python transform at 0.92-0.98x one thread, and at 1.90x when each thread had
executed the module afresh itself.

So on a free-threaded interpreter each worker thread runs its transform from a private copy of
the transform's module, executed in that thread (:func:`private_transform`), when the
transform is a module-level function of the project's own code: a module loaded from a ``.py``
file outside the installed packages and the standard library (not ``__main__``: that would
run the script again; not a library's module, whose import may set up state of its own). The
copy is the same code: a transform seeded from ``ctx`` gives the same batches. Its module-level
state is then per thread: a counter or a cache the transform keeps in its module counts or
caches per worker thread; a module that must be imported once (it opens files, starts servers
or registers itself at import) should not be copied: ``LOADERX_PRIVATE_TRANSFORM=0`` turns the
copies off. On a GIL build nothing changes.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import sysconfig
from collections.abc import Callable
from typing import Any

from loaderx._loader.host import gil_enabled

__all__ = ["private_transform", "copies_enabled"]

_names = itertools.count()


def copies_enabled() -> bool:
    """Whether worker threads take private copies of their transform's module here: a
    free-threaded interpreter with the GIL off, unless ``LOADERX_PRIVATE_TRANSFORM=0``."""
    return not gil_enabled() and os.environ.get("LOADERX_PRIVATE_TRANSFORM", "1") != "0"


def _installed(path: str) -> bool:
    """Whether ``path`` lies in the standard library or an installed package's directory."""
    real = os.path.realpath(path)
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        root = paths.get(key)
        if root and real.startswith(os.path.realpath(root) + os.sep):
            return True
    return "site-packages" in real.split(os.sep)


def private_transform(transform: Callable[..., Any]) -> Callable[..., Any] | None:
    """``transform`` taken from a copy of its module executed in the calling thread, or None
    when it is not a module-level function of a module loaded from a source file (or copies
    are off: see :func:`copies_enabled`). A module that fails to execute again gives None: the
    shared transform is used then."""
    if not copies_enabled():
        return None
    module_name = getattr(transform, "__module__", None)
    qualname = getattr(transform, "__qualname__", "")
    if not module_name or module_name == "__main__" or not qualname.isidentifier() or \
            module_name.partition(".")[0] == "loaderx":
        return None
    module = sys.modules.get(module_name)
    if module is None or getattr(module, qualname, None) is not transform:
        return None
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None)
    if not isinstance(origin, str) or not origin.endswith(".py") or not os.path.isfile(origin) \
            or _installed(origin):
        return None
    private = importlib.util.spec_from_file_location(
        f"_loaderx_private_{next(_names)}_{module_name}", origin,
        submodule_search_locations=getattr(spec, "submodule_search_locations", None))
    if private is None or private.loader is None:
        return None
    copy = importlib.util.module_from_spec(private)
    # The copy's own name for relative imports: those resolve as the original's do.
    copy.__package__ = module.__package__
    try:
        private.loader.exec_module(copy)
    except Exception:
        return None
    found = getattr(copy, qualname, None)
    return found if callable(found) else None
