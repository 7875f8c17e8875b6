"""Image folders and WebDataset shards into dataset directories, and back out again.

:func:`from_image_folder` converts a folder of one sub-folder per class
(``root/<class>/<name>.jpg``) and :func:`from_webdataset` a list of WebDataset tar shards into
the dataset directory of :mod:`loaderx.intake.directory`, which
:func:`~loaderx.intake.directory.open_dataset` opens as ``{column: dataset}``. Both keep every
file's bytes exactly as they were -- images stay encoded, to be decoded in the loader's
transform -- so :func:`export_image_folder` and :func:`export_webdataset` give the same files
back.

An image folder gives the columns ``image`` (ragged ``uint8``: each file's bytes), ``label``
(dense ``int64``: the class's position among the class folders sorted by name; the names are
the column's ``classes`` in the manifest, with ``counts``, images per class) and ``path``
(ragged ``uint8``: the file's path below ``root``, ``/``-separated, as the file system's bytes
-- ``os.fsdecode`` gives the ``str``). Rows come class by class, each class's files in sorted
order (see :mod:`loaderx.intake._image_folder` for the walk and what it skips or refuses).

WebDataset shards give one column per extension (ragged ``uint8``, the member's bytes), named
by the extension lower-cased as WebDataset does (``jpg``, ``cls``, ``seg.png``), plus
``__key__`` (the sample's key, a string column) and ``__shard__`` (dense ``int64``: which
shard, by position in the list, the sample came from; the manifest's ``shards`` names them).
Rows come shard by shard in the order given, each shard's samples in the order they are
stored. Every sample must have the same extensions: a sample that lacks one or has another is
refused, naming it, unless ``extensions=`` lists the ones to keep (others are skipped and
counted) and ``missing="empty"`` allows a sample to lack some (an empty record, and a
``False`` in the dense boolean column ``__present__``, one flag per extension in column
order). ``label="cls"`` also writes the ASCII integers of that extension as a dense ``int64``
column ``label`` (the bytes stay in their own column). See :mod:`loaderx.intake._shard_reader`
for how shards are read and what they may not hold.

Files are read by a pool of threads (``workers``; reading a file is system calls, which
release the GIL; a compressed shard's decompression releases it too), in a bounded window:
at most 32 files per thread are in flight (an image folder), or two batches of 4 MiB per
shard being read (shards), plus one batch of 16 MiB being written, whatever the input's size.
Writing is one transaction (see :class:`~loaderx.intake.directory.DirectoryWriter`): a failure
or a kill leaves ``dst`` as it was, and running the conversion again gives exactly the result
an uninterrupted run gives.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import os
import queue
import tarfile
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

import numpy as np

from loaderx._store import staging
from loaderx.converter import _progress
from loaderx.errors import CorruptStoreError, DatasetError, LoaderxTypeError, LoaderxValueError
from loaderx.intake._image_folder import Folder, FolderReport, ImageDir, read_image
from loaderx.intake._shard_names import shard_paths
from loaderx.intake._shard_reader import Sample, ShardReport, read_shard
from loaderx.intake.directory import DirectoryWriter, RaggedBatch, open_dataset, read_manifest
from loaderx.intake.growing import image_folder_onto, webdataset_onto
from loaderx.zrecord import Codec

__all__ = ["SkippedFilesWarning", "export_image_folder", "export_webdataset",
           "from_image_folder", "from_webdataset"]

#: Bytes of records gathered before one append to the dataset directory.
_BATCH_BYTES = 16 << 20
#: Rows gathered before one append, whatever their size.
_BATCH_ROWS = 4096
#: Bytes of samples a shard reader hands over at a time.
_SHARD_BATCH_BYTES = 4 << 20
#: Batches a shard reader may hold ready before it waits for the writer.
_SHARD_QUEUE = 2


class SkippedFilesWarning(UserWarning):
    """A conversion skipped files (symbolic links, files that are not images, WebDataset
    members without an extension, ...); the report it returns lists them, and ``strict=True``
    refuses them instead."""


def _workers(workers: Any) -> int:
    if workers is None:
        return min(16, 2 * (os.cpu_count() or 1))
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise LoaderxValueError(f"workers must be a positive int, got {workers!r}")
    return workers


# -- image folders -------------------------------------------------------------------------------


def from_image_folder(
    dst: str | os.PathLike[str],
    root: str | os.PathLike[str],
    *,
    codec: Codec = "raw",
    overwrite: bool = False,
    strict: bool = False,
    workers: int | None = None,
    progress: bool | None = None,
    checksums: bool = False,
    append: bool = False,
) -> dict[str, Any]:
    """Converts the image folder ``root`` (one sub-folder per class) into the dataset
    directory ``dst`` with the columns ``image``, ``label`` and ``path`` (see the module
    docstring); returns a report: ``rows``, ``classes``, ``counts`` (images per class),
    ``empty_classes``, ``bytes`` (of images), ``skipped`` (count per reason) and
    ``skipped_examples`` (the first few paths per reason).

    ``codec`` is the image column's (``"raw"``: JPEG and PNG bytes do not compress further).
    Skipped files are reported and warned about (:class:`SkippedFilesWarning`); with
    ``strict=True`` the first one is refused instead (DatasetError naming it). ``overwrite``,
    ``checksums`` and ``progress`` are as in :func:`loaderx.from_numpy`; ``workers`` threads
    read the files (default ``min(16, 2 * cores)``).

    ``append=True`` adds the images to the image-folder dataset already at ``dst``, every
    column at once and all or nothing (:mod:`loaderx.intake.growing`): classes it has keep
    their numbers, new ones are numbered after them (in sorted order), and the report's
    ``rows``, ``classes`` and ``counts`` are the dataset's afterwards (``appended``: the rows
    added, ``new_classes``: the classes added); a ``dst`` that holds nothing is converted
    into as without it."""
    if append:
        def folder_into(path: str, **given: Any) -> dict[str, Any]:
            return from_image_folder(path, root, strict=strict, workers=workers,
                                     progress=progress, **given)

        return image_folder_onto(dst, root, folder_into, codec=codec, overwrite=overwrite,
                                 checksums=checksums)
    root = os.fspath(root)
    n_workers = _workers(workers)
    inside = os.path.realpath(os.fspath(dst))
    if (inside + os.sep).startswith(os.path.realpath(root) + os.sep):
        raise DatasetError(f"{os.fspath(dst)} is inside the image folder {root}: the dataset "
                           "would be walked as a class of itself; write it elsewhere")
    with Folder(root, strict=bool(strict)) as folder:
        classes = folder.classes
        counts = [0] * len(classes)
        total_bytes = 0
        with DirectoryWriter(dst, overwrite=overwrite, codec=codec, checksums=checksums,
                             extra={"source": "image_folder"}, group_columns=True) as w:
            w.add_column("image", "ragged", np.uint8, extra={"encoded": "image"})
            w.add_column("label", "dense", np.int64, extra={"classes": classes})
            w.add_column("path", "ragged", np.uint8, codec="zstd",
                         extra={"path": "file system bytes, relative to the root"})
            with _progress(progress, None, os.fspath(dst)) as bar:
                for images, labels, paths in _image_batches(folder, n_workers):
                    w.append({"image": _ragged(images),
                              "label": np.asarray(labels, dtype=np.int64),
                              "path": _ragged(paths)})
                    for label in labels:
                        counts[label] += 1
                    total_bytes += sum(len(b) for b in images)
                    bar.update(len(labels))
            if not sum(counts):
                skipped = folder.report.describe()
                raise DatasetError(f"{root} holds no images in its {len(classes)} class "
                                   f"folder(s){'; skipped: ' + skipped if skipped else ''}")
            w.set_extra("label", {"classes": classes, "counts": counts})
            w.extra["skipped"] = dict(folder.report.counts)
        report = folder.report
    _warn_skipped(root, report.skipped, report.describe(), "strict=True refuses them")
    return {"rows": sum(counts), "classes": classes, "counts": counts,
            "empty_classes": [c for c, n in zip(classes, counts, strict=True) if n == 0],
            "bytes": total_bytes, "skipped": dict(report.counts),
            "skipped_examples": {k: list(v) for k, v in report.examples.items()}}


def _ragged(records: list[bytes]) -> RaggedBatch:
    """Byte records as one buffer and their bounds (one copy, no object per record)."""
    bounds = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, records), dtype=np.int64, count=len(records)),
              out=bounds[1:])
    return RaggedBatch(np.frombuffer(b"".join(records), dtype=np.uint8), bounds)


def _warn_skipped(source: str, count: int, what: str, hint: str) -> None:
    if count:
        warnings.warn(f"{source}: skipped {count} entries: {what} ({hint})",
                      SkippedFilesWarning, stacklevel=3)


def _image_batches(folder: Folder,
                   n_workers: int) -> Iterator[tuple[list[bytes], list[int], list[bytes]]]:
    """The folder's images in order, read by ``n_workers`` threads, as batches of (bytes,
    labels, relative paths). Each task reads a run of one folder's files (one hand-over
    between threads per run, not per file); at most a few runs per thread are in flight."""
    window: collections.deque[_Read] = collections.deque()
    opened: list[ImageDir] = []
    dirs = folder.dirs()
    batch = _ImageBatch()
    limit = 2 * n_workers  # runs in flight: 32 files per thread at most
    with cf.ThreadPoolExecutor(n_workers, thread_name_prefix="loaderx-images") as pool:
        try:
            for d in dirs:
                opened.append(d)
                for at in range(0, len(d.names), _RUN_FILES):
                    names = d.names[at:at + _RUN_FILES]
                    future = pool.submit(_read_run, folder, d, names)
                    window.append((future, d, names, at + _RUN_FILES >= len(d.names)))
                    if len(window) < limit:
                        continue
                    while len(window) > limit // 2:
                        batch.take(window.popleft(), folder.report, opened)
                    if batch.full():
                        yield batch.images, batch.labels, batch.paths
                        batch = _ImageBatch()
            while window:
                batch.take(window.popleft(), folder.report, opened)
                if batch.full() or not window:
                    if batch.labels:
                        yield batch.images, batch.labels, batch.paths
                    batch = _ImageBatch()
        finally:
            for future, *_ in window:
                future.cancel()
            pool.shutdown(wait=True)
            dirs.close()  # closes the walk's own descriptors
            for d in opened:
                with contextlib.suppress(OSError):
                    d.close()


#: Files of one folder read by one task.
_RUN_FILES = 16
# A run being read, its folder, its file names, and whether it is the folder's last.
_Read = tuple["cf.Future[list[bytes | str]]", ImageDir, list[str], bool]


def _read_run(folder: Folder, d: ImageDir, names: list[str]) -> list[bytes | str]:
    return [read_image(folder, d, name) for name in names]


class _ImageBatch:
    """Images gathered for one append."""

    def __init__(self) -> None:
        self.images: list[bytes] = []
        self.labels: list[int] = []
        self.paths: list[bytes] = []
        self.held = 0

    def full(self) -> bool:
        return self.held >= _BATCH_BYTES or len(self.labels) >= _BATCH_ROWS

    def take(self, read: _Read, report: FolderReport, opened: list[ImageDir]) -> None:
        """Adds a finished run of reads (images, or files to skip) to the batch."""
        future, d, names, last = read
        results = future.result()
        if last:  # the folder's last run: its descriptor is no longer needed
            opened.remove(d)
            d.close()
        for name, result in zip(names, results, strict=True):
            rel = d.rel + os.fsencode(name)
            if isinstance(result, str):
                report.skip(result, rel)
                continue
            self.images.append(result)
            self.labels.append(d.label)
            self.paths.append(rel)
            self.held += len(result)


def export_image_folder(src: str | os.PathLike[str], out_root: str | os.PathLike[str]) -> int:
    """Writes the images of the dataset directory ``src`` (made by :func:`from_image_folder`)
    back as files, each at its ``path`` below the new folder ``out_root``, with every class
    folder (empty ones too); returns the number of files. The bytes and names are those that
    were converted (file modes and times are not kept). ``out_root`` appears complete or not
    at all."""
    src, out_root = os.fspath(src), os.fspath(out_root)
    manifest = read_manifest(src)
    if manifest.extra.get("source") != "image_folder":
        raise DatasetError(f"{src} was not made by from_image_folder (no image folder "
                           "manifest); export_image_folder writes back those only")
    classes = manifest.column("label").extra.get("classes")
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise CorruptStoreError(f"{src}: the manifest's class names are damaged")
    if os.path.lexists(out_root):
        raise DatasetError(f"{out_root} exists; export_image_folder writes a new folder")
    staging.remove_stale(out_root)
    cols = open_dataset(src, columns=["image", "path"])
    try:
        with staging.private_dir(out_root, "exporting") as tmp:
            for name in classes:
                _check_relative(os.fsencode(name), src)
                os.mkdir(os.path.join(tmp, name))
            n = len(cols["path"])
            step = 1024
            made: set[bytes] = set()
            for start in range(0, n, step):
                idx = np.arange(start, min(n, start + step))
                rels = cols["path"][idx]
                blobs = cols["image"][idx]
                for rel, blob in zip(rels, blobs, strict=True):
                    _write_new(tmp, _check_relative(bytes(rel), src), blob, made)
            _sync_tree(tmp)
            staging.publish(tmp, out_root)
    finally:
        for ds in cols.values():
            ds.close()
    return n


def _check_relative(rel: bytes, src: str) -> list[bytes]:
    """The components of a stored relative path, each a plain name: a path that could lead
    outside the folder (absolute, ``..``, ``.``, empty, NUL) is refused."""
    parts = rel.split(b"/")
    if not rel or any(p in (b"", b".", b"..") or b"\x00" in p for p in parts):
        raise CorruptStoreError(f"{src}: the stored path {rel!r} is not a plain relative path; "
                                "the dataset was altered, nothing is written for it")
    return parts


def _write_new(root: str, parts: list[bytes], data: Any, made: set[bytes]) -> None:
    """Writes ``data`` to the new file ``root/<parts>``, making its folders."""
    folder = os.fsencode(root)
    for p in parts[:-1]:
        folder = os.path.join(folder, p)
        if folder not in made:
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder)
            made.add(folder)
    path = os.path.join(folder, parts[-1])
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    except FileExistsError:
        raise CorruptStoreError(f"the path {b'/'.join(parts)!r} is stored twice; the dataset "
                                "was altered") from None
    try:
        view = memoryview(np.ascontiguousarray(data).tobytes())
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _sync_tree(root: str) -> None:
    """Syncs every file and folder below ``root`` (before it is published)."""
    for here, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(here, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        staging.fsync_dir(here)


# -- WebDataset ----------------------------------------------------------------------------------

KEY, SHARD, PRESENT, LABEL = "__key__", "__shard__", "__present__", "label"
Missing = Literal["refuse", "empty"]


def from_webdataset(
    dst: str | os.PathLike[str],
    shards: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    extensions: Sequence[str] | None = None,
    missing: Missing = "refuse",
    label: str | None = None,
    codec: Codec = "raw",
    overwrite: bool = False,
    workers: int | None = None,
    progress: bool | None = None,
    checksums: bool = False,
    append: bool = False,
) -> dict[str, Any]:
    """Converts WebDataset tar shards (a path, a glob, brace notation such as
    ``"shards-{000..099}.tar"``, or a list of them; ``.tar``, ``.tar.gz``, ``.tar.xz``,
    ``.tar.bz2``) into the dataset directory ``dst``: one column per extension plus
    ``__key__`` and ``__shard__`` (see the module docstring). Returns a report: ``rows``,
    ``shards`` (the paths, in order), ``columns``, ``members``, ``bytes`` and ``skipped``
    (count per reason, with ``skipped_examples``).

    ``extensions`` keeps only those (lower-case) extensions, in that order; by default the
    first sample's, in its order. ``missing="empty"`` lets a sample lack some of them (see
    the module docstring). ``label`` names an extension holding ASCII integers (WebDataset's
    ``cls``) to write also as the dense ``int64`` column ``label``. ``workers`` shards are
    read at a time (default ``min(16, 2 * cores)``); ``codec``, ``overwrite``,
    ``checksums`` and ``progress`` are as in :func:`from_image_folder`. ``append=True`` adds
    the samples to the WebDataset dataset already at ``dst`` (its shard list and
    ``__shard__`` numbers continue; see :mod:`loaderx.intake.growing`); the report's ``rows``
    is then the dataset's, ``appended`` the rows added."""
    if append:
        def into(path: str, **given: Any) -> dict[str, Any]:
            return from_webdataset(path, shards, extensions=extensions, missing=missing,
                                   label=label, workers=workers, progress=progress, **given)

        return webdataset_onto(dst, into, codec=codec, overwrite=overwrite,
                               checksums=checksums)
    paths = shard_paths(shards)
    n_workers = _workers(workers)
    if missing not in ("refuse", "empty"):
        raise LoaderxValueError(f"missing must be 'refuse' or 'empty', got {missing!r}")
    wanted = _wanted_extensions(extensions, label)
    plan = _SamplePlan(wanted, missing == "empty", label)
    reports = [ShardReport() for _ in paths]
    shard_names = [os.path.abspath(p) for p in paths]
    writer: DirectoryWriter | None = None
    try:
        with _progress(progress, None, os.fspath(dst)) as bar:
            for index, samples in _shard_batches(paths, n_workers, reports):
                if writer is None:
                    plan.start(samples[0], paths[index])
                    writer = DirectoryWriter(dst, overwrite=overwrite, codec=codec,
                                             checksums=checksums, group_columns=True,
                                             extra={"source": "webdataset",
                                                    "shards": shard_names})
                    plan.declare(writer)
                writer.append(plan.batch(samples, index, paths[index]))
                bar.update(len(samples))
        if writer is None:
            skipped = _skipped_counts(reports, plan)
            raise DatasetError(f"the shards hold no samples ({len(paths)} shard(s), e.g. "
                               f"{paths[0]}); nothing to convert"
                               + (f"; skipped {_describe_skipped(skipped, {})}"
                                  if sum(skipped.values()) else ""))
        plan.finish(writer)
        writer.extra["skipped"] = _skipped_counts(reports, plan)
        rows = writer.commit()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    skipped = _skipped_counts(reports, plan)
    examples = {"meta": [n for r in reports for n in r.skipped_meta][:5],
                "no_extension": [n for r in reports for n in r.skipped_no_extension][:5],
                "not_selected": plan.unselected_examples}
    _warn_skipped(paths[0] if len(paths) == 1 else f"{len(paths)} shards",
                  sum(skipped.values()), _describe_skipped(skipped, examples),
                  "the report lists them")
    return {"rows": rows, "shards": paths, "columns": [c.name for c in writer.columns],
            "members": sum(r.members for r in reports), "bytes": sum(r.bytes for r in reports),
            "skipped": skipped, "skipped_examples": {k: v for k, v in examples.items() if v}}


