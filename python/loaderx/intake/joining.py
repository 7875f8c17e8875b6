"""Parts into one dataset: :func:`assemble` joins complete parts, written one by one into
``<dst>.parts/00000 ...``, into the dataset directory ``dst`` (a directory of parts; see
:mod:`loaderx.intake.directory`), whose rows are the parts' rows in part order.

Who writes the parts does not matter here: the tasks of a cluster
(:func:`loaderx.intake.parts.write_part`, :func:`~loaderx.intake.parts.from_dask`), or a
conversion that can be resumed (``from_arrow(..., resume=True)``, which writes one part per
Parquet file). Each part is a complete dataset directory of the same columns, published in one
atomic rename by :class:`~loaderx.intake.directory.DirectoryWriter`, so a part is there whole
or not at all.

:func:`assemble` checks that parts ``0 .. count-1`` are all there with the same columns,
then *joins* them: in a private staging directory beside ``dst`` it makes one store per column
whose records are the parts' records in part order -- the parts' chunk files hard-linked in
under new numbers and their record tables written once, moved (``Zrecord.join_from``,
``crates/zrecord/src/join.rs``), so no record is copied -- writes the manifest and publishes
``dst`` in one atomic rename, then removes the parts. ``dst`` is then an ordinary dataset
directory: a batch reads one store per column, at one store's speed, however many parts wrote
it. More rows than one store holds (2^24) are joined into groups of consecutive parts, a
directory of parts again but of fewer, larger ones. Parts that cannot be joined -- a column
whose parts chose different codecs, or zstd dictionaries of their own, or a file system without
hard links (another device) -- are moved in as they are (renames: nothing is copied), a
directory of parts; ``join=False`` asks for that. A part left over from an earlier attempt with
more parts (index ``count`` or above) is refused, naming it, rather than dropped or joined in
silence. If publishing fails, moved parts are moved back (joined ones were never touched), so
assembling can be tried again; the parts are removed only once ``dst`` is published.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from collections.abc import Sequence
from typing import Any, cast

from loaderx import _native, _schema, staging
from loaderx.errors import DatasetError, LoaderxValueError
from loaderx.intake.directory import (
    MANIFEST_FILE,
    PARTS_DIR,
    Column,
    Manifest,
    Part,
    claim_destination,
    put_in_place,
    read_manifest,
    release_stores,
)
from loaderx.zrecord import MAX_CHUNKS, MAX_RECORDS, Codec, Zrecord, chunk_number

__all__ = ["assemble", "parts_dir", "part_path", "discard_parts", "shares_chunks"]

_PART_NAME = re.compile(r"[0-9]{5}\Z")


def parts_dir(dst: str | os.PathLike[str]) -> str:
    """Where the parts of ``dst`` are written before :func:`assemble` joins them."""
    return os.path.abspath(os.fspath(dst)).rstrip(os.sep) + ".parts"


def part_path(dst: str | os.PathLike[str], index: int) -> str:
    """Where part ``index`` of ``dst`` is written."""
    return os.path.join(parts_dir(dst), f"{index:05d}")


def assemble(dst: str | os.PathLike[str], count: int, *, overwrite: bool = False,
             extra: dict[str, Any] | None = None, join: bool = True) -> int:
    """Joins parts ``0 .. count-1`` (each written by :func:`loaderx.intake.parts.write_part`,
    or by a resumable ``from_arrow``) into the dataset directory
    ``dst`` (see the module docstring) and returns its row count. ``overwrite=True`` replaces
    a dataset already at ``dst``; ``extra`` is added to the manifest's ``extra`` (which is
    otherwise part 00000's). ``join=False`` keeps the parts as they are, a directory of parts,
    instead of joining them into one store per column."""
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
    staging.remove_stale(dst)
    # As every converter: only a dataset or store is replaced, under its stores' writer locks
    # (so its readers learn of the replacement); anything else at dst is refused.
    old = claim_destination(dst, overwrite)
    try:
        return _assemble(dst, root, manifests, {**first.extra, **(extra or {})}, join, old)
    finally:
        release_stores(old)


def _assemble(dst: str, root: str, manifests: list[Manifest], extra_all: dict[str, Any],
              join: bool, old: list[Zrecord]) -> int:
    count, first = len(manifests), manifests[0]
    with staging.private_dir(dst, "assemble") as build:
        manifest = _joined(build, root, manifests, extra_all) if join else None
        moved = manifest is None
        if manifest is None:
            manifest = Manifest(sum(m.rows for m in manifests), _storeless(first.columns),
                                tuple(Part(f"{PARTS_DIR}/{k:05d}", m.rows)
                                      for k, m in enumerate(manifests)), extra_all)
            os.mkdir(os.path.join(build, PARTS_DIR))
            for k in range(count):
                os.rename(os.path.join(root, f"{k:05d}"),
                          os.path.join(build, PARTS_DIR, f"{k:05d}"))
            staging.fsync_dir(os.path.join(build, PARTS_DIR))
            staging.fsync_dir(root)
        _native.replace_file(build, MANIFEST_FILE, manifest.to_bytes())
        try:
            put_in_place(build, dst, old)
        except BaseException:
            # Put the parts back where their tasks wrote them: assembling can be tried again.
            for k in range(count if moved else 0):
                with contextlib.suppress(OSError):
                    os.rename(os.path.join(build, PARTS_DIR, f"{k:05d}"),
                              os.path.join(root, f"{k:05d}"))
            raise
    # Joined: every part's records are in dst's stores (their chunk files are linked there),
    # so the parts go; moved: only the empty parts directory is left.
    discard_parts(dst)
    return manifest.rows


def discard_parts(dst: str | os.PathLike[str]) -> None:
    """Removes ``<dst>.parts``: the parts in it, the staging left by tasks killed while they
    wrote one, and the directory. For once ``dst`` holds everything they held (or after a kill
    between publishing ``dst`` and this step, when the finished conversion runs again)."""
    root = parts_dir(dst)
    with contextlib.suppress(OSError):
        staging.remove_stale(root)
        for name in os.listdir(root):
            if _PART_NAME.match(name):
                shutil.rmtree(os.path.join(root, name))
        if not os.listdir(root):
            os.rmdir(root)


def shares_chunks(part: str) -> bool:
    """Whether a chunk file of part ``part`` has another name too: a part joined into a
    published dataset that a kill kept from being removed. Its bytes are that dataset's now
    (compacting it rewrites them in place), so it is never joined again."""
    for store in os.listdir(part):
        path = os.path.join(part, store)
        if not os.path.isdir(path) or os.path.islink(path):
            continue
        for name in os.listdir(path):
            if chunk_number(name) is not None \
                    and os.lstat(os.path.join(path, name)).st_nlink > 1:
                return True
    return False


def _storeless(columns: Sequence[Column]) -> tuple[Column, ...]:
    """The columns as a directory of parts lists them: each part's manifest names its stores."""
    return tuple(Column(c.name, "", c.kind, c.dtype, c.item_shape, c.codec, c.extra)
                 for c in columns)


