"""Walking an image folder (``root/<class>/<name>.jpg``) without ever leaving it.

The folder is data from elsewhere, so it is walked through directory file descriptors: every
directory below ``root`` and every file is opened relative to its parent with ``O_NOFOLLOW``,
so neither a symbolic link nor one swapped in while the conversion runs can lead outside
``root``. What is taken and what is not:

* the *classes* are the sub-directories of ``root`` (not links to directories), in sorted
  order of their names' bytes; a class's label is its position in that order, counting
  classes without images too (torchvision's ``ImageFolder`` numbers classes the same way).
  A class name must be UTF-8 (it goes into the manifest);
* a class's images are the regular files anywhere below its folder, depth first: a folder's
  files in sorted order of their names' bytes, then each sub-folder in the same order;
* a file is an image when its first bytes are those of an image format
  (:func:`image_format`: JPEG, PNG, GIF, BMP, WebP, TIFF, PNM, JPEG 2000, AVIF/HEIF) -- its
  name's extension is not trusted either way;
* skipped, each counted with the first few names (:class:`FolderReport`): symbolic links,
  entries whose names start with a dot (``.DS_Store``, ``.ipynb_checkpoints``), files that
  are not images, anything that is not a regular file or a directory (FIFOs, sockets,
  devices), files directly in ``root`` (outside every class);
* refused: a file over the 1 MiB record limit (:class:`~loaderx.errors.LimitExceededError`
  naming it), a file that cannot be read (the ``OSError``, naming it), a class name that is
  not UTF-8, nesting deeper than :data:`MAX_DEPTH`, a root without class folders
  (:class:`~loaderx.errors.DatasetError`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

from loaderx.errors import DatasetError, LimitExceededError
from loaderx.zrecord import MAX_RECORD_BYTES

__all__ = ["MAX_DEPTH", "FolderReport", "Folder", "ImageDir", "image_format", "read_image"]

#: Most folder levels below a class folder.
MAX_DEPTH = 64
#: Names of the skipped files kept for the report, per reason.
_EXAMPLES = 5

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_HEIF_BRANDS = {b"avif", b"avis", b"heic", b"heix", b"heim", b"heis", b"mif1", b"msf1"}


def image_format(head: bytes) -> str | None:
    """The image format the first bytes of a file announce (at least 12 are looked at), or
    None."""
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:2] == b"BM" and len(head) >= 14:
        return "bmp"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if head[:1] == b"P" and head[1:2] in b"1234567" and head[2:3] in (b" ", b"\t", b"\n",
                                                                        b"\r"):
        return "pnm"
    if head[:12] == b"\x00\x00\x00\x0cjP  \r\n\x87\n" or head[:4] == b"\xffO\xffQ":
        return "jpeg2000"
    if head[4:8] == b"ftyp" and head[8:12] in _HEIF_BRANDS:
        return "heif"
    return None


_WORDS = {"symlink": "a symbolic link (not followed)",
          "hidden": "a hidden entry (its name starts with a dot)",
          "not_image": "a file that is not an image (by its first bytes)",
          "special": "an entry that is not a regular file or a folder",
          "outside_class": "a file directly in the root, outside every class folder"}


@dataclass
class FolderReport:
    """What the walk skipped, by reason: a count and the first few relative paths."""

    root: str
    strict: bool = False  # refuse the first entry to skip instead (DatasetError naming it)
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def skip(self, reason: str, rel: bytes) -> None:
        if self.strict:
            path = os.path.join(self.root, os.fsdecode(rel))
            raise DatasetError(f"{path}: {_WORDS.get(reason, reason)} cannot be converted "
                               "and strict=True; remove or fix it, or convert without "
                               "strict=True (such entries are then skipped and reported)")
        self.counts[reason] = self.counts.get(reason, 0) + 1
        names = self.examples.setdefault(reason, [])
        if len(names) < _EXAMPLES:
            names.append(os.fsdecode(rel))

    @property
    def skipped(self) -> int:
        return sum(self.counts.values())

    def describe(self) -> str:
        """One line: what was skipped and why, with examples."""
        parts = [f"{n} x {_WORDS.get(r, r)}, e.g. {', '.join(map(repr, self.examples[r]))}"
                 for r, n in sorted(self.counts.items())]
        return "; ".join(parts)


@dataclass
class ImageDir:
    """A folder of one class whose files are to be read: its descriptor (owned: close it),
    its path relative to the root (bytes, ``/``-separated, with a trailing slash) and the
    names of its regular files in order."""

    fd: int
    rel: bytes
    label: int
    names: list[str]

    def close(self) -> None:
        os.close(self.fd)


def _sorted_entries(fd: int) -> list[os.DirEntry[str]]:
    with os.scandir(fd) as it:  # scandir duplicates the descriptor it is given
        return sorted(it, key=lambda e: os.fsencode(e.name))


class Folder:
    """An image folder opened for walking; a context manager (closes the root)."""

    def __init__(self, root: str, strict: bool = False) -> None:
        self.root = root
        self.report = FolderReport(root, strict)
        try:
            self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except NotADirectoryError:
            raise DatasetError(f"{root} is not a folder; an image folder holds one folder per "
                               "class (root/<class>/<image>)") from None
        try:
            self.classes = self._classes()
        except BaseException:
            os.close(self.fd)
            raise

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def _classes(self) -> list[str]:
        classes: list[str] = []
        for entry in _sorted_entries(self.fd):
            rel = os.fsencode(entry.name)
            if entry.name.startswith("."):
                self.report.skip("hidden", rel)
            elif entry.is_symlink():
                self.report.skip("symlink", rel)
            elif entry.is_dir(follow_symlinks=False):
                try:
                    entry.name.encode("utf-8")
                except UnicodeEncodeError:
                    raise DatasetError(f"{self.root}: the class folder {entry.name!r} has a name "
                                       "that is not UTF-8; rename it (class names go into the "
                                       "manifest)") from None
                classes.append(entry.name)
            elif entry.is_file(follow_symlinks=False):
                self.report.skip("outside_class", rel)
            else:
                self.report.skip("special", rel)
        if not classes:
            raise DatasetError(f"{self.root} holds no class folders; an image folder holds one "
                               "folder per class (root/<class>/<image>)")
        return classes

    def dirs(self) -> Generator[ImageDir, None, None]:
        """Every folder of every class, in order, each with its files (close each)."""
        for label, name in enumerate(self.classes):
            fd = self._open_dir(self.fd, name, os.fsencode(name))
            if fd is None:
                continue
            yield from self._walk(fd, os.fsencode(name) + b"/", label, 0)

    def _open_dir(self, parent: int, name: str, rel: bytes) -> int | None:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):  # replaced by a link or a file
                try:
                    link = stat.S_ISLNK(os.stat(name, dir_fd=parent,
                                                follow_symlinks=False).st_mode)
                except OSError:
                    link = False
                self.report.skip("symlink" if link else "special", rel)
                return None
            raise _named(e, self.root, rel) from None

    def _walk(self, fd: int, rel: bytes, label: int, depth: int) -> Iterator[ImageDir]:
        """The folder ``fd`` (owned) at ``rel``, then its sub-folders."""
        try:
            if depth > MAX_DEPTH:
                raise DatasetError(f"{self.root}: {os.fsdecode(rel)} is over {MAX_DEPTH} folders "
                                   "deep inside its class folder")
            files: list[str] = []
            subdirs: list[str] = []
            for entry in _sorted_entries(fd):
                path = rel + os.fsencode(entry.name)
                if entry.name.startswith("."):
                    self.report.skip("hidden", path)
                elif entry.is_symlink():
                    self.report.skip("symlink", path)
                elif entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.name)
                elif entry.is_file(follow_symlinks=False):
                    files.append(entry.name)
                else:
                    self.report.skip("special", path)
            if files:
                yield ImageDir(os.dup(fd), rel, label, files)
            for name in subdirs:
                sub = self._open_dir(fd, name, rel + os.fsencode(name))
                if sub is not None:
                    yield from self._walk(sub, rel + os.fsencode(name) + b"/", label, depth + 1)
        finally:
            os.close(fd)


def _named(e: OSError, root: str, rel: bytes) -> OSError:
    """``e`` with the full path of the entry and what to do about it."""
    path = os.path.join(root, os.fsdecode(rel))
    return type(e)(e.errno, f"{e.strerror} (reading the image folder; make {path} readable "
                   "or move it out of the folder)", path)


def read_image(folder: Folder, d: ImageDir, name: str) -> bytes | str:
    """The bytes of the file ``name`` in ``d``, or the reason it is skipped (``"symlink"``,
    ``"special"``, ``"not_image"``). Refuses a file over the record limit or unreadable."""
    rel = d.rel + os.fsencode(name)
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=d.fd)
    except OSError as e:
        if e.errno == errno.ELOOP:  # a link put in its place since the folder was listed
            return "symlink"
        raise _named(e, folder.root, rel) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "special"
        if st.st_size > MAX_RECORD_BYTES:
            raise _too_big(folder.root, rel, st.st_size)
        parts: list[bytes] = []
        got = 0
        # Asking for one byte past the size sees a file that grew; the limit bounds the rest.
        want = st.st_size + 1
        while got <= MAX_RECORD_BYTES:
            piece = os.read(fd, min(want, MAX_RECORD_BYTES + 1 - got))
            want = 64 << 10
            if not piece:
                break
            parts.append(piece)
            got += len(piece)
        if got > MAX_RECORD_BYTES:
            raise _too_big(folder.root, rel, got)
    except OSError as e:
        raise _named(e, folder.root, rel) from None
    finally:
        os.close(fd)
    data = b"".join(parts)
    if image_format(data[:16]) is None:
        return "not_image"
    return data


def _too_big(root: str, rel: bytes, size: int) -> LimitExceededError:
    path = os.path.join(root, os.fsdecode(rel))
    return LimitExceededError(
        f"{path} is {size} bytes, over the {MAX_RECORD_BYTES}-byte record limit of one image; "
        "shrink it (re-encode or resize it, e.g. with Pillow), or move it out of the folder")
