"""What the fork server imports before it forks any worker (``start_method="forkserver"``).

The server is a fresh interpreter. Workers forked from it start with what it imported -- and
share those pages with it -- so a transform whose module imports torch and torchvision costs
one import in the server instead of one in every worker, at once, on the same cores (5-46 s
and twice the memory, measured). multiprocessing's own preload list cannot do it on every
supported interpreter: 3.11's server neither imports ``__main__`` nor takes the consumer's
``sys.path``, so a transform module beside the training script is not found there. So the
consumer names the modules and its ``sys.path`` in the environment variable ``PRELOAD_VARIABLE``
while it starts the server, and the server imports this module, which reads them. A module that
fails to import here is left to the worker, which reports its error at the first step.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

__all__ = ["PRELOAD_VARIABLE", "describe"]

#: The environment variable the consumer sets while it starts the server.
PRELOAD_VARIABLE = "LOADERX_FORKSERVER_PRELOAD"


def describe(modules: list[str]) -> str:
    """The variable's value: the consumer's ``sys.path`` and the modules to import."""
    return json.dumps({"sys_path": [p for p in sys.path if isinstance(p, str)],
                       "modules": modules})


def _preload() -> None:
    text = os.environ.pop(PRELOAD_VARIABLE, None)
    if not text:
        return
    try:
        wanted = json.loads(text)
        paths, modules = list(wanted["sys_path"]), list(wanted["modules"])
    except (ValueError, KeyError, TypeError):
        return
    for path in reversed(paths):
        if isinstance(path, str) and path not in sys.path:
            sys.path.insert(0, path)
    for name in modules:
        if not isinstance(name, str):
            continue
        try:
            importlib.import_module(name)
        except Exception:  # the worker imports it again and reports what fails
            continue


if __name__ != "__main__" and os.environ.get(PRELOAD_VARIABLE):
    _preload()
