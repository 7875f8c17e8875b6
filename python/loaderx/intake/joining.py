"""Parts into one dataset: :func:`assemble` joins complete parts, written one by one into
``<dst>.parts/00000 ...``, into the dataset directory ``dst`` (a directory of parts; see
:mod:`loaderx.intake.directory`), whose rows are the parts' rows in part order.

Who writes the parts does not matter here: the tasks of a cluster
(:func:`loaderx.intake.parts.write_part`, :func:`~loaderx.intake.parts.from_dask`), or a
conversion that can be resumed (``from_arrow(..., resume=True)``, which writes a part per run
of consecutive Parquet files, named after its first file's index, and joins the ones it names
with :func:`assemble_named`). Each part is a complete dataset directory of the same columns,
published in one atomic rename by :class:`~loaderx.intake.directory.DirectoryWriter`, so a part
is there whole or not at all.

:func:`assemble` checks that parts ``0 .. count-1`` are all there with the same columns,
then *joins* them: in a private staging directory beside ``dst`` it makes one store per column
whose records are the parts' records in part order -- the parts' chunk files hard-linked in
under new numbers and their record tables written once, moved (``Zrecord.join_from``,
``crates/zrecord/src/join.rs``), so no record is copied -- writes the manifest and publishes
``dst`` in one atomic rename, then removes the parts. ``dst`` is then an ordinary dataset
directory: a batch reads one store per column, at one store's speed, however many parts wrote
it. More rows than one store holds (2^24) are joined into groups of consecutive parts, a
directory of parts again but of fewer, larger ones; a part that holds more rows than that
itself (written as parts of its own, as any conversion past 2^24 rows is) counts as its parts,
in order. Parts that cannot be joined -- a column whose parts chose different codecs, or zstd
dictionaries of their own, or a file system without hard links -- are moved in as they are
(renames: nothing is copied), a directory of parts; ``join=False`` asks for that. Parts on
another file system than ``dst`` (``<dst>.parts`` a mount point, or a link to a directory
elsewhere), which neither a link nor a rename can reach, are copied beside ``dst`` first (holes
kept, every file synced) and then joined, or moved in, from the copies. A part left over from
an earlier attempt with more parts (index ``count`` or above) is refused, naming it, rather
than dropped or joined in silence. If publishing fails, moved parts are moved back (joined and
copied ones were never touched), so assembling can be tried again; the parts are removed only
once ``dst`` is published. A link or a mount point at ``<dst>.parts`` is left, empty.

A resumable conversion holds ``<dst>.parts`` for as long as it runs (:func:`hold_parts`: an
``flock`` on ``<dst>.parts/.loaderx-resume.lock``, which names its holder): a second run into the
same ``dst`` meanwhile is refused (StoreBusyError naming the first), instead of judging, writing
or removing parts the first is using. Holding them, it first removes what dead runs left beside
``dst`` (:func:`loaderx.staging.remove_stale`): the staging of a join that a kill cut short holds
links to the parts' chunk files, which would otherwise make every finished part look joined
into a published dataset (:func:`shares_chunks`) and be converted again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import socket
import stat
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from loaderx import _native
from loaderx._store import schema as _schema
from loaderx._store import staging
from loaderx._store.sparse import copy_files
from loaderx._views.concat import check_class_maps
from loaderx.errors import DatasetError, LimitExceededError, LoaderxValueError, StoreBusyError
from loaderx.intake.directory import (
    MANIFEST_FILE,
    MAX_PARTS,
    NO_LINKS,
    PARTS_DIR,
    Column,
    Manifest,
    Part,
    chunks_of,
    claim_destination,
    manifest_and_bytes,
    part_columns,
    part_directory,
    put_in_place,
    read_manifest,
    release_stores,
    store_groups,
    storeless,
)
from loaderx.zrecord import MAX_CHUNKS, MAX_RECORDS, Codec, Zrecord, chunk_number

__all__ = ["assemble", "assemble_named", "parts_dir", "part_path", "discard_parts",
           "shares_chunks", "hold_parts"]

_PART_NAME = re.compile(r"[0-9]{5}\Z")
#: The file a resumable conversion locks in ``<dst>.parts`` (:func:`hold_parts`). Not a part's
#: name, nor a staging name (:mod:`loaderx.staging` removes only those).
LOCK_FILE = ".loaderx-resume.lock"

# A part, or a part of a part, as joined or moved in: its directory and its manifest.
_Unit = tuple[str, Manifest]


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
    return assemble_named(dst, [f"{k:05d}" for k in range(count)], overwrite=overwrite,
                          extra=extra, join=join)


def assemble_named(dst: str | os.PathLike[str], names: Sequence[str], *,
                   overwrite: bool = False, extra: dict[str, Any] | None = None,
                   join: bool = True) -> int:
    """:func:`assemble` of the parts ``names`` of ``<dst>.parts``, in that order (each a
    part's name there, as :func:`part_path` makes them), whatever else that directory holds:
    a resumable ``from_arrow`` names each part after the index of its first file, and leaves
    the parts it does not use (left by earlier runs) for :func:`discard_parts`."""
    dst = os.path.abspath(os.fspath(dst))
    root = parts_dir(dst)
    if not names or any(not _PART_NAME.match(n) for n in names) or len(set(names)) < len(names):
        raise LoaderxValueError(f"names must be distinct part names (5 digits), got {names!r}")
    manifests = [read_manifest(os.path.join(root, n)) for n in names]
    first = manifests[0]
    shape = [(c.name, c.kind, c.dtype, c.item_shape) for c in first.columns]
    for name, m in zip(names, manifests, strict=True):
        if [(c.name, c.kind, c.dtype, c.item_shape) for c in m.columns] != shape:
            raise DatasetError(f"part {name} of {dst} has other columns than part {names[0]} "
                               f"({[c.name for c in m.columns]} against {[s[0] for s in shape]}"
                               "); every task must write the same columns")
    for i in range(len(shape)):  # one label, one class name, in every part
        check_class_maps([(f"part {n} of {dst}", m.columns[i].extra.get("classes"))
                          for n, m in zip(names, manifests, strict=True)], "the assembled dataset")
    units = _units(root, names, manifests)
    staging.remove_stale(dst)
    # As every converter: only a dataset or store is replaced, under its stores' writer locks
    # (so its readers learn of the replacement); anything else at dst is refused.
    old = claim_destination(dst, overwrite)
    try:
        return _assemble(dst, units, {**first.extra, **(extra or {})}, join, old)
    finally:
        release_stores(old)


def _units(root: str, names: Sequence[str], manifests: list[Manifest]) -> list[_Unit]:
    """What is joined or moved in, in row order: each part, or, for a part of more rows than
    one store holds (a directory of parts itself), its parts in order -- each checked as
    :func:`~loaderx.intake.directory.open_dataset` checks it."""
    units: list[_Unit] = []
    for name, m in zip(names, manifests, strict=True):
        part = os.path.join(root, name)
        if not m.parts:
            units.append((part, m))
            continue
        for p in m.parts:
            part_columns(part, p, m.columns)  # its rows, no parts of its own, the same columns
            sub = part_directory(part, p)
            units.append((sub, read_manifest(sub)))
    return units


def _assemble(dst: str, units: list[_Unit], extra_all: dict[str, Any], join: bool,
              old: list[Zrecord]) -> int:
    first = units[0][1]
    total = sum(m.rows for _, m in units)
    moved: list[tuple[str, str]] = []  # (part, where it is in the build), renamed
    with contextlib.ExitStack() as stack:
        build = stack.enter_context(staging.private_dir(dst, "assemble"))
        manifest = None
        if join:
            try:
                manifest = _joined(build, units, extra_all)
            except _OtherFileSystem:
                # No link reaches the parts from dst's file system: they are copied beside dst
                # (holes kept, synced) and joined from there. The copies go when this ends;
                # dst's stores keep the links to their chunk files.
                near = stack.enter_context(staging.private_dir(dst, "incoming"))
                units = [(_copy_part(path, m, os.path.join(near, f"{j:05d}")), m)
                         for j, (path, m) in enumerate(units)]
                staging.fsync_dir(near)
                manifest = _joined(build, units, extra_all)
        if manifest is None:
            if len(units) > MAX_PARTS:
                raise LimitExceededError(f"{len(units)} parts (counting the parts of parts) "
                                         f"to keep as they are, at most {MAX_PARTS}; join them "
                                         "(join=True), or write fewer, larger parts")
            manifest = Manifest(total, storeless(first.columns),
                                tuple(Part(f"{PARTS_DIR}/{j:05d}", m.rows)
                                      for j, (_, m) in enumerate(units)), extra_all)
            os.mkdir(os.path.join(build, PARTS_DIR))
            for j, (path, m) in enumerate(units):
                target = os.path.join(build, PARTS_DIR, f"{j:05d}")
                if _move_or_copy(path, m, target):
                    moved.append((path, target))
            staging.fsync_dir(os.path.join(build, PARTS_DIR))
            for parent in dict.fromkeys(os.path.dirname(path) for path, _ in moved):
                staging.fsync_dir(parent)
        _native.replace_file(build, MANIFEST_FILE, manifest.to_bytes())
        try:
            put_in_place(build, dst, old)
        except BaseException:
            # Put the parts back where their tasks wrote them: assembling can be tried again.
            for path, target in reversed(moved):
                with contextlib.suppress(OSError):
                    os.rename(target, path)
            raise
    # Joined: every part's records are in dst's stores (their chunk files are linked there, or
    # copied), so the parts go; moved: only the empty parts directory is left.
    discard_parts(dst)
    return manifest.rows


class _OtherFileSystem(Exception):
    """The parts are on another file system than the build (``link`` failed with EXDEV)."""


def _move_or_copy(path: str, manifest: Manifest, target: str) -> bool:
    """Moves the part ``path`` to ``target``; where no rename reaches (another file system),
    copies it (holes kept, synced), leaving it where it is. Returns whether it was moved."""
    try:
        os.rename(path, target)
        return True
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
    _copy_part(path, manifest, target)
    return False


def _copy_part(path: str, manifest: Manifest, target: str) -> str:
    """Copies the part ``path`` (a dataset directory of stores, whose manifest is ``manifest``)
    into the new directory ``target``: every store's files with their holes kept
    (:func:`loaderx._store.sparse.copy_files`), each synced, then the manifest as it was read.
    Returns ``target``."""
    os.mkdir(target)
    for col in manifest.columns:
        store = os.path.join(target, col.store)
        os.mkdir(store)
        copy_files(os.path.join(path, col.store), store)
    _native.replace_file(target, MANIFEST_FILE, manifest_and_bytes(path)[1])
    staging.fsync_dir(target)
    return target


def discard_parts(dst: str | os.PathLike[str]) -> None:
    """Removes ``<dst>.parts``: the parts in it, the staging left by tasks killed while they
    wrote one, and the directory. For once ``dst`` holds everything they held (or after a kill
    between publishing ``dst`` and this step, when the finished conversion runs again). The
    directory stays while a resumable conversion holds it (its lock file, see
    :func:`hold_parts`), and when it is a link or a mount point."""
    root = parts_dir(dst)
    with contextlib.suppress(OSError):
        staging.remove_stale(root)
        for name in os.listdir(root):
            if _PART_NAME.match(name):
                shutil.rmtree(os.path.join(root, name))
        if not os.listdir(root):
            os.rmdir(root)


@contextlib.contextmanager
def hold_parts(dst: str | os.PathLike[str]) -> Iterator[Callable[[], None]]:
    """Holds ``<dst>.parts`` (made if missing) for one resumable conversion into ``dst``: an
    ``flock`` on its :data:`LOCK_FILE`, which says who holds it; a second holder meanwhile is
    refused at once (StoreBusyError naming the first). Holding it, removes what dead runs left
    beside ``dst`` (:func:`loaderx.staging.remove_stale`: their staging, a replacement to
    finish), before any part is judged. Yields a function that makes ``<dst>.parts`` itself
    durable (synced into its parent; once): call it before publishing a part, whose own
    publication syncs only ``<dst>.parts``. On exit the lock file goes with the directory when
    nothing else is left in it (the parts were joined); otherwise it stays with the parts.
    That removal is not synced: undone by a power cut, it leaves an empty ``<dst>.parts``
    that the next run removes."""
    dst = os.path.abspath(os.fspath(dst))
    root = parts_dir(dst)
    fd = _lock_parts(root, dst)
    synced: list[bool] = []

    def durable() -> None:
        if not synced:
            staging.fsync_dir(os.path.dirname(root))
            synced.append(True)

    try:
        staging.remove_stale(dst)
        yield durable
    finally:
        try:
            lock = os.path.join(root, LOCK_FILE)
            if staging.same_file(fd, lock) and os.listdir(root) == [LOCK_FILE]:
                os.unlink(lock)  # still held: whoever opens it now locks another file
                with contextlib.suppress(OSError):  # a link or a mount point stays
                    os.rmdir(root)
        finally:
            os.close(fd)


def _lock_parts(root: str, dst: str) -> int:
    """An fd of ``root``'s lock file holding ``flock(LOCK_EX)`` (see :func:`hold_parts`)."""
    lock = os.path.join(root, LOCK_FILE)
    for _ in range(100):
        os.makedirs(root, exist_ok=True)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                         | os.O_NONBLOCK, 0o644)
        except FileNotFoundError:
            continue  # the directory was removed meanwhile by a run that finished: again
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise DatasetError(f"{lock} is not a regular file; remove it, it is not "
                                   "loaderx's")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "starting"
                raise StoreBusyError(
                    f"{dst} is being converted by another resumable run ({holder}), which "
                    f"holds {root}; wait for it to end, then run this again: it returns the "
                    "finished row count, or resumes from the parts that run left") from None
            if staging.same_file(fd, lock):
                line = f"process {os.getpid()} on {socket.gethostname()}\n".encode()
                os.pwrite(fd, line, 0)
                # Cut to the new line only when an earlier holder's was longer: a truncation
                # to zero bytes (ext4's auto_da_alloc) makes the final close flush the file,
                # milliseconds a run.
                if os.fstat(fd).st_size > len(line):
                    os.ftruncate(fd, len(line))
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # unlinked by a run that finished, between our open and our lock: again
    raise StoreBusyError(f"could not hold {root}: its lock file was replaced 100 times in a "
                         "row (is something removing files there?)")


