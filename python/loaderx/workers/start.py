"""How worker processes start, and how many there are by default.

``start_method=None`` ("auto") chooses, in order:

* ``"fork"`` when forking is safe (:func:`fork_is_safe`): no other Python thread runs (a
  lock another thread holds would stay locked in the child for ever), no CUDA context exists
  (``torch.cuda.is_initialized()``: a forked child cannot use it, and touching it hangs or
  fails) and JAX's runtime has not started. Native pools -- loaderx's, OpenBLAS's, OpenMP's --
  are fork-aware: loaderx builds a new pool in the child, OpenBLAS and GNU OpenMP reset their
  own. Fork starts the workers at once with everything the script imported (its transform's
  module too: nothing to import again), as torch's ``DataLoader`` does; the worker freezes
  what it inherited out of the garbage collector's reach (``gc.freeze``), so that collections
  do not copy those pages;
* ``"forkserver"`` otherwise, when the streams and the transform pickle and the transform can
  be found by a fresh interpreter (not a function of an interactive session's ``__main__``):
  each worker is forked from a small server process that imported NumPy, loaderx and the
  transform's module (preloaded once), so it inherits none of the training process's
  threads or CUDA state;
* else a :class:`~loaderx.errors.LoaderxTypeError` that names the fix (a module-level
  transform, or ``start_method="fork"`` at the caller's own risk).

``"fork"``, ``"forkserver"`` and ``"spawn"`` may also be asked for by name.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
import threading
from typing import Any

from loaderx._loader.host import gil_enabled, usable_cores
from loaderx.errors import LoaderxTypeError, LoaderxValueError

__all__ = ["METHODS", "choose", "default_workers", "fork_is_safe", "gil_enabled",
           "likely_forkserver", "usable_cores"]

METHODS = ("fork", "forkserver", "spawn")


def default_workers(mode: str) -> int:
    """``num_workers=None``: one process per core. Threads: one per core on a free-threaded
    interpreter with the GIL off, where threads run a Python transform in parallel as
    processes do; otherwise at most 4 and at most one per core (a gather releases the GIL and
    uses the native pool, so more threads than cores only contend; a GIL-bound transform is
    the process mode's case there)."""
    cores = usable_cores()
    if mode == "process" or not gil_enabled():
        return cores
    return min(4, cores)


def _other_python_threads() -> bool:
    """Whether a Python thread other than this one runs."""
    me = threading.current_thread()
    return any(t is not me for t in threading.enumerate())


def fork_is_safe() -> tuple[bool, str]:
    """Whether forking this process now is safe, and if not, why (see the module docs)."""
    if _other_python_threads():
        return False, "another Python thread runs"
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return False, "CUDA is initialized in this process (torch.cuda)"
        except Exception:  # a torch without CUDA support, or half-imported: no context
            pass
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is not None and getattr(bridge, "_backends", None):
        return False, "JAX's runtime is started in this process"
    return True, ""


def _not_importable(transform: Any) -> bool:
    """Whether ``transform`` lives in a ``__main__`` that a fresh interpreter cannot import
    (an interactive session or a notebook)."""
    module = getattr(transform, "__module__", None)
    if module != "__main__":
        return False
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return path is None or not os.path.isfile(path)  # a session, a notebook, or `python -`


def likely_forkserver(requested: Any, transform: Any) -> bool:
    """Whether the workers will most likely come from the fork server, known without pickling
    anything (a transform that turns out not to pickle falls back to fork: the server then
    started for nothing)."""
    if requested == "forkserver":
        return True
    return (requested is None or requested == "auto") \
        and "forkserver" in multiprocessing.get_all_start_methods() \
        and not _not_importable(transform) and not fork_is_safe()[0]


def choose(requested: Any, job: tuple[Any, ...], transform: Any) -> tuple[str, bytes | None]:
    """The start method, and ``job`` pickled (None for ``fork``, which inherits it)."""
    if requested is None or requested == "auto":
        can_fork = "fork" in multiprocessing.get_all_start_methods()
        safe, unsafe = fork_is_safe()
        if can_fork and safe:
            return "fork", None
        payload, why = _pickled(job, transform)
        if payload is not None:
            method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() \
                else "spawn"
            return method, payload
        raise LoaderxTypeError(
            f"worker processes cannot be started: {why}, and forking this process is not "
            f"safe now ({unsafe or 'fork is not available here'}); define the transform (and "
            "what it uses) at module level in an importable module, or pass "
            "start_method='fork' to fork anyway")
    if requested not in METHODS:
        raise LoaderxValueError(f"start_method must be None, 'auto', or one of {METHODS}, got "
                                f"{requested!r}")
    if requested not in multiprocessing.get_all_start_methods():
        raise LoaderxValueError(f"start_method {requested!r} is not available on this platform")
    if requested == "fork":
        return "fork", None
    payload, why = _pickled(job, transform)
    if payload is None:
        raise LoaderxTypeError(
            f"start_method={requested!r} sends the streams and the transform to each worker "
            f"by pickling them, but {why}; define the transform at module level in an "
            "importable module, or use start_method='fork'")
    return requested, payload


def _pickled(job: tuple[Any, ...], transform: Any) -> tuple[bytes | None, str]:
    """``job`` pickled for a fresh interpreter, or None and why it cannot reach one."""
    if _not_importable(transform):
        return None, (f"the transform {getattr(transform, '__qualname__', transform)!r} is "
                      "defined in an interactive __main__, which a fresh worker cannot import")
    try:
        return pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL), ""
    except Exception as e:  # pickle raises many kinds (PicklingError, TypeError, ...)
        return None, f"they do not pickle ({type(e).__name__}: {e})"