_SKIP_WORDS = {"meta": "WebDataset metadata members (__...__)",
               "no_extension": "members without an extension",
               "not_selected": "members of extensions not in extensions="}


def _describe_skipped(skipped: dict[str, int], examples: dict[str, list[str]]) -> str:
    return "; ".join(f"{n} {_SKIP_WORDS[k]}" + (f", e.g. {examples[k]!r}" if examples.get(k)
                                                else "")
                     for k, n in skipped.items() if n)


def _wanted_extensions(extensions: Sequence[str] | None, label: str | None) -> list[str] | None:
    if label is not None and not isinstance(label, str):
        raise LoaderxTypeError(f"label must be an extension name (e.g. 'cls'), got {label!r}")
    if extensions is None:
        return None
    if isinstance(extensions, str):
        raise LoaderxTypeError(f"extensions must be a list, got the string {extensions!r} "
                               f"(write extensions=[{extensions!r}])")
    wanted = list(extensions)
    if not all(isinstance(e, str) for e in wanted) or not wanted:
        raise LoaderxTypeError("extensions must be a non-empty list of extension names")
    lowered = [e.lower() for e in wanted]
    if len(set(lowered)) != len(lowered):
        raise LoaderxValueError(f"extensions names one twice: {wanted!r}")
    if label is not None and label.lower() not in lowered:
        raise LoaderxValueError(f"label={label!r} is not among extensions={wanted!r}")
    return lowered


