"""``renameat2`` through ctypes, for tests run against a native module built before it had
``rename_exchange``/``rename_noreplace`` (installed only where those are missing)."""

from __future__ import annotations

import ctypes
import os

from loaderx import _native

_AT_FDCWD = -100
_NOREPLACE, _EXCHANGE = 1, 2


def _renameat2(a: str, b: str, flags: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    r = libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags)
    return 0 if r == 0 else ctypes.get_errno()


def rename_exchange(a: str, b: str) -> None:
    err = _renameat2(a, b, _EXCHANGE)
    if err:
        raise OSError(err, os.strerror(err), a)


def rename_noreplace(src: str, dst: str) -> bool:
    err = _renameat2(src, dst, _NOREPLACE)
    if err == 17:  # EEXIST
        return False
    if err:
        raise OSError(err, os.strerror(err), src)
    return True


def install() -> None:
    """Puts the stand-ins on ``loaderx._native`` where the real ones are missing."""
    for name, fn in (("rename_exchange", rename_exchange), ("rename_noreplace", rename_noreplace)):
        if not hasattr(_native, name):
            setattr(_native, name, fn)
