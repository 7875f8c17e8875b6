"""``loaderx upgrade DIR``: a dataset directory of the older layout (manifest version 1: a store
per column, or parts of them) rewritten in the current one -- its raw fixed-width columns in a
column group, one commit point (manifest version 2) -- so that it reads a batch of all its
narrow columns in one call and grows in place (:mod:`loaderx.intake.appending`).

The rewrite is one transaction, as a conversion is: the new directory is built aside from the
old one's rows and put in its place atomically (the old stores are retired: their open handles
learn that the dataset was replaced). Every column keeps its name, kind, dtype, item shape,
codec and manifest keys, every row its values; the directory's extra keys are kept.
"""

from __future__ import annotations

import os
from typing import Any, cast

import numpy as np

from loaderx.intake.directory import DirectoryWriter, open_dataset, read_manifest
from loaderx.zrecord import Codec

__all__ = ["upgrade"]

#: Rows read and written at a time.
_STEP = 1 << 16


def upgrade(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Rewrites the dataset directory ``path`` in the current layout (see the module docstring)
    and returns ``{"path", "rows", "upgraded", "grouped"}``: ``upgraded`` False when it already
    was (nothing is written), ``grouped`` the columns now in a column group."""
    from loaderx.intake.growing import _records  # growing imports this layer's neighbours

    path = os.path.abspath(os.fspath(path))
    manifest = read_manifest(path)
    if manifest.generation and not manifest.parts:
        return {"path": path, "rows": manifest.rows, "upgraded": False,
                "grouped": [c.name for c in manifest.columns if c.group is not None]}
    columns = open_dataset(path)
    try:
        with DirectoryWriter(path, overwrite=True, group_columns=True,
                             extra=manifest.extra) as writer:
            for col in manifest.columns:
                writer.add_column(col.name, col.kind, col.dtype, col.item_shape,
                                  codec=cast(Codec, col.codec), extra=col.extra)
            for lo in range(0, manifest.rows, _STEP):
                idx = np.arange(lo, min(manifest.rows, lo + _STEP), dtype=np.uint64)
                writer.append({c.name: _records(columns[c.name], idx)
                               for c in manifest.columns})
            grouped = [c.name for c in writer.columns if c.group is not None]
    finally:
        for ds in columns.values():
            ds.close()
    return {"path": path, "rows": manifest.rows, "upgraded": True, "grouped": grouped}
