"""Datasets as NumPy views, and the views built on them: what a loader reads from.

* :mod:`~loaderx._views.dataset` -- dense and ragged datasets over a store (public:
  :mod:`loaderx.dataset`); :mod:`~loaderx._views.gather` -- the batched reads they share;
  :mod:`~loaderx._views.recycle` -- the aligned buffers reads land in, and the pools that
  recycle them once nothing can see them (the loader's, the packer's);
* :mod:`~loaderx._views.subset` and :mod:`~loaderx._views.concat` -- some records of a
  dataset, several datasets as one (:mod:`loaderx.subset`, :mod:`loaderx.concat`);
* :mod:`~loaderx._views.source` -- what the loader accepts as a dataset (:mod:`loaderx.source`);
* :mod:`~loaderx._views.packing` with its plans (:mod:`~loaderx._views.pack_plan`) -- token
  sequences packed into fixed-length rows (:mod:`loaderx.packing`);
* :mod:`~loaderx._views.mixture` with its plans (:mod:`~loaderx._views.mix_plan`) -- several
  datasets read as one stream in set proportions (:mod:`loaderx.mixture`).

May use: :mod:`loaderx.errors`, :mod:`loaderx._native`, :mod:`loaderx._store`,
:mod:`loaderx.zrecord` and :mod:`loaderx.sampler`; not the loader, intake or the converter.
"""
