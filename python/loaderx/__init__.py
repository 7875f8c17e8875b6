"""loaderx: a compact, fast persistent record store and an endless, step-based data loader.

The store engine is Rust (``loaderx._native``); this package is its NumPy-native face. The
public names are importable from here::

    from loaderx import from_numpy, DenseDataset, DataLoader

* :mod:`loaderx.converter` -- :func:`from_numpy` (arrays) and :func:`from_iterator` (ragged
  records, bytes) write datasets.
* :mod:`loaderx.dataset` -- :class:`DenseDataset`, :class:`RaggedDataset` and :func:`pad`;
  :mod:`loaderx.concat` -- :class:`ConcatDataset`, one index space over several datasets;
  :mod:`loaderx.subset` -- :class:`Subset` views and seeded :func:`split`.
* :mod:`loaderx.dataloader` -- :class:`DataLoader`, the endless step-based loader;
  :mod:`loaderx.sampler` -- :class:`Sampler` and :class:`Mode`, batch indices as a pure
  function of (seed, step).
* :mod:`loaderx.intake` -- bringing data in: :func:`from_arrow` (Arrow tables of any library,
  Parquet files), :func:`from_image_folder` and :func:`from_webdataset` (image folders, tar
  shards) write a dataset directory (a store per column), :func:`open_dataset` opens it as
  ``{column: dataset}``; :func:`from_token_stream` cuts a flat token file into documents.
* :mod:`loaderx.packing` -- :func:`pack`: token documents as fixed-length rows (packed
  sequences with segment ids and positions) for language models.
* :mod:`loaderx.mixture` -- :func:`mix`: several datasets as one stream in exact proportions
  (weights or a schedule), for data mixtures.
* :mod:`loaderx.zrecord` -- :class:`Zrecord`, the raw byte-record store underneath.
* :mod:`loaderx.errors` -- the exception hierarchy (base :class:`LoaderxError`, alias
  ``ZrecordError``).
* :mod:`loaderx.sharding` and :mod:`loaderx.frameworks` -- multi-host shards, torch and JAX
  (:func:`torch_batches`, :class:`Zip`, :func:`prefetch_to_device`, :func:`prefetch_to_torch`;
  neither framework is imported until a helper is called); :mod:`loaderx.prefetch` --
  :class:`Prefetcher`, batches taken ahead with the loop's position kept.
* :func:`set_num_threads` -- threads a batch is split across.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("loaderx")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

# Re-exported so that the common names need one import; the modules stay the reference.
from loaderx import errors
from loaderx._native import set_num_threads
from loaderx.concat import ConcatDataset
from loaderx.context import BatchContext
from loaderx.converter import from_iterator, from_numpy
from loaderx.dataloader import DataLoader
from loaderx.dataset import DenseDataset, RaggedDataset, pad
from loaderx.errors import LoaderxError, ZrecordError
from loaderx.frameworks import (  # each imports torch or JAX only when called
    Zip,
    pad_collate,
    prefetch_to_device,
    prefetch_to_torch,
    to_torch,
    torch_batches,
)
from loaderx.intake import (
    append_dataset,
    decode_strings,
    delete_rows,
    from_arrow,
    from_image_folder,
    from_token_stream,
    from_webdataset,
    open_dataset,
)
from loaderx.mixture import Mixture, mix
from loaderx.packing import PackedDataset, pack
from loaderx.prefetch import Prefetcher
from loaderx.sampler import Mode, Sampler
from loaderx.sharding import jax_process_shard, single_process, torch_process_shard
from loaderx.subset import Subset, split
from loaderx.zrecord import Zrecord

__all__ = [
    "BatchContext", "ConcatDataset", "DataLoader", "DenseDataset", "LoaderxError", "Mode",
    "PackedDataset", "Prefetcher", "RaggedDataset", "Sampler", "Subset", "Zip", "Zrecord",
    "ZrecordError", "errors", "from_iterator", "from_numpy", "jax_process_shard", "pack", "pad",
    "pad_collate", "prefetch_to_device", "prefetch_to_torch", "set_num_threads",
    "single_process", "split", "to_torch", "torch_batches", "torch_process_shard",
    "__version__",
    "decode_strings", "from_arrow", "open_dataset",  # loaderx.intake
    "from_image_folder", "from_token_stream", "from_webdataset", "append_dataset",
    "delete_rows",
    "Mixture", "mix",  # loaderx.mixture
]
