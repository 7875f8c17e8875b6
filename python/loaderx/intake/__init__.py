"""Bringing data in: converters from the formats datasets come in, and the *dataset directory*
they write (one loaderx store per column plus a manifest; see :mod:`loaderx.intake.directory`).

* :func:`open_dataset` -- a dataset directory as ``{column: dataset}``, ready for the
  :class:`~loaderx.dataloader.DataLoader` and :func:`~loaderx.subset.split`;
  :func:`decode_strings` gives a string column's text back.
* :func:`from_arrow` (:mod:`loaderx.intake.tables`) -- anything that speaks Arrow (pyarrow,
  polars, DuckDB, pandas, Hugging Face ``datasets``) and Parquet files or globs.
* :func:`from_image_folder` and :func:`from_webdataset` (:mod:`loaderx.intake.files`) --
  folders of images (a folder per class) and WebDataset tar shards, the files' bytes kept;
  :func:`export_image_folder` and :func:`export_webdataset` write them back.
* :func:`from_token_stream` and :func:`split_documents` (:mod:`loaderx.intake.tokens`) -- a
  flat token stream (a nanoGPT-style ``.bin``, a 1-D ``.npy``) cut into documents at the end
  token, written for :func:`loaderx.pack`.
* :func:`append_dataset`, :func:`delete_rows` (:mod:`loaderx.intake.growing`) -- a dataset
  directory grown by another's rows or shrunk by rows, every column at once, in one
  transaction (class names matched by name); converters take ``append=True`` too.
* :func:`append_rows` (:mod:`loaderx.intake.appending`) -- rows appended in place to a
  directory with a commit point (``group_columns=True``), durably, readers undisturbed.
* :class:`DirectoryWriter` -- the transaction every converter writes through.

pyarrow is imported only when a table is converted.
"""

from __future__ import annotations

from loaderx.intake.appending import append_rows
from loaderx.intake.directory import (
    Column,
    DirectoryWriter,
    Manifest,
    RaggedBatch,
    decode_strings,
    is_dataset_directory,
    open_dataset,
    read_manifest,
)
from loaderx.intake.files import (
    export_image_folder,
    export_webdataset,
    from_image_folder,
    from_webdataset,
)
from loaderx.intake.growing import append_dataset, delete_rows, repair_dataset
from loaderx.intake.tables import from_arrow
from loaderx.intake.tokens import from_token_stream, split_documents

__all__ = [
    "Column", "DirectoryWriter", "Manifest", "RaggedBatch", "decode_strings",
    "from_arrow", "is_dataset_directory", "open_dataset", "read_manifest",
    "export_image_folder", "export_webdataset", "from_image_folder", "from_webdataset",
    "from_token_stream", "split_documents", "append_dataset", "delete_rows", "repair_dataset",
    "append_rows",
]
