"""Whether a framework test may skip. CI installs torch, JAX and Orbax (scripts/frameworks.sh)
and sets CI=true: there a missing framework fails the test, so that a broken install step
cannot turn the framework tests into silent skips. Elsewhere a missing framework skips."""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def _missing(what: str) -> None:
    message = f"{what} is not installed"
    if IN_CI:
        pytest.fail(f"{message}, and CI=true must run this test (scripts/frameworks.sh "
                    "installs it; see scripts/frameworks.txt)")
    pytest.skip(message, allow_module_level=True)  # also at a module's top (need("torch"))


def need(module: str) -> Any:
    """``module`` imported in this process (torch), or a skip / a failure under CI."""
    try:
        return importlib.import_module(module)
    except ImportError:
        _missing(module)


def need_installed(*modules: str) -> None:
    """Checks that ``modules`` can be imported without importing them here: JAX starts threads
    at import, and other tests fork, so JAX runs only in child processes."""
    for module in modules:
        top = module.split(".")[0]
        if importlib.util.find_spec(top) is None or importlib.util.find_spec(module) is None:
            _missing(module)
