"""Shared pytest fixtures: the reference stores, unpacked once per session."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import sysconfig
import tarfile

import pytest

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "loaderx-0.9.11"


@pytest.fixture(scope="session")
def reference_stores(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Directory holding the stores written by loaderx 0.9.11 (sparse files kept sparse)."""
    out = tmp_path_factory.mktemp("reference")
    with tarfile.open(FIXTURES / "stores.tar.gz") as tar:
        # Extraction filters came in 3.11.4 (Debian 12's 3.11.2 has none); the archive is ours.
        tar.extractall(out, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
    return out / "stores"


@pytest.fixture(scope="session")
def manifest() -> dict:
    return json.loads((FIXTURES / "manifest.json").read_text())


def copy_store(src: pathlib.Path, dst: pathlib.Path) -> None:
    """Copies a store directory keeping its sparse files sparse (a plain copy would write out
    the reference's 4 GiB preallocated chunk files)."""
    subprocess.run(["cp", "-r", "--sparse=always", str(src), str(dst)], check=True)


# -- free-threaded interpreters: the GIL must stay off ----------------------------------------
# Under a free-threaded build (scripts/test_freethreaded.sh runs the suite under 3.13t with
# PYTHON_GIL unset), importing an extension module that does not declare itself free-threading
# safe turns the GIL on for the rest of the process. The run then fails at its end, naming the
# test or test module during which that happened and the extension modules imported then.

FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
_gil_turned_on: list[str] = []


def _gil_enabled() -> bool:
    return FREE_THREADED and sys._is_gil_enabled()  # type: ignore[attr-defined]


def _extensions(names: set[str]) -> list[str]:
    """The modules among ``names`` that are extension modules (compiled, not Python)."""
    found = []
    for name in sorted(names):
        path = getattr(sys.modules.get(name), "__file__", None) or ""
        if path.endswith((".so", ".pyd")):
            found.append(name)
    return found


def _watching(where: str):
    """Runs the hook's body (the ``yield``), recording ``where`` if the GIL came on in it."""
    if not FREE_THREADED or _gil_turned_on or _gil_enabled():
        yield
        return
    before = set(sys.modules)
    yield
    if _gil_enabled():
        new = _extensions(set(sys.modules) - before)
        _gil_turned_on.append(f"{where} (extension modules imported meanwhile: "
                              f"{', '.join(new) or 'none'})")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    yield from _watching(f"collecting {collector.nodeid or 'the session'}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    yield from _watching(item.nodeid)


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("LOADERX_EXPECT_FREETHREADED") and not FREE_THREADED:
        raise pytest.UsageError(f"LOADERX_EXPECT_FREETHREADED is set but {sys.executable} is "
                                "not a free-threaded interpreter")
    if FREE_THREADED and _gil_enabled() and not _gil_turned_on:
        _gil_turned_on.append("before the session started (PYTHON_GIL=1, -X gil=1, or a "
                              "plugin's import)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    problems = []
    if FREE_THREADED and _gil_enabled():
        where = _gil_turned_on[0] if _gil_turned_on else "somewhere not watched"
        problems.append(f"the GIL was turned on during this free-threaded run: {where}")
    if os.environ.get("LOADERX_EXPECT_FREETHREADED") and os.environ.get("PYTHON_GIL"):
        problems.append(f"PYTHON_GIL={os.environ['PYTHON_GIL']} is set: the free-threaded leg "
                        "must run with it unset, so that a module that turns the GIL on does")
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for problem in problems:
            if reporter is not None:
                reporter.write_line(f"FAILED (free-threaded check): {problem}", red=True)
            else:
                print(problem, file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
