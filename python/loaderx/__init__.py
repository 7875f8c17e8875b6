"""loaderx: a compact, fast persistent record store and an endless, step-based data loader.

The store engine is Rust (``loaderx._native``); this package is its NumPy-native face:

* :mod:`loaderx.zrecord` -- :class:`~loaderx.zrecord.Zrecord`, the raw byte-record store.
* :mod:`loaderx.errors` -- the exception hierarchy.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("loaderx")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

from loaderx.errors import ZrecordError  # noqa: E402

__all__ = ["ZrecordError", "__version__"]