def shares_chunks(part: str) -> bool:
    """Whether a chunk file of part ``part`` (or of its own parts) has another name too: a part
    joined into a published dataset that a kill kept from being removed. Its bytes are that
    dataset's now (compacting it rewrites them in place), so it is never joined again."""
    for store in os.listdir(part):
        path = os.path.join(part, store)
        if not os.path.isdir(path) or os.path.islink(path):
            continue
        if store == PARTS_DIR:  # a part of more rows than one store holds
            if any(shares_chunks(os.path.join(path, sub)) for sub in os.listdir(path)
                   if _PART_NAME.match(sub)):
                return True
            continue
        for name in os.listdir(path):
            if chunk_number(name) is not None \
                    and os.lstat(os.path.join(path, name)).st_nlink > 1:
                return True
    return False


def _joined(build: str, units: list[_Unit], extra: dict[str, Any]) -> Manifest | None:
    """The parts joined into one store per column in ``build`` (groups of consecutive parts
    of at most 2^24 rows each, when they hold more), their chunk files linked, not copied; the
    manifest to publish. None when they cannot be joined -- a column whose parts chose other
    codecs, or a zstd dictionary each, or a file system without hard links -- and ``build``
    is then left empty for the parts to be moved in as they are. Raises _OtherFileSystem
    (``build`` left empty) when the parts are on another file system."""
    # The codec of the first part with rows (an empty part's choice stored nothing).
    first = next((m for _, m in units if m.rows), units[0][1])
    for i, col in enumerate(first.columns):
        codecs = {m.columns[i].codec for _, m in units if m.rows} or {col.codec}
        if codecs != {col.codec} or col.codec == "zstd_dict":
            return None
    # Consecutive parts per group, at most one store's records and chunks (a part brings the
    # chunks its stores' files are numbered up to).
    groups = store_groups(((m.rows, max((chunks_of(os.path.join(path, c.store))
                                         for c in m.columns), default=0))
                           for path, m in units), max_rows=MAX_RECORDS, max_chunks=MAX_CHUNKS)
    total = sum(m.rows for _, m in units)
    try:
        if len(groups) == 1:
            _join_group(build, units, groups[0], first.columns)
            return Manifest(total, first.columns, (), extra)
        os.mkdir(os.path.join(build, PARTS_DIR))
        parts = []
        for g, group in enumerate(groups):
            target = os.path.join(build, PARTS_DIR, f"{g:05d}")
            os.mkdir(target)
            _join_group(target, units, group, first.columns)
            group_rows = sum(units[k][1].rows for k in group)
            _native.replace_file(target, MANIFEST_FILE,
                                 Manifest(group_rows, first.columns, (), extra).to_bytes())
            parts.append(Part(f"{PARTS_DIR}/{g:05d}", group_rows))
        staging.fsync_dir(os.path.join(build, PARTS_DIR))
        return Manifest(total, storeless(first.columns), tuple(parts), extra)
    except OSError as e:
        # No links: the parts are copied near (EXDEV) and joined, or moved in unjoined.
        if e.errno not in NO_LINKS:
            raise
        for name in os.listdir(build):
            shutil.rmtree(os.path.join(build, name))
        if e.errno == errno.EXDEV:
            raise _OtherFileSystem from e
        return None


def _join_group(target: str, units: list[_Unit], group: list[int],
                columns: Sequence[Column]) -> None:
    """One store per column in ``target``: the column's stores of parts ``group``, joined."""
    for i, col in enumerate(columns):
        sources = [os.path.join(units[k][0], units[k][1].columns[i].store) for k in group]
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
