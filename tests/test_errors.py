"""One exception tree: every error loaderx raises on its own account is a LoaderxError, the
subclass also derives from the built-in a Python protocol expects, and each engine error
variant maps to one pinned class."""

from __future__ import annotations

import ast
import builtins
import os
import pathlib

import numpy as np
import pytest

import loaderx
from loaderx import DataLoader, DenseDataset, Sampler, Zrecord, _native, errors, from_numpy

PACKAGE = pathlib.Path(loaderx.__file__).parent

# The class each engine variant is raised as, and the built-in it must also be.
ENGINE = {
    "Io": (FileNotFoundError, OSError),
    "Corrupt": (errors.CorruptStoreError, None),
    "IndexOutOfRange": (errors.LoaderxIndexError, IndexError),
    "LimitExceeded": (errors.LimitExceededError, ValueError),
    "Busy": (errors.StoreBusyError, None),
    "Changed": (errors.StoreChangedError, None),
    "MissingDictionary": (errors.MissingDictionaryError, None),
    "InvalidArgument": (errors.LoaderxValueError, ValueError),
    "Internal": (errors.InternalError, None),
}


def test_the_tree():
    assert errors.ZrecordError is errors.LoaderxError is loaderx.LoaderxError
    assert errors.ZrecordIndexError is errors.LoaderxIndexError
    assert errors.ZrecordValueError is errors.LoaderxValueError
    assert issubclass(errors.LoaderxError, RuntimeError)
    builtin_of = {
        errors.LoaderxIndexError: IndexError, errors.LoaderxTypeError: TypeError,
        errors.LoaderxValueError: ValueError, errors.LimitExceededError: ValueError,
        errors.DatasetError: ValueError, errors.StoreClosedError: ValueError,
        errors.LoaderClosedError: ValueError,
    }
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.LoaderxError), name
        for builtin in (IndexError, TypeError, ValueError):
            assert issubclass(cls, builtin) == (builtin_of.get(cls) is builtin), (name, builtin)


@pytest.mark.skipif(not hasattr(_native, "engine_errors"),
                    reason="needs the native module's test hooks (cargo feature 'testing')")
def test_every_engine_variant_has_its_pinned_class():
    got = dict(_native.engine_errors())
    assert set(got) == set(ENGINE), "a variant was added or removed: pin its class here"
    for variant, (cls, builtin) in ENGINE.items():
        assert type(got[variant]) is cls, variant
        if builtin is not None:
            assert isinstance(got[variant], builtin), variant
    assert got["Io"].errno == 2 and got["Io"].filename == "/store"


# Each variant provoked the way a user would, through the native handle (below the Python
# layer's own argument checks) and through the public API.

def test_engine_errors_from_real_calls(tmp_path):
    with pytest.raises(NotADirectoryError):
        (tmp_path / "file").write_bytes(b"")
        _native.Zrecord(str(tmp_path / "file" / "store"), "raw")
    store = _native.Zrecord(str(tmp_path / "s"), "raw")
    store.append(np.zeros(8, np.uint8), np.array([0, 4], np.uint64), None)  # 2 records
    store.sync()
    with pytest.raises(errors.LoaderxIndexError):
        store.gather(np.array([2], np.uint64), np.zeros(8, np.uint8),
                     np.array([0], np.uint64))
    with pytest.raises(errors.LimitExceededError):
        store.append(np.zeros((1 << 20) + 1, np.uint8), np.array([0], np.uint64), None)
    with pytest.raises(errors.MissingDictionaryError):
        store.append(np.zeros(4, np.uint8), np.array([0], np.uint64), "zstd_dict")
    with pytest.raises(errors.LoaderxValueError, match="unknown codec"):
        _native.Zrecord(str(tmp_path / "t"), "lz4")
    other = Zrecord(str(tmp_path / "s"))
    with pytest.raises(errors.StoreBusyError):
        other.lock_for_writing()  # the first handle wrote, so it holds the writer lock
    reader = Zrecord(str(tmp_path / "s"))
    store.delete(np.array([0], np.uint64))
    with pytest.raises(errors.StoreChangedError):
        reader.gather([0], np.zeros(4, np.uint8), [0])
    for h in (other, reader):
        h.close()
    with open(tmp_path / "s" / "meta.zr", "r+b") as f:
        f.truncate(100)
    with pytest.raises(errors.CorruptStoreError):
        Zrecord(str(tmp_path / "s"))


def test_binding_and_sampler_errors_take_the_same_mapping(tmp_path):
    with pytest.raises(errors.LoaderxValueError, match="without replacement"):
        Sampler(3, 5, "cyclic")
    with pytest.raises(errors.LoaderxValueError):
        _native.Sampler(0, 1, 0, 0)
    z = Zrecord(str(tmp_path / "s"), codec="raw")
    z.append(np.arange(8, dtype=np.uint8), [0, 4])
    with pytest.raises(errors.LoaderxValueError, match="contiguous"):
        z._native.append(np.arange(16, dtype=np.uint8)[::2], np.array([0], np.uint64), None)
    z.close()
    with pytest.raises(errors.StoreClosedError):
        z.gather([0], np.zeros(4, np.uint8), [0])


def test_python_layer_errors(tmp_path):
    from_numpy(tmp_path / "d", np.arange(12, dtype=np.float32).reshape(6, 2))
    ds = DenseDataset(tmp_path / "d")
    with pytest.raises(errors.LoaderxIndexError):
        ds[6]
    with pytest.raises(errors.LoaderxIndexError):
        ds.subset([0, 1])[2]
    with pytest.raises(errors.LoaderxTypeError):
        DataLoader({"x": ds}, batch_size=2, transform=3)  # type: ignore[arg-type]
    with pytest.raises(errors.LoaderxTypeError):
        DataLoader({"x": os.fspath(tmp_path / "d")}, batch_size=2)  # type: ignore[dict-item]
    loader = DataLoader({"x": ds}, batch_size=2, num_workers=0)
    with pytest.raises(errors.LoaderxTypeError):
        len(loader)
    loader.close()
    with pytest.raises(errors.LoaderClosedError):
        next(loader)
    with pytest.raises(errors.DatasetError):
        DenseDataset(tmp_path)


# Built-in exceptions the package may raise itself: protocol signals and the OS's own errors.
ALLOWED_BUILTINS = {"StopIteration", "ImportError", "FileNotFoundError", "AssertionError",
                    "KeyboardInterrupt", "NotImplementedError"}


def test_the_package_raises_only_its_own_errors():
    """Every ``raise SomeBuiltin(...)`` in the package is one of the allowed signals; the rest
    raise a loaderx class (which is also the built-in a caller may catch)."""
    offenders = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                name = func.id if isinstance(func, ast.Name) else None
                if (name and isinstance(getattr(builtins, name, None), type)
                        and name not in ALLOWED_BUILTINS):
                    offenders.append(f"{path.name}:{node.lineno} raises {name}")
    assert not offenders, offenders


def test_codec_names_come_from_the_engine():
    """The engine's list is the one list: the type checkers' Literal, the CLI's choices and the
    run-time check all agree with it, and the reference's spelling is still understood."""
    from typing import get_args

    from loaderx.zrecord import CODECS, Codec

    assert CODECS == _native.CODECS == get_args(Codec)
    assert _native.canonical_codec("zstdict") == "zstd_dict"
    for bad in ("none", "lz4", 3, None):
        with pytest.raises(errors.LoaderxValueError, match="unknown codec"):
            _native.canonical_codec(bad)
