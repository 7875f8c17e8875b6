"""One index space over several datasets of the same schema: for data past one store's 2^24
records, or data written in parts.

>>> import numpy as np, tempfile, os
>>> from loaderx.converter import from_numpy
>>> root = tempfile.mkdtemp()
>>> for k in range(3):
...     _ = from_numpy(os.path.join(root, f"part{k}"), np.full((4, 2), k, dtype=np.int16))
>>> ds = ConcatDataset([os.path.join(root, f"part{k}") for k in range(3)])
>>> len(ds), ds[[0, 5, 11]].tolist()
(12, [[0, 0], [1, 1], [2, 2]])

The view is read-only (write to the parts). Dense parts make a dense view, ragged parts a
ragged view whose items are lists of arrays; the :class:`~loaderx.dataloader.DataLoader` takes
either as a stream, like the datasets themselves. Record ``i`` of the view is
record ``i - start(k)`` of the part ``k`` that holds it; the parts' lengths are read once, when
the view is made (appending to a part later does not grow the view). A view pickles as its
parts do: by absolute path, each with its own ``verify_reads``. A part may also be a column
of a column group (``open_dataset(dir)["label"]``): such a view reads part by part, the
others one native call a batch.
"""

from loaderx._views.concat import ConcatDataset

__all__ = ["ConcatDataset"]
