"""Datasets: NumPy views of a loaderx store.

:class:`DenseDataset` reads a dense store (written by :func:`loaderx.converter.from_numpy`):
every record is one ``item_shape`` array, and any batch of records is gathered at a fixed
stride straight into one ``(n, *item_shape)`` array. :class:`RaggedDataset` reads a ragged
store (written by :func:`loaderx.converter.from_iterator`) into a list of arrays, and
:func:`pad` turns such a list into one dense batch. Both are
:class:`~loaderx.dataloader.DataLoader` streams (a ragged one gives each batch as a list of
arrays, for the transform to decode or pad).

>>> import numpy as np, tempfile, os
>>> from loaderx.converter import from_numpy, from_iterator
>>> root = tempfile.mkdtemp()
>>> _ = from_numpy(os.path.join(root, "x"), np.arange(10, dtype=np.int16) * 10)
>>> ds = DenseDataset(os.path.join(root, "x"))
>>> ds[-1], ds[[3, 1]], ds[2:8:3], ds.dtype, ds.item_shape
(np.int16(90), array([30, 10], dtype=int16), array([20, 50], dtype=int16), dtype('int16'), ())
>>> _ = from_iterator(os.path.join(root, "t"), [np.arange(n, dtype=np.int32) for n in (3, 1, 2)])
>>> pad(RaggedDataset(os.path.join(root, "t"))[[0, 1, 2]], pad_value=-1)
(array([[ 0,  1,  2],
       [ 0, -1, -1],
       [ 0,  1, -1]], dtype=int32), array([3, 1, 2]))

Datasets pickle by their absolute path (resolved when they are opened, so a worker whose working
directory differs reopens the same store) and their settings (``verify_reads``), so they travel
to worker processes started with ``spawn`` or ``forkserver``, which reopen the store; they also
keep working in ``fork``-ed children.
"""

from loaderx._views.dataset import DenseDataset, RaggedDataset, pad
from loaderx.zrecord import FORMAT, SCHEMA, Zrecord  # loaderx 0.9.11's names here too

__all__ = ["DenseDataset", "RaggedDataset", "pad", "FORMAT", "SCHEMA", "Zrecord"]
