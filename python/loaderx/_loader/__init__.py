"""The loader's parts below :class:`loaderx.dataloader.DataLoader` and its worker processes.

* :mod:`~loaderx._loader.batch` -- one batch built: sample, gather, transform;
* :mod:`~loaderx._loader.window` -- the prefetch window of batches in flight, in order;
* :mod:`~loaderx._loader.stats` -- the loader's clocks, counters and verdict
  (``DataLoader.stats()``), and :mod:`~loaderx._loader.host` -- what the machine offers it
  (usable cores, whether the GIL is on);
* :mod:`~loaderx._loader.context` -- a batch's seeded context (public:
  :mod:`loaderx.context`);
* :mod:`~loaderx._loader.prefetch` -- batches moved to a device ahead of use (public:
  :mod:`loaderx.prefetch`).

May use: :mod:`loaderx.errors`, :mod:`loaderx._native`, :mod:`loaderx.sampler` and
:mod:`loaderx._views`. Above it: :mod:`loaderx.workers` (which builds batches with these parts
in other processes), then :mod:`loaderx.dataloader`.
"""
