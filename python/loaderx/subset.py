"""Views of some records of a dataset: subsets and seeded splits, without writing anything.

``Subset(dataset, indices)`` (or ``dataset.subset(indices)``) is the records ``indices`` of a
:class:`~loaderx.dataset.DenseDataset`, :class:`~loaderx.dataset.RaggedDataset` or
:class:`~loaderx.concat.ConcatDataset`, renumbered ``0..len(indices)``: indexing it is indexing
the dataset at ``indices[i]``, in one gather. A subset, dense or ragged, is a
:class:`~loaderx.dataloader.DataLoader` stream like the dataset itself. :func:`split` cuts a
dataset into disjoint subsets of given fractions from a seeded permutation, the usual
train/validation split; given a dict of aligned streams it splits them all at the same
indices, so images keep their labels.

>>> import numpy as np, tempfile, os
>>> from loaderx.converter import from_numpy
>>> from loaderx.dataset import DenseDataset
>>> path = os.path.join(tempfile.mkdtemp(), "x")
>>> _ = from_numpy(path, np.arange(10, dtype=np.int32) * 10)
>>> train, val = split(DenseDataset(path), [0.8, 0.2], seed=0)
>>> len(train), len(val), sorted(set(train[:]) | set(val[:])) == list(range(0, 100, 10))
(8, 2, True)
>>> _ = from_numpy(path + "-twice", np.arange(10, dtype=np.int32) * 20)
>>> train, val = split({"x": DenseDataset(path), "y": DenseDataset(path + "-twice")}, [0.8, 0.2])
>>> bool((train["y"][:] == 2 * train["x"][:]).all()), len(val["x"]), len(val["y"])
(True, 2, 2)

Subsets pickle by the dataset (its absolute path and settings) and their indices, so they
travel to worker processes.
"""

from loaderx._views.subset import Subset, split

__all__ = ["Subset", "split"]