def _joined(build: str, root: str, manifests: list[Manifest],
            extra: dict[str, Any]) -> Manifest | None:
    """The parts joined into one store per column in ``build`` (groups of consecutive parts
    of at most 2^24 rows each, when they hold more), their chunk files linked, not copied; the
    manifest to publish. None when they cannot be joined -- a column whose parts chose other
    codecs, or a zstd dictionary each, or a file system without hard links -- and ``build``
    is then left empty for the parts to be moved in as they are."""
    # The codec of the first part with rows (an empty part's choice stored nothing).
    first = next((m for m in manifests if m.rows), manifests[0])
    for i, col in enumerate(first.columns):
        codecs = {m.columns[i].codec for m in manifests if m.rows} or {col.codec}
        if codecs != {col.codec} or col.codec == "zstd_dict":
            return None
    # Consecutive parts per group, at most one store's records and chunks (a part brings the
    # chunks its stores' files are numbered up to).
    groups: list[list[int]] = [[]]
    rows = chunks = 0
    for k, m in enumerate(manifests):
        part_chunks = max(_chunks_of(os.path.join(root, f"{k:05d}", c.store))
                          for c in m.columns) if m.columns else 0
        if groups[-1] and (rows + m.rows > MAX_RECORDS or chunks + part_chunks > MAX_CHUNKS):
            groups.append([])
            rows = chunks = 0
        groups[-1].append(k)
        rows += m.rows
        chunks += part_chunks
    total = sum(m.rows for m in manifests)
    try:
        if len(groups) == 1:
            _join_group(build, root, manifests, groups[0], first.columns)
            return Manifest(total, first.columns, (), extra)
        os.mkdir(os.path.join(build, PARTS_DIR))
        parts = []
        for g, group in enumerate(groups):
            target = os.path.join(build, PARTS_DIR, f"{g:05d}")
            os.mkdir(target)
            _join_group(target, root, manifests, group, first.columns)
            group_rows = sum(manifests[k].rows for k in group)
            _native.replace_file(target, MANIFEST_FILE,
                                 Manifest(group_rows, first.columns, (), extra).to_bytes())
            parts.append(Part(f"{PARTS_DIR}/{g:05d}", group_rows))
        staging.fsync_dir(os.path.join(build, PARTS_DIR))
        return Manifest(total, _storeless(first.columns), tuple(parts), extra)
    except OSError as e:
        if e.errno not in _NO_LINKS:
            raise
        for name in os.listdir(build):
            shutil.rmtree(os.path.join(build, name))
        return None


def _chunks_of(store: str) -> int:
    """One past the highest chunk file number in ``store``: at least the chunks it uses."""
    numbers = [n for n in map(chunk_number, os.listdir(store)) if n is not None]
    return max(numbers, default=-1) + 1


#: What ``link`` fails with where hard links cannot be made (another file system, one that has
#: none, or a limit on links per file): the parts are then moved in unjoined.
_NO_LINKS = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}


def _join_group(target: str, root: str, manifests: list[Manifest], group: list[int],
                columns: Sequence[Column]) -> None:
    """One store per column in ``target``: the column's stores of parts ``group``, joined."""
    for i, col in enumerate(columns):
        sources = [os.path.join(root, f"{k:05d}", manifests[k].columns[i].store) for k in group]
        path = os.path.join(target, col.store)
        joined = Zrecord(path, codec=cast(Codec, col.codec))
        try:
            # Written before any record, as every converter does.
            _schema.write(path, _schema.read(sources[0]))
            parts = [Zrecord(src) for src in sources]
            try:
                joined._native.join_from([p._native for p in parts])
            finally:
                for part in parts:
                    part.close()
        finally:
            joined.close()
    staging.fsync_dir(target)