def _skipped_counts(reports: list[ShardReport], plan: _SamplePlan) -> dict[str, int]:
    return {"meta": sum(r.skipped_meta_count for r in reports),
            "no_extension": sum(r.skipped_no_extension_count for r in reports),
            "not_selected": plan.unselected}


class _SamplePlan:
    """Turns samples into rows of the columns, checking that every sample fits them."""

    def __init__(self, wanted: list[str] | None, allow_missing: bool, label: str | None) -> None:
        self.wanted = wanted
        self.allow_missing = allow_missing
        self.label = label.lower() if label is not None else None
        self.exts: list[str] = []
        self.spelled: dict[str, str] = {}  # extension -> as written in the shards
        self.unselected = 0
        self.unselected_examples: list[str] = []

    def start(self, first: Sample, shard: str) -> None:
        self.exts = list(self.wanted) if self.wanted is not None else list(first.members)
        for name in (KEY, SHARD, PRESENT, LABEL):
            if name in self.exts and not (name == LABEL and self.label is None):
                raise DatasetError(f"{shard}: the extension {name!r} has the name of a column "
                                   "the conversion adds; pass extensions= without it")
        if self.label is not None and self.label not in self.exts:
            raise DatasetError(f"{shard}: label={self.label!r} is not an extension of the "
                               f"samples (they have {self.exts!r})")

    def declare(self, w: DirectoryWriter) -> None:
        w.add_column(KEY, "ragged", np.uint8, codec="zstd", extra={"string": True})
        for ext in self.exts:
            w.add_column(ext, "ragged", np.uint8, extra={"extension": ext})
        w.add_column(SHARD, "dense", np.int64)
        if self.label is not None:
            w.add_column(LABEL, "dense", np.int64, extra={"from_extension": self.label})
        if self.allow_missing:
            w.add_column(PRESENT, "dense", np.bool_, (len(self.exts),),
                         extra={"extensions": self.exts})

    def batch(self, samples: list[Sample], index: int, shard: str) -> dict[str, Any]:
        exts = self.exts
        cols: dict[str, list[bytes]] = {ext: [] for ext in exts}
        keys: list[bytes] = []
        present = np.ones((len(samples), len(exts)), dtype=np.bool_)
        labels = np.zeros(len(samples), dtype=np.int64)
        for row, s in enumerate(samples):
            have = s.members
            if len(have) != len(exts) or any(e not in have for e in exts):
                self._misfit(s, shard, present[row])
            for j, ext in enumerate(exts):
                cols[ext].append(have.get(ext, b""))
                written = s.spelled.get(ext, ext)
                if ext in have and self.spelled.setdefault(ext, written) != written:
                    raise DatasetError(f"{shard}: sample {s.key!r} spells the extension "
                                       f"{ext!r} as {written!r}, earlier samples as "
                                       f"{self.spelled[ext]!r}; a round trip could not give "
                                       "both names back -- rename the members to one spelling")
                present[row, j] = ext in have
            keys.append(s.key.encode("utf-8"))
            if self.label is not None:
                labels[row] = _parse_label(have.get(self.label), s.key, self.label, shard)
        batch: dict[str, Any] = {KEY: _ragged(keys),
                                 SHARD: np.full(len(samples), index, np.int64)}
        batch.update({ext: _ragged(values) for ext, values in cols.items()})
        if self.label is not None:
            batch[LABEL] = labels
        if self.allow_missing:
            batch[PRESENT] = present
        return batch

    def _misfit(self, s: Sample, shard: str, present_row: np.ndarray) -> None:
        lacks = [e for e in self.exts if e not in s.members]
        extra = [e for e in s.members if e not in self.exts]
        if extra and self.wanted is None:
            raise DatasetError(
                f"{shard}: sample {s.key!r} has the extension(s) {extra!r}, which the first "
                f"sample lacks (it has {self.exts!r}); pass extensions=[...] naming the ones "
                "to keep (and missing='empty' if some samples lack some)")
        if extra:
            self.unselected += len(extra)
            for e in extra:
                if len(self.unselected_examples) < 5:
                    self.unselected_examples.append(f"{s.key}.{s.spelled.get(e, e)}")
        if lacks and (not self.allow_missing or (self.label is not None and self.label in lacks)):
            why = ("" if self.allow_missing else "; pass missing='empty' to store an empty "
                   "record and a False in the __present__ column instead")
            raise DatasetError(f"{shard}: sample {s.key!r} lacks the extension(s) {lacks!r} "
                               f"(it has {list(s.members)!r}){why}")

    def finish(self, w: DirectoryWriter) -> None:
        for ext in self.exts:
            spelled = self.spelled.get(ext, ext)
            w.set_extra(ext, {"extension": spelled})


