"""Batches taken ahead of the training loop, without losing the loop's place.

:func:`~loaderx.frameworks.prefetch_to_device` (JAX) and
:func:`~loaderx.frameworks.prefetch_to_torch` keep ``size`` batches in flight to the devices:
when the loop trains on step ``s``, the loader has already handed out steps up to
``s + size - 1`` and its own ``step`` is ``s + size``. A checkpoint of that position would resume
past batches that were never trained. A :class:`Prefetcher` therefore knows the step of every
batch it holds, and

* ``prefetcher.step`` and ``prefetcher.state_dict()`` describe the next batch the *loop* gets
  (checkpoint through them);
* a :class:`~loaderx.dataloader.DataLoader` it reads from counts the batches it holds, so the
  loader's own ``state_dict()`` points at the same batch;
* ``seek`` / ``load_state_dict`` (on the prefetcher or on the loader) drop the batches held, and
  the next one comes from the new position;
* ``close()`` (or leaving its ``with`` block) hands the batches it holds back to the loader: the
  loader continues with the first batch the loop did not get.

It is an iterator for one consumer thread, as the loader's ``next()`` is for one loop.
"""

from loaderx._loader.prefetch import Prefetcher

__all__ = ["Prefetcher"]
