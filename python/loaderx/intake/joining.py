"""Parts into one dataset: :func:`assemble` joins complete parts, written one by one into
``<dst>.parts/00000 ...``, into the dataset directory ``dst`` (a directory of parts; see
:mod:`loaderx.intake.directory`), whose rows are the parts' rows in part order.

Who writes the parts does not matter here: the tasks of a cluster
(:func:`loaderx.intake.parts.write_part`, :func:`~loaderx.intake.parts.from_dask`), or a
conversion that can be resumed (``from_arrow(..., resume=True)``, which writes one part per
Parquet file). Each part is a complete dataset directory of the same columns, published in one
atomic rename by :class:`~loaderx.intake.directory.DirectoryWriter`, so a part is there whole
or not at all.

:func:`assemble` checks that parts ``0 .. count-1`` are all there with the same columns, moves
them into a private staging directory beside ``dst`` as ``parts/00000 ...`` (renames: nothing
is copied), writes the manifest and publishes ``dst`` in one atomic rename; the empty
``<dst>.parts`` directory is then removed. A part left over from an earlier attempt with more
parts (index ``count`` or above) is refused, naming it, rather than dropped or joined in
silence. If publishing fails the parts are moved back, so assembling can be tried again.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from typing import Any

from loaderx import _native, staging
from loaderx.errors import DatasetError, LoaderxValueError
from loaderx.intake import directory
from loaderx.intake.directory import MANIFEST_FILE, PARTS_DIR, Manifest, Part, read_manifest

__all__ = ["assemble", "parts_dir", "part_path"]

_PART_NAME = re.compile(r"[0-9]{5}\Z")


def parts_dir(dst: str | os.PathLike[str]) -> str:
    """Where the parts of ``dst`` are written before :func:`assemble` joins them."""
    return os.path.abspath(os.fspath(dst)).rstrip(os.sep) + ".parts"


def part_path(dst: str | os.PathLike[str], index: int) -> str:
    """Where part ``index`` of ``dst`` is written."""
    return os.path.join(parts_dir(dst), f"{index:05d}")


def assemble(dst: str | os.PathLike[str], count: int, *, overwrite: bool = False,
             extra: dict[str, Any] | None = None) -> int:
    """Joins parts ``0 .. count-1`` (each written by :func:`loaderx.intake.parts.write_part`,
    or by a resumable ``from_arrow``) into the dataset directory
    ``dst`` (see the module docstring) and returns its row count. ``overwrite=True`` replaces
    a dataset already at ``dst``; ``extra`` is added to the manifest's ``extra`` (which is
    otherwise part 00000's)."""
    if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= 100_000:
        raise LoaderxValueError(f"count must be an int in 1..100000, got {count!r}")
    dst = os.path.abspath(os.fspath(dst))
    root = parts_dir(dst)
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    found = [n for n in names if _PART_NAME.match(n)]
    stray = [n for n in found if int(n) >= count]
    if stray:
        raise DatasetError(f"{root} holds part {stray[0]} (and {len(stray) - 1} more) past the "
                           f"{count} parts to assemble: left from an attempt with more tasks? "
                           "Remove it, or assemble with the right count")
    missing = [k for k in range(count) if f"{k:05d}" not in found]
    if missing:
        raise DatasetError(f"{root}: part {missing[0]:05d} (and {len(missing) - 1} more) was "
                           "never written; run its task (write_part) again, then assemble")
    manifests = [read_manifest(os.path.join(root, f"{k:05d}")) for k in range(count)]
    first = manifests[0]
    shape = [(c.name, c.kind, c.dtype, c.item_shape) for c in first.columns]
    for k, m in enumerate(manifests):
        if m.parts:
            raise DatasetError(f"part {k:05d} of {dst} has parts of its own (over 2^24 rows); "
                               "split the data into more partitions")
        if [(c.name, c.kind, c.dtype, c.item_shape) for c in m.columns] != shape:
            raise DatasetError(f"part {k:05d} of {dst} has other columns than part 00000 "
                               f"({[c.name for c in m.columns]} against {[s[0] for s in shape]}"
                               "); every task must write the same columns")
    if os.path.lexists(dst) and not overwrite:
        raise DatasetError(f"{dst} exists; pass overwrite=True to replace it")
    columns = tuple(directory.Column(c.name, "", c.kind, c.dtype, c.item_shape, c.codec,
                                     c.extra) for c in first.columns)
    manifest = Manifest(sum(m.rows for m in manifests), columns,
                        tuple(Part(f"{PARTS_DIR}/{k:05d}", m.rows)
                              for k, m in enumerate(manifests)), {**first.extra, **(extra or {})})
    staging.remove_stale(dst)
    with staging.private_dir(dst, "assemble") as build:
        os.mkdir(os.path.join(build, PARTS_DIR))
        for k in range(count):
            os.rename(os.path.join(root, f"{k:05d}"), os.path.join(build, PARTS_DIR, f"{k:05d}"))
        staging.fsync_dir(os.path.join(build, PARTS_DIR))
        staging.fsync_dir(root)
        _native.replace_file(build, MANIFEST_FILE, manifest.to_bytes())
        try:
            if os.path.lexists(dst):
                staging.replace(build, dst)
            else:
                staging.publish(build, dst)
        except BaseException:
            # Put the parts back where their tasks wrote them: assembling can be tried again.
            for k in range(count):
                with contextlib.suppress(OSError):
                    os.rename(os.path.join(build, PARTS_DIR, f"{k:05d}"),
                              os.path.join(root, f"{k:05d}"))
            raise
    with contextlib.suppress(OSError):
        staging.remove_stale(root)
        if not any(_PART_NAME.match(n) for n in os.listdir(root)):
            shutil.rmtree(root)
    return manifest.rows
