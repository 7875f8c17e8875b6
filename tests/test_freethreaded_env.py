"""The free-threaded interpreter itself (issue 32): loaderx imports with the GIL left off, the
suite's end-of-run check names a module that turns it on, and the defaults follow the
interpreter. Skipped on GIL builds (scripts/test_freethreaded.sh runs them under 3.13t)."""

from __future__ import annotations

import ctypes
import os
import pathlib
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from loaderx._views import recycle as _recycle
from loaderx.workers.start import default_workers, gil_enabled, usable_cores

pytestmark = pytest.mark.skipif(not sysconfig.get_config_var("Py_GIL_DISABLED"),
                                reason="a GIL build: these check a free-threaded interpreter")
TESTS = pathlib.Path(__file__).resolve().parent
#: PYTHON_GIL unset: anything that turns the GIL on does.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}


def test_loaderx_and_its_dependencies_import_with_the_gil_off():
    code = textwrap.dedent("""
        import sys
        import loaderx, loaderx._native, loaderx.dataloader, loaderx.workers, numpy, msgpack
        assert not sys._is_gil_enabled(), "the GIL was turned on"
        print("off")
    """)
    r = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                       text=True, env=ENV, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "off", r.stderr[-3000:]


def test_the_session_check_names_a_module_that_turns_the_gil_on(tmp_path):
    """A single-phase extension module (which cannot declare itself free-threading safe)
    imported by a test: the run fails at its end, naming the test and the module."""
    if not sysconfig.get_config_var("CC"):
        pytest.skip("no C compiler configured for this interpreter")
    (tmp_path / "gilmod.c").write_text(textwrap.dedent("""
        #include <Python.h>
        static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "gilmod", NULL, -1, NULL};
        PyMODINIT_FUNC PyInit_gilmod(void) { return PyModule_Create(&def); }
    """))
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    cc = sysconfig.get_config_var("CC").split()
    build = subprocess.run([*cc, "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                            str(tmp_path / "gilmod.c"), "-o", str(tmp_path / f"gilmod{suffix}")],
                           capture_output=True, text=True)
    if build.returncode != 0:
        pytest.skip(f"the C compiler failed: {build.stderr[-500:]}")
    (tmp_path / "test_it.py").write_text(textwrap.dedent("""
        import warnings

        def test_imports_it():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # CPython's own notice
                import gilmod  # noqa: F401

        def test_after():
            pass
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS)])}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "conftest", "test_it.py"], cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "2 passed" in out, out
    assert "the GIL was turned on during this free-threaded run: test_it.py::test_imports_it" \
        in out, out
    assert "gilmod" in out, out


def test_thread_workers_default_to_one_per_core():
    assert not gil_enabled()
    assert default_workers("thread") == usable_cores()
    assert default_workers("process") == usable_cores()


def test_a_pool_buffer_owner_has_merged_reference_counts():
    """The pool reads its buffers' reference counts from any thread: on a free-threaded build
    the owner's counts are merged (no owning thread, one shared count: see loaderx._views.recycle).
    PyObject's free-threaded header: ob_tid at 0, ob_ref_local at 12, ob_ref_shared at 16."""
    buffer = _recycle._Buffer(1 << 16)
    address = id(buffer.owner)
    tid = ctypes.c_uint64.from_address(address).value
    local = ctypes.c_uint32.from_address(address + 12).value
    shared = ctypes.c_int64.from_address(address + 16).value
    assert (tid, local, shared & 3) == (0, 0, 3), (tid, local, shared)
    assert buffer.free()
    view = buffer.view[:10]
    assert not buffer.free()
    del view
    assert buffer.free()
