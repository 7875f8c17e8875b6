"""Shared mappings of memfd segments that keep no file descriptor.

Python's ``mmap.mmap`` keeps a duplicate of the descriptor for as long as the map lives (3.13
adds ``trackfd=False``), so a consumer holding many batches -- ``list(loader.epoch())`` --
would run out of descriptors long before it runs out of memory. A :class:`Mapping` maps the
segment with the C library's ``mmap`` through ``ctypes``, after which the descriptor can be
closed; the mapping is released (``munmap``) when the object is garbage, i.e. when the last
array over it is gone (arrays reach it through their lease).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

from loaderx.errors import InternalError

__all__ = ["Mapping"]

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_FAILED = ctypes.c_void_p(-1).value


class Mapping:
    """``size`` bytes of the file ``fd`` mapped read-write and shared; ``address`` is where.
    The caller may close ``fd`` right after."""

    __slots__ = ("address", "interface", "size")

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self.address = 0
        address = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED,
                             fd, 0)
        if address is None or address == _FAILED:
            code = ctypes.get_errno()
            raise InternalError(f"mapping a loader batch segment of {size} bytes failed: "
                                f"{os.strerror(code)}")
        self.address = address
        #: The mapping as NumPy's array interface (shared by every lease over it: NumPy only
        #: reads it).
        self.interface = {"shape": (size,), "typestr": "|u1", "data": (address, False),
                          "version": 3}

    def __del__(self) -> None:
        if self.address:
            _libc.munmap(self.address, self.size)
            self.address = 0
