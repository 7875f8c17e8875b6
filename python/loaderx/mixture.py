"""Data mixtures: several datasets read as one stream in exact proportions (:func:`mix`).

``mix(sources, weights, seed=0)`` is a view over several datasets or views of one kind -- dense
datasets of one dtype and item shape, ragged datasets, or packed views of one ``seq_len``
(their segment ids and positions carried through) -- whose record ``n`` is the ``n``-th draw of
the mixed order. A :class:`~loaderx.dataloader.DataLoader` takes it as a stream and reads its
positions in order (a mixture *defines* the order: the loader's own shuffle would turn exact
proportions back into a random draw), so batch ``k`` is positions ``k * batch_size`` on, its
rows grouped by source (each source's rows in their mixed order, so that each source's part of
a batch is one gather straight into the batch; :meth:`Mixture.batch_order` gives each row's
position):

* **Exact proportions.** Among the first ``n`` positions, source ``i`` has ``floor(w_i n)`` or
  ``ceil(w_i n)`` records, for every ``n`` -- within one record of ``weight * n`` on every
  prefix, so every batch holds each source's share within two rows. (Weights that are ratios
  of a period of at most 2**20 are kept exactly, ``0.7 / 0.2 / 0.1``, ``[3, 1]`` or decimals of
  up to 5 digits; others are rounded to the period of at most 65536 that fits them best, and
  the counts are within one record of the rounded weights: :attr:`Mixture.weights` says which.)
* **Each source in its own order.** Source ``i`` is read in a seeded permutation of its records
  per pass over it, a new one each pass, so no record repeats before all of it was used; a
  small source just cycles more often (:meth:`Mixture.stats`: passes used per source). Packed
  views made with ``pack(..., repack=True)`` are also packed anew for each pass.
* **Pure in (seed, position).** Nothing the size of the run exists: the order is a table of one
  period (see :mod:`loaderx._views.mix_plan`), a source's record is its permutation at a computed
  draw number. So ``seek``, ``state_dict`` and resume are exact on any number of workers and
  hosts, and shards split each batch as for any stream.
* **Which source.** ``batch[name + "_source"]`` (int32) is each row's source index, for loss
  logging per source.

>>> import numpy as np, tempfile, os
>>> from loaderx.converter import from_numpy
>>> from loaderx.dataset import DenseDataset
>>> root = tempfile.mkdtemp()
>>> _ = from_numpy(os.path.join(root, "a"), np.zeros(10, dtype=np.int16))
>>> _ = from_numpy(os.path.join(root, "b"), np.ones(4, dtype=np.int16))
>>> blend = mix([DenseDataset(os.path.join(root, "a")), DenseDataset(os.path.join(root, "b"))],
...             [3, 1])
>>> blend[:8].tolist()
[0, 0, 1, 0, 0, 0, 1, 0]
>>> from loaderx.dataloader import DataLoader
>>> with DataLoader({"x": blend}, batch_size=4, num_workers=0) as loader:
...     batch = next(loader)
>>> batch["x"].tolist(), batch["x_source"].tolist()   # positions 0-3, grouped by source
([0, 0, 0, 1], [0, 0, 0, 1])

Schedules: ``mix(sources, schedule=[(0, w0), (1000, w1)], batch_size=B)`` starts with weights
``w0`` and moves to ``w1`` over steps 0 to 1000 (``transition="linear"``; ``"step"`` switches at
each milestone's step), then keeps ``w1``. The batch size turns steps into positions (the
loader checks it is its own). Every milestone is exact -- each source's count there is its
target (after a linear transition of an odd number of rows: within 2.5) -- and between
milestones the counts stay within one record of the schedule's target
while the weights hold, within 2.5 inside a linear transition. A schedule's weights are kept
as ratios of a period that divides its milestones' rows (each ``step * batch_size``), up to
65536.

Dicts of aligned streams mix alike: ``mix([{"image": xa, "label": ya}, {"image": xb, "label":
yb}], [3, 1])`` is ``{"image": Mixture, "label": Mixture}`` in one order, so images keep their
labels; ``batch["image_source"]`` says which source (the first stream's name).

A mixture has no end, so ``loader.epoch()`` refuses it: a pass over a mixture would mean a pass
over every source at once, which the weights do not give (the small sources would repeat, or
the large ones be cut). Evaluate on each source's own loader.

Label streams whose dataset directories number their classes differently (``cat`` is 0 in one,
``dog`` in the other) are refused, as :class:`~loaderx.concat.ConcatDataset` refuses them; a
mixture takes at most :data:`MAX_SOURCES` sources (65,535).
"""

from loaderx._views.mixture import MAX_SOURCES, MIX_LENGTH, Mixture, mix, ordered_streams

__all__ = ["mix", "Mixture", "ordered_streams", "MIX_LENGTH", "MAX_SOURCES"]