def _parse_label(raw: bytes | None, key: str, ext: str, shard: str) -> int:
    raw = raw or b""
    text = raw.strip()
    digits = text[1:] if text[:1] in (b"-", b"+") else text
    if not digits or not digits.isdigit() or len(digits) > 18:
        raise DatasetError(f"{shard}: sample {key!r}: its {ext!r} member "
                           f"{raw[:40]!r} is not an ASCII integer, so it cannot be a label; "
                           "convert without label=")
    return int(text)


def _shard_batches(paths: list[str], n_workers: int,
                   reports: list[ShardReport]) -> Iterator[tuple[int, list[Sample]]]:
    """``(shard index, samples)`` in shard order, then sample order, the shards read by
    ``n_workers`` threads ahead of the consumer (each holding at most a few batches)."""
    stop = threading.Event()
    queues: dict[int, queue.Queue[Any]] = {}
    done = object()

    def read(i: int) -> None:
        q = queues[i]

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for batch in read_shard(paths[i], _SHARD_BATCH_BYTES, reports[i]):
                if not put(batch):
                    return
            put(done)
        except BaseException as e:  # handed to the consumer, raised at this shard's turn
            put(e)

    with cf.ThreadPoolExecutor(n_workers, thread_name_prefix="loaderx-shards") as pool:
        try:
            started = 0

            def start_more(upto: int) -> None:
                nonlocal started
                while started < min(upto, len(paths)):
                    queues[started] = queue.Queue(_SHARD_QUEUE)
                    pool.submit(read, started)
                    started += 1

            for i in range(len(paths)):
                start_more(i + n_workers)
                q = queues[i]
                while True:
                    item = q.get()
                    if item is done:
                        break
                    if isinstance(item, BaseException):
                        raise item
                    if item:
                        yield i, item
                del queues[i]
        finally:
            stop.set()


