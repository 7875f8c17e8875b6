"""``schema.msgpack``: the one piece of loaderx metadata beside a Zrecord store.

It is a msgpack map with the keys the reference 0.9.11 writes -- ``kind`` ("dense" or "ragged"),
``dtype`` (NumPy ``dtype.str``), ``item_shape`` (list of ints: a dense record's shape, or a
ragged record's trailing dimensions), ``format`` ("loaderx-zrecord"), ``version`` (1) and
``codec`` (the codec of the last conversion) -- plus any extra keys the user asked to keep.
Records themselves are plain Zrecord byte records; see docs/FORMAT.md.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import stat
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from loaderx import _native
from loaderx._store import staging
from loaderx.errors import CorruptStoreError, DatasetError

SCHEMA_FILE = "schema.msgpack"
META_FILE = "meta.zr"
FORMAT = "loaderx-zrecord"
VERSION = 1
KINDS = ("dense", "ragged")
RESERVED = ("kind", "dtype", "item_shape", "format", "version", "codec")
#: Largest ``schema.msgpack`` read or written: the file is metadata, so anything bigger is
#: refused (on reading as a corrupt store, on writing before the store is touched).
MAX_SCHEMA_BYTES = 1 << 20
#: Most dimensions of one item (NumPy allows 64 in all, one of them the record axis).
MAX_ITEM_DIMS = 32


def check_dtype(dtype: Any, where: str) -> np.dtype:
    """``dtype`` as a NumPy dtype a record can hold as plain bytes, or a DatasetError.

    Object dtypes hold pointers and structured or sub-array dtypes do not round-trip through
    ``dtype.str``, so all three are refused.
    """
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError) as e:  # NumPy's parser raises all three
        raise DatasetError(f"{where}: {dtype!r} is not a NumPy dtype ({e})") from None
    if dt.hasobject:
        raise DatasetError(f"{where}: object dtype {dt} cannot be stored (records are raw bytes)")
    if dt.names is not None or dt.subdtype is not None:
        raise DatasetError(f"{where}: structured dtype {dt} is not supported; store each field "
                           "as its own dataset")
    if dt.itemsize == 0:
        raise DatasetError(f"{where}: dtype {dt} has no size")
    return dt


@dataclass(frozen=True)
class Schema:
    """What ``schema.msgpack`` says about a store."""

    kind: str
    dtype: np.dtype
    item_shape: tuple[int, ...]
    codec: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def item_bytes(self) -> int:
        """Bytes of one dense record, or of one row of a ragged record."""
        return math.prod(self.item_shape) * self.dtype.itemsize  # exact: Python ints

    def describe(self) -> str:
        return f"{self.kind} {self.dtype.str}{tuple(self.item_shape)}"

    def to_dict(self) -> dict[str, Any]:
        """The map ``schema.msgpack`` holds: the reserved keys, then the extra ones."""
        body = {
            "kind": self.kind,
            "dtype": self.dtype.str,
            "item_shape": list(self.item_shape),
            "format": FORMAT,
            "version": VERSION,
            "codec": self.codec,
        }
        body.update({k: v for k, v in self.extra.items() if k not in RESERVED})
        return body

    def to_bytes(self) -> bytes:
        """The encoded map; DatasetError when an extra value cannot be msgpack-encoded or the
        whole is over :data:`MAX_SCHEMA_BYTES`."""
        try:
            raw = msgpack.packb(self.to_dict())
        except (TypeError, ValueError, OverflowError) as e:
            raise DatasetError(f"the schema cannot be written as msgpack ({e}); extra schema "
                               "values must be None, bools, numbers, strings, bytes, lists or "
                               "dicts") from None
        if len(raw) > MAX_SCHEMA_BYTES:
            raise DatasetError(f"the schema encodes to {len(raw)} bytes of msgpack, over the "
                               f"{MAX_SCHEMA_BYTES}-byte limit of {SCHEMA_FILE}; keep large "
                               "metadata in a file of its own")
        return raw


def is_store(path: str) -> bool:
    """Whether ``path`` has a ``meta.zr`` (whatever it is: the engine refuses one that is not
    a regular file, naming it, which beats calling the directory "not a store")."""
    return os.path.lexists(os.path.join(path, META_FILE))


def read(path: str) -> Schema:
    """The schema of the dataset at ``path``; FileNotFoundError when there is no directory,
    DatasetError when it is not a loaderx dataset, CorruptStoreError when the file is garbage,
    over :data:`MAX_SCHEMA_BYTES` or not a regular file (a symbolic link, a FIFO, a device, a
    directory)."""
    if os.path.isfile(path):
        hint = (" (a .npy array: convert it with loaderx.converter.from_numpy or `loaderx "
                "convert`)" if path.endswith(".npy") else "")
        raise DatasetError(f"{path} is a file; a dataset is a directory{hint}")
    if not os.path.isdir(path):
        # A replacement killed between the two renames of the fallback for file systems without
        # an atomic exchange leaves the path missing and the complete new dataset beside it.
        with contextlib.suppress(OSError):
            staging.remove_stale(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(2, "no dataset at this path", path)
    file = os.path.join(path, SCHEMA_FILE)
    if not os.path.lexists(file):
        what = "a raw Zrecord store (open it with loaderx.zrecord.Zrecord)" if is_store(path) \
            else "not a loaderx dataset"
        raise DatasetError(f"{path} has no {SCHEMA_FILE}: {what}")
    if not is_store(path):
        raise CorruptStoreError(f"{path} has a {SCHEMA_FILE} but no {META_FILE}")
    raw = read_regular(file)
    try:
        body = msgpack.unpackb(raw, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise CorruptStoreError(f"{file} is not valid msgpack ({e})") from None
    return parse(body, file)


def read_regular(file: str, limit: int = MAX_SCHEMA_BYTES,
                 what: str = f"a store's {SCHEMA_FILE}") -> bytes:
    """The bytes of ``file``, which must be a regular file of at most ``limit`` bytes (``what``
    names it in the errors: a store's schema, a dataset directory's manifest).

    Anything else is refused as a corrupt store, never followed or waited on: a symbolic link
    could make the store read (and a later conversion report) a file outside it, a FIFO would
    block the open or the read forever, a device could be endless.
    """
    def not_regular(kind: str) -> CorruptStoreError:
        return CorruptStoreError(f"{file} is {kind}, not a regular file; {what} must be a "
                                 "regular file inside it")

    # Checked before opening too, so that a device node is never opened (opening some has
    # effects); the fstat below catches a file swapped in between.
    mode = os.lstat(file).st_mode
    if not stat.S_ISREG(mode):
        raise not_regular(_kind_of(mode))
    try:
        # O_NONBLOCK: opening a FIFO would otherwise wait for a writer; no effect on files.
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise not_regular("a symbolic link") from None
        if e.errno in (errno.ENXIO, errno.EISDIR):  # a socket, a device without a driver
            raise not_regular(_kind_of(os.lstat(file).st_mode)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(_kind_of(st.st_mode))
        if st.st_size > limit:
            raise CorruptStoreError(f"{file} is {st.st_size} bytes, over the {limit}-byte "
                                    f"limit of {what}")
        parts = []
        left = limit + 1  # one more, to notice a file that grew since fstat
        while left > 0:
            part = os.read(fd, left)
            if not part:
                break
            parts.append(part)
            left -= len(part)
    finally:
        os.close(fd)
    raw = b"".join(parts)
    if len(raw) > limit:
        raise CorruptStoreError(f"{file} is over the {limit}-byte limit of {what}")
    return raw


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "an unknown kind of file"


def parse(body: Any, file: str) -> Schema:
    """Validates a decoded schema map."""
    if not isinstance(body, dict):
        raise CorruptStoreError(f"{file} does not hold a map")
    if body.get("format", FORMAT) != FORMAT:
        raise DatasetError(f"{file}: format {body.get('format')!r} is not {FORMAT!r}")
    if body.get("version", VERSION) != VERSION:
        raise DatasetError(f"{file}: schema version {body.get('version')!r} is not supported "
                           f"(this loaderx reads version {VERSION})")
    kind = body.get("kind")
    if kind not in KINDS:
        raise DatasetError(f"{file}: kind {kind!r} is not one of {', '.join(KINDS)}")
    if not isinstance(body.get("dtype"), str):
        raise DatasetError(f"{file}: dtype {body.get('dtype')!r} is not a dtype string")
    dtype = check_dtype(body["dtype"], file)
    shape = body.get("item_shape")
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_ITEM_DIMS or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in shape
    ):
        raise DatasetError(f"{file}: item_shape {shape!r} is not a list of at most "
                           f"{MAX_ITEM_DIMS} non-negative ints")
    codec = body.get("codec", "zstd")
    extra = {k: v for k, v in body.items() if k not in RESERVED}
    schema = Schema(kind, dtype, tuple(shape), str(codec), extra)
    if schema.item_bytes > _native.MAX_RECORD_BYTES:
        # A dense record, or one row of a ragged record, must fit in one record (the product is
        # exact, so a shape whose product overflows 64 bits is caught here too).
        what = "record" if kind == "dense" else "row of a record"
        raise DatasetError(f"{file}: one {what} of {schema.describe()} is {schema.item_bytes} "
                           f"bytes, over the {_native.MAX_RECORD_BYTES}-byte record limit")
    return schema


def tmp_name(path: str) -> str:
    """The temporary file :func:`write` uses in ``path`` (the engine's durable write names it
    after the file and the process, so two processes never write into one file)."""
    return os.path.join(path, f"schema.tmp.{os.getpid()}")


def write(path: str, schema: Schema) -> None:
    """Writes ``schema.msgpack`` durably and atomically, through the engine's one durable-write
    routine (a new temporary file, fsync, rename, fsync of the directory).

    DatasetError, before anything is written, when the schema cannot be encoded or is over
    :data:`MAX_SCHEMA_BYTES`. The temporary file is always a new one: whatever has its name
    (a leftover, or a symbolic link planted to redirect the write) is removed, not written
    through.
    """
    _native.replace_file(path, SCHEMA_FILE, schema.to_bytes())