def export_webdataset(src: str | os.PathLike[str], out_pattern: str) -> list[str]:
    """Writes the samples of the dataset directory ``src`` (made by :func:`from_webdataset`)
    back as WebDataset tar shards: the samples of shard ``i`` go to ``out_pattern % i``
    (e.g. ``"out/shard-%06d.tar"``; ``.tar.gz``, ``.tar.xz``, ``.tar.bz2`` compress), in
    order, each member named ``<key>.<extension>`` as it was in the source, with the same
    bytes (a sample's members in column order; modes, owners and times are not kept).
    Returns the paths written; each appears complete or not at all, and none may exist."""
    src = os.fspath(src)
    manifest = read_manifest(src)
    if manifest.extra.get("source") != "webdataset":
        raise DatasetError(f"{src} was not made by from_webdataset; export_webdataset writes "
                           "back those only")
    if not isinstance(out_pattern, str) or "%" not in out_pattern:
        raise LoaderxValueError(f"out_pattern must hold a %-format for the shard index, e.g. "
                                f"'shard-%06d.tar', got {out_pattern!r}")
    names = [c.name for c in manifest.columns]
    exts = [c for c in manifest.columns if c.name not in (KEY, SHARD, PRESENT, LABEL)]
    shard_count = len(manifest.extra.get("shards") or [])
    try:
        targets = [out_pattern % i for i in range(shard_count)]
    except (TypeError, ValueError) as e:
        raise LoaderxValueError(f"out_pattern {out_pattern!r} does not format a shard index "
                                f"({e}); write one %d, e.g. 'shard-%06d.tar'") from None
    if len(set(targets)) != len(targets):
        raise LoaderxValueError(f"out_pattern {out_pattern!r} gives several shards one name; "
                                "write one %d, e.g. 'shard-%06d.tar'")
    cols = open_dataset(src)
    written: list[str] = []
    try:
        n = len(cols[KEY])
        shard_of = np.asarray(cols[SHARD][np.arange(n)]) if n else np.empty(0, np.int64)
        has_present = PRESENT in names
        for shard in np.unique(shard_of):
            if not 0 <= shard < shard_count:
                raise CorruptStoreError(f"{src}: a sample of shard {int(shard)}, but the "
                                        f"manifest names {shard_count} shards")
            target = targets[int(shard)]
            if os.path.lexists(target):
                raise DatasetError(f"{target} exists; export_webdataset writes new shards")
            rows = np.flatnonzero(shard_of == shard)
            staging.remove_stale(target)
            with staging.private_file(target, "exporting") as (tmp, fd):
                with os.fdopen(os.dup(fd), "wb") as out:
                    with tarfile.open(fileobj=out, mode=_tar_mode(target),
                                      format=tarfile.PAX_FORMAT) as tar:
                        for start in range(0, len(rows), 1024):
                            idx = rows[start:start + 1024]
                            keys = cols[KEY][idx]
                            present = np.asarray(cols[PRESENT][idx]) if has_present else None
                            values = {c.name: cols[c.name][idx] for c in exts}
                            for r, key in enumerate(keys):
                                k = bytes(key).decode("utf-8")
                                for j, c in enumerate(exts):
                                    if present is not None and not present[r, j]:
                                        continue
                                    _add_member(tar, f"{k}.{c.extra.get('extension', c.name)}",
                                                values[c.name][r])
                    out.flush()
                    os.fsync(out.fileno())
                staging.publish(tmp, target)
            written.append(target)
    finally:
        for ds in cols.values():
            ds.close()
    return written


def _tar_mode(path: str) -> Literal["w", "w:gz", "w:xz", "w:bz2"]:
    if path.endswith((".tar.gz", ".tgz")):
        return "w:gz"
    if path.endswith((".tar.xz", ".txz")):
        return "w:xz"
    if path.endswith((".tar.bz2", ".tbz2")):
        return "w:bz2"
    return "w"


def _add_member(tar: tarfile.TarFile, name: str, data: Any) -> None:
    raw = np.ascontiguousarray(data).tobytes()
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(raw), 0o644, 0
    tar.addfile(info, _Bytes(raw))


class _Bytes:
    """A file object over ``bytes`` for tarfile.addfile (which only reads)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.at + n
        out = self.data[self.at:end]
        self.at += len(out)
        return out
